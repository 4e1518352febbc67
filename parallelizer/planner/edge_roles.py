"""What an edge of the strategy graph may not do, read off the traced graph and the axis roles: `EdgeRoles` (the
layout changes `PlanConfig.axis_roles` forbid on one edge, priced inf by `problem.build_problem`), the views and
derived values of parameters (`parameter_views`: dims that slice a parameter's elements, kept whole over data
axes), and the values forward writes in place (`written_inputs`, `written_placeholders`, `mutation_edges`: no
redistribution on the way to an in-place op). Split out of `strategies.py` in round 25 (past 600 lines);
`strategies` builds the spaces these constraints narrow and re-exports the names it uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from ..config import PlanConfig
from ..core.layout import Layout, Replicate, Shard
from ..core.mesh import MeshSpec
from ..core.redistribute import ImpossibleRedistributionError, redistribute_steps
from ..tracer import Role, TracedGraph
from ..tracer.graph import alias_source, mutated_args, returns_written

__all__ = ["EdgeRoles", "parameter_views", "role_axes", "written_inputs", "written_placeholders", "mutation_edges"]


@dataclass(frozen=True, slots=True)
class EdgeRoles:
    """What `PlanConfig.axis_roles` forbid on one edge (mesh axis indices); a pair breaking it costs inf.

    used_replicated: the consumer must take the value Replicate there (parameters over "ddp"/"fsdp" axes);
    keep_shard: no all-gather or all-to-all over these axes (parameters over "tp" axes are used as stored,
        also when a dim is sharded over several axes and using it would gather over a tp axis first);
    no_gather: a Shard placement must not become Replicate there (activations over "ddp"/"fsdp" axes, so
        the compute stays data parallel; not into the graph output or an op without a sharding rule);
    identity: no layout change at all (the value is mutated in place there: `mutation_edges`);
    whole_on, whole_dims: over the mesh axes `whole_on` (the data axes) the consumer must not take the value sharded
        along a tensor dim of `whole_dims`: the dims of a view of a parameter (`parameter_views`) that slice the
        parameter's own elements, so a "ddp" / "fsdp" weight used through `w.t()`, a permute or an expand stays
        whole where it is used (a Shard along a broadcast dim of an expand, stride 0, slices no weight: allowed)."""

    used_replicated: tuple[int, ...] = ()
    keep_shard: tuple[int, ...] = ()
    no_gather: tuple[int, ...] = ()
    identity: bool = False
    whole_on: tuple[int, ...] = ()
    whole_dims: tuple[int, ...] = ()

    def forbids(self, src: Layout, dst: Layout, shape: tuple[int, ...], mesh: MeshSpec) -> bool:
        if self.identity and src.normalized(len(shape)) != dst.normalized(len(shape)):
            return True
        s, d = src.placements, dst.placements
        if any(d[i] != Replicate() for i in self.used_replicated):
            return True
        if any(isinstance(d[i], Shard) and d[i].dim % max(len(shape), 1) in self.whole_dims for i in self.whole_on):
            return True
        if any(isinstance(s[i], Shard) and d[i] == Replicate() for i in self.no_gather):
            return True
        if not self.keep_shard or src == dst:
            return False
        axes = {mesh.axis_names[i] for i in self.keep_shard}
        try:
            steps = redistribute_steps(src, dst, shape, mesh)
        except ImpossibleRedistributionError:
            return True  # no steps at all (e.g. to Partial): never usable
        return any(st.mesh_axis in axes and st.kind in ("all_gather", "all_to_all") for st in steps)


# Ops that copy their input element for element (same shape): a copy of a parameter holds its elements as a view
# does (the tracer writes `w.as_strided(...)` as clone + as_strided, `tracer.normalize`; `w.to(dtype)` under
# decompositions is _to_copy). `w.repeat(...)` copies whole weights along its repeated dims.
_PARAMETER_COPIES = frozenset({torch.ops.aten.clone, torch.ops.aten._to_copy})
_REPEATS = frozenset({torch.ops.aten.repeat})


def _embedding_dims(node: torch.fx.Node, out_nd: int) -> list[tuple[torch.fx.Node, dict[int, int | None]]]:
    """embedding(weight (V, D), index (*I)) -> (*I, D): the weight's dim 1 is the output's last, its dim 0 (the
    rows) is selected, not kept; the index's dims are the output's leading ones."""
    weight, index = node.args[0], node.args[1]
    return [(weight, {0: None, 1: out_nd - 1}), (index, {d: d for d in range(out_nd - 1)})]


def _index_select_dims(node: torch.fx.Node, out_nd: int) -> list[tuple[torch.fx.Node, dict[int, int | None]]]:
    """index_select(x, dim, index (K,)): every dim of x but `dim` keeps its place; `dim` is selected, the index's
    dim 0 takes it."""
    x, dim, index = node.args[0], node.args[1] % max(out_nd, 1), node.args[2]
    return [(x, {d: (None if d == dim else d) for d in range(out_nd)}), (index, {0: dim})]


def _index_dims(node: torch.fx.Node, out_nd: int) -> list[tuple[torch.fx.Node, dict[int, int | None]]]:
    """x[index] (aten.index.Tensor with one index tensor, on dim 0): (*I, x's dims 1..) -> the index's dims lead, x's
    dim 0 is selected, its others follow. Other index patterns: [] (every dim counts, `_derived_dims`)."""
    x, indices = node.args[0], node.args[1]
    if len(indices) != 1 or not isinstance(indices[0], torch.fx.Node) or indices[0].meta["val"].dtype == torch.bool:
        return []
    lead = indices[0].meta["val"].dim()
    return [(x, {0: None, **{d: lead - 1 + d for d in range(1, out_nd - lead + 1)}}),
            (indices[0], {d: d for d in range(lead)})]


def _matmul_dims(node: torch.fx.Node, out_nd: int) -> list[tuple[torch.fx.Node, dict[int, int | None]]]:
    """linear(x, w) -> (*x[:-1], w[0]); mm / bmm / matmul(a, b) (both >= 2-D) -> (*batch, a[-2], b[-1]), batch dims
    right-aligned as torch broadcasts; the contracted dims reach no output dim. Other ranks: []."""
    a, b = node.args[0], node.args[1]
    if getattr(node.target, "overloadpacket", None) is torch.ops.aten.linear:
        return [(a, {d: (d if d < out_nd - 1 else None) for d in range(out_nd)}), (b, {0: out_nd - 1, 1: None})]
    na, nb = a.meta["val"].dim(), b.meta["val"].dim()
    if na < 2 or nb < 2:
        return []
    return [(a, {**{d: d + out_nd - na for d in range(na - 2)}, na - 2: out_nd - 2, na - 1: None}),
            (b, {**{d: d + out_nd - nb for d in range(nb - 2)}, nb - 2: None, nb - 1: out_nd - 1})]


# Ops each of whose output dims comes from one operand's dim: rows of a table chosen by an index, a product's rows
# and columns. A dim a non-parameter operand brings (BERT's token types, looked up by a buffer expanded to the batch:
# `embedding(w, token_type_ids.expand(B, S))`; `proj(pe.expand(B, S, K))`) slices that operand, not the weight, so it
# may be sharded over a data axis (a ddp / fsdp plan of BERT and ViLT called without token_type_ids was infeasible
# before round 26: every dim of the result counted as a dim of the weight).
_LOOKUPS = {torch.ops.aten.embedding: _embedding_dims, torch.ops.aten.index_select: _index_select_dims,
            torch.ops.aten.index: _index_dims, torch.ops.aten.linear: _matmul_dims, torch.ops.aten.mm: _matmul_dims,
            torch.ops.aten.bmm: _matmul_dims, torch.ops.aten.matmul: _matmul_dims}


def _sliced_dims(val: torch.Tensor) -> tuple[int, ...]:
    """Every dim of size > 1 and stride != 0 (a stride-0 dim repeats the whole value along it)."""
    return tuple(d for d in range(val.dim()) if val.shape[d] != 1 and val.stride(d) != 0)


def _free_by_rule(space, inputs: dict[torch.fx.Node, tuple[int, ...]], out_ndim: int) -> set[int]:
    """Output dims e of a node that its own strategies (`space`: its `strategies.NodeSpace`) can shard on some
    mesh axis while each parameter-derived operand (`inputs`: node -> its sliced dims) is whole (Replicate) or
    sharded along a dim that slices no parameter element on that axis: a copy dim of the operand stays one through
    the op (the batch dim of `queries.repeat(B, 1, 1)` through a Linear, a LayerNorm or attention), a dim that needs
    a weight sliced does not."""
    if space is None:
        return set()
    sliced = {a.name: dims for a, dims in inputs.items()}
    free = set()
    for strategy in space.strategies:
        if strategy.output is None:
            continue
        for axis, out in enumerate(strategy.output.placements):
            if not isinstance(out, Shard) or out.dim % max(out_ndim, 1) in free:
                continue
            ok = True
            for inp, layout in zip(space.inputs, strategy.inputs):
                p = layout.placements[axis]
                if inp.producer in sliced and not (p == Replicate() or (
                        isinstance(p, Shard) and p.dim % max(len(inp.shape), 1) not in sliced[inp.producer])):
                    ok = False
                    break
            if ok:
                free.add(out.dim % max(out_ndim, 1))
    return free


def _derived_dims(node: torch.fx.Node, val: torch.Tensor, inputs: dict[torch.fx.Node, tuple[int, ...]],
                  space=None) -> tuple[int, ...]:
    """The dims of `node`'s output (`val`) that slice parameter elements, for an op computed from parameter-derived
    values `inputs` (node -> their sliced dims). An elementwise op over broadcast operands (output shape = the
    broadcast of the tensor operands' shapes, right-aligned as torch broadcasts) and `repeat` keep the sliced dims
    of their operands, so `cls.expand(B, -1, -1).contiguous()`, `cls.repeat(B, 1, 1)` and `w * torch.ones(B, 1, 1)`
    leave the batch dim free; lookups and products (`_LOOKUPS`) keep the dims their derived operands bring; any
    other op (reductions, norms, attention, ...) mixes elements: every dim counts, but those its own rule shards
    with the derived operands whole or sharded along a copy dim (`_free_by_rule`, given the node's `space`), and
    so do views of computed values: DETR's `query_pos.repeat(B, 1, 1)` through the decoder's first LayerNorm and
    self-attention (parameters only, before the queries meet the image) keeps its batch dim free (round 26: a
    forced "ddp" plan of HF DETR was infeasible)."""
    out = tuple(val.shape)
    lookup = _LOOKUPS.get(getattr(node.target, "overloadpacket", None))
    operands = lookup(node, len(out)) if lookup is not None else []
    if operands:  # each output dim from one operand's dim: only the dims the parameter-derived operands bring
        kept = set()
        for operand, to_out in operands:
            kept.update(to_out[d] for d in inputs.get(operand, ()) if to_out.get(d) is not None)
        return tuple(d for d in _sliced_dims(val) if d in kept)
    shapes = [tuple(a.meta["val"].shape) for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    try:
        elementwise = bool(shapes) and tuple(torch.broadcast_shapes(*shapes)) == out
    except RuntimeError:
        elementwise = False
    repeat = getattr(node.target, "overloadpacket", None) in _REPEATS
    if not (elementwise or repeat):
        free = _free_by_rule(space, inputs, val.dim())
        return tuple(d for d in _sliced_dims(val) if d not in free)
    kept = set()
    for a, dims in inputs.items():
        lead = len(out) - a.meta["val"].dim()
        kept.update(d + lead for d in dims)
    return tuple(d for d in _sliced_dims(val) if d in kept)


def parameter_views(tg: TracedGraph, spaces: dict | None = None) -> dict[str, tuple[int, ...]]:
    """Node name -> the dims of its output that slice a parameter's elements, for every value derived from a
    parameter without an activation: views and undeclared aliases (`tracer.graph.alias_source`: transpose, permute,
    view / reshape, expand, as_strided, unsafe_split's getitems, type_as, einsum('ij->ji'), ...) and copies
    (`_PARAMETER_COPIES`) of such a value, and every op whose tensor operands are all parameters, buffers,
    constants or values computed from them alone (a merged LoRA weight `w + b @ a`, a factorised `b @ a`, weight
    standardization, `w * mask`, `w.clamp(...)`, casts, weight_norm / spectral_norm / orthogonal
    parametrizations), transitively. Of a view a dim slices the parameter when its size is > 1 and its stride is
    not 0 (an expand's broadcast dims repeat the whole weight along them: the batch of `cls.expand(B, -1, -1)` may be
    sharded over a data axis); of a computed value see `_derived_dims` (`spaces`: the nodes' `strategies.NodeSpace`s,
    whose strategies tell which dims a computed value keeps free). Round 18 (r18b): Mixtral's
    `experts.gate_up_proj` reached grouped_mm through a transpose and was used sharded over a "ddp" axis, since the
    role's `used_replicated` held only on the edge out of the parameter itself; round 20 (r20f): the same through a
    merged / standardised / parametrized weight (numbers right, activations all_to_all'd over the data axis)."""
    derived: dict[torch.fx.Node, tuple[int, ...]] = {}  # parameter-derived values (parameters included) -> dims
    static: set[torch.fx.Node] = set()  # values that read no user input: parameters, buffers, constants, and ops on them
    # (not tensor factories: a value made per sample by `zeros(x.shape[0], d)`, whose traced shape is the batch's,
    # fed to a Linear (DAB-DETR's queries) is batch-shardable; holding it whole made that ddp plan infeasible)
    found: dict[str, tuple[int, ...]] = {}
    for node in tg.graph_module.graph.nodes:
        info = tg.nodes.get(node.name)
        val = node.meta.get("val")
        if node.op == "placeholder":
            if info is not None and info.role in (Role.PARAMETER, Role.BUFFER):
                static.add(node)
                if info.role == Role.PARAMETER and isinstance(val, torch.Tensor):
                    derived[node] = _sliced_dims(val)
            continue
        if node.op == "get_attr":
            static.add(node)
            continue
        if node.op != "call_function" or info is None:
            continue
        ins = node.all_input_nodes
        source = alias_source(node)
        copies = getattr(node.target, "overloadpacket", None) in _PARAMETER_COPIES and node.args and node.args[0] in derived
        if ins and all(a in static for a in ins):  # a factory (zeros(B, d), ones, arange) is not: its shape
            static.add(node)                       # may be the batch's, as `anchor(torch.zeros(x.shape[0], d))`
        from_params = {a: derived[a] for a in ins if a in derived}
        if source in derived or copies:  # a view or copy (a tuple: its getitems carry the tensors, whose source's
            # dims say nothing: the getitem's own count), free along the dims its rule maps from a copy dim
            whole = isinstance(val, torch.Tensor) and all(isinstance(a.meta.get("val"), torch.Tensor) for a in from_params)
            free = _free_by_rule((spaces or {}).get(node.name), from_params, val.dim()) if whole else ()
            dims = tuple(d for d in _sliced_dims(val) if d not in free) if isinstance(val, torch.Tensor) else ()
        elif from_params and node in static:
            dims = (_derived_dims(node, val, from_params, (spaces or {}).get(node.name))
                    if isinstance(val, torch.Tensor) else ())
        else:
            continue
        derived[node] = found[node.name] = dims
    return found


def role_axes(mesh: MeshSpec, config: PlanConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Indices of the mesh axes with a data role ("ddp", "fsdp") and of those with the role "tp"."""
    roles = config.roles_on(mesh.axis_names)
    return (tuple(i for i, r in enumerate(roles) if r in ("ddp", "fsdp")),
            tuple(i for i, r in enumerate(roles) if r == "tp"))


def written_inputs(tg: TracedGraph) -> frozenset[str]:
    """Names of the user-input placeholders that forward writes in place (`x.mul_(2)`, `x[:, 0] = 0`; also
    through views and chained in-place ops). Such an input is the caller's tensor, which eager mutates
    whole: it stays Replicate (every rank passes and writes its whole tensor), since a batch shard would be
    a view of the caller's tensor and only this rank's rows would be written (the caller's tensor would
    then differ between ranks and from one device)."""
    return frozenset(n for n, _ in written_placeholders(tg, Role.INPUT))


def written_placeholders(tg: TracedGraph, role: Role) -> frozenset[tuple[str, str]]:
    """(placeholder, writing op) of every placeholder of `role` that forward writes in place, through views
    and chained in-place ops too: user inputs (`written_inputs`) and parameters (an EMA key encoder updated
    in forward under no_grad: MoCo's `p_k.mul_(m).add_(p_q * (1 - m))`, SwAV's prototypes re-normalised)."""
    out = set()
    for node in tg.graph_module.graph.nodes:
        for i in mutated_args(node):
            arg = node.args[i] if i < len(node.args) else None
            while isinstance(arg, torch.fx.Node) and (alias_source(arg) is not None or returns_written(arg)):
                arg = alias_source(arg) or arg.args[0]  # undeclared aliases too: atleast_1d(p).mul_ (r18h)
            info = tg.nodes.get(arg.name) if isinstance(arg, torch.fx.Node) else None
            if info is not None and info.op == "placeholder" and info.role is role:
                out.add((arg.name, tg.nodes[node.name].op_name if node.name in tg.nodes else str(node.target)))
    return frozenset(out)


def mutation_edges(tg: TracedGraph) -> frozenset[tuple[str, int]]:
    """(consumer node, tensor-input index) of every edge that must not redistribute (module docstring): the
    mutated argument of each in-place op, and each view's input on the way back to the mutated base."""
    edges: set[tuple[str, int]] = set()
    for info in tg.compute_nodes():
        node = info.node
        for pos in mutated_args(node):
            if pos >= len(node.args) or not isinstance(node.args[pos], torch.fx.Node):
                continue
            consumer, arg = node, node.args[pos]
            while True:
                uses: list = []
                torch.fx.node.map_arg((consumer.args, consumer.kwargs), uses.append)
                edges.add((consumer.name, uses.index(arg)))
                if alias_source(arg) is None:
                    break
                consumer, arg = arg, alias_source(arg)
    return frozenset(edges)
