"""Strategy spaces: for every node, the list of strategies (input layouts + output layout) it may take.

A strategy on an N-axis mesh is a product of N per-axis options from the op's rule (`rules.table`); shards
may be uneven (torch.chunk's split, `core.layout`) except where an option asks for even ones
(`AxisOption.even`). Special nodes:
  * parameter (one per `ParamInfo`, tied aliases share it): the STORED layouts, Replicate or Shard(d) per
    mesh axis (Replicate over a data axis = DDP, Shard over it = ZeRO-3/FSDP); buffers and lifted constants
    are stored replicated;
  * user input: Replicate, or its batch dim sharded over the data axes (`PlanConfig`);
  * axis roles (`PlanConfig.axis_roles`) narrow these: over a "ddp" axis parameters are stored Replicate and
    batch dims sharded; over "fsdp" parameters are stored Shard (where some dim divides) and batch dims
    sharded; over both, parameters are used Replicate and activations are not gathered (except into the
    graph output or an op without a rule), so the compute stays data parallel (`edge_roles.EdgeRoles`);
    over "tp" parameters of >= 2 dims are stored Shard (where some dim divides) in a layout every consumer
    takes as it is (never gathered over a "tp" axis: `edge_roles.EdgeRoles`), else Replicate (recorded as a
    fallback), and inputs are Replicate;
  * output: every input Replicate (the plan's final outputs are replicated);
  * an op with no rule: all Replicate, recorded as a fallback.

Followers (an exact-by-construction reduction of the search): a node with ONE tensor input, produced by an op
or user input in the same block instance, whose rule maps each input placement to one output placement
(views, unary pointwise ops, getitem, softmax, ...), does not choose: its strategy i is its producer's
strategy i pushed through the rule. It shares its producer's ILP variables. Only a node that takes EVERY
layout of its producer as it is follows (`_takes_each_as_it_is`): where the rule cannot map one (the leader's
Shard on a dim the node slices), the layout change it needs is the ILP's choice (an all-to-all to another dim
rather than a gather), so such a node has its own variables.

Mutations: an in-place op (`add_`, `fill_`, `relu_`, `copy_`, `index_put_`, batch_norm's running statistics)
writes the tensor where it lives, so the value it mutates, and every view on the way from that value's
base, must reach it without any redistribution (a redistributed copy would be mutated instead). Those edges
are `edge_roles.mutation_edges`; the planner forbids every layout change on them (`EdgeRoles.identity`).
"""
from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from cost_model.memory import backward_nodes

from ..config import PlanConfig
from ..core.layout import IndivisibleShardError, Layout, Replicate, Shard, divides_evenly, fits, view_regroups
from ..core.mesh import MeshSpec
from ..tracer import NodeInfo, Role, TracedGraph
from ..tracer.graph import ParamInfo, carries_grad
from .edge_roles import EdgeRoles, role_axes, written_inputs, written_placeholders
from .edge_roles import mutation_edges  # noqa: F401  (re-exported: imported from here by users of round 24)
from .rules import OUT, AxisOption, OpView, rule_for
from .rules.table import unverified_overload

R = Replicate()


@dataclass(frozen=True, slots=True)
class Strategy:
    """Input layouts (one per tensor input, in `NodeSpace.inputs` order) and the output layout (None for the
    graph output node). Layouts of parameter nodes are their stored layouts."""

    inputs: tuple[Layout, ...]
    output: Layout | None


@dataclass(frozen=True, slots=True)
class TensorInput:
    """One tensor input of a node: the producing node, the tensor's global shape and dtype."""

    producer: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class NodeSpace:
    """Strategy space of one node. `leader` is the node whose variables it shares (followers), else None.
    `kind`: "param", "buffer", "input", "op" or "output"."""

    name: str
    kind: str
    inputs: tuple[TensorInput, ...]
    strategies: list[Strategy]
    requires_grad: bool
    leader: str | None = None
    fallback: str | None = None
    param_fqn: str | None = None
    extra: dict = field(default_factory=dict)


def tensor_inputs(tg: TracedGraph, info: NodeInfo) -> tuple[TensorInput, ...]:
    """Tensor-valued fx-node arguments of a node, in order of appearance (args, then kwargs)."""
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((info.node.args, info.node.kwargs), lambda n: found.append(n) or n)
    res = []
    for n in found:
        prod = tg.nodes[n.name]
        if not prod.outputs:
            continue
        k = info.node.args[1] if info.target is operator.getitem and len(prod.outputs) > 1 else 0
        t = prod.outputs[k]
        res.append(TensorInput(n.name, tuple(t.shape), t.dtype))
    return tuple(res)


def op_view(tg: TracedGraph, info: NodeInfo, inputs: tuple[TensorInput, ...]) -> OpView:
    """The `OpView` a rule sees of node `info` with tensor inputs `inputs`."""
    return OpView(info.target, tuple(info.node.args), dict(info.node.kwargs), tuple(i.shape for i in inputs),
                  tuple(tuple(o.shape) for o in info.outputs), tuple(i.dtype for i in inputs),
                  tuple(o.dtype for o in info.outputs))


def _valid(combo: tuple[AxisOption, ...], ins: tuple[Layout, ...], out: Layout, mesh: MeshSpec, in_shapes,
           out_shapes) -> bool:
    """Layouts fit their tensors; the tensors an option needs split evenly (`AxisOption.even`) do, and those it
    regroups (`AxisOption.regroup`) split evenly or have that dim sharded by this one mesh axis."""
    if not (all(fits(sh, L, mesh) for sh, L in zip(in_shapes, ins)) and all(fits(o, out, mesh) for o in out_shapes)):
        return False
    for axis, option in enumerate(combo):
        for k in (*option.even, *option.regroup):
            layout, shapes = (out, out_shapes) if k == OUT else (ins[k], (in_shapes[k],))
            p = layout[axis]
            if not isinstance(p, Shard) or all(divides_evenly(sh, layout, mesh, (p.dim,)) for sh in shapes):
                continue
            if k in option.even or any(isinstance(q, Shard) and q.dim % len(shapes[0]) == p.dim % len(shapes[0])
                                       and mesh.shape[i] > 1 for i, q in enumerate(layout) if i != axis):
                return False
    if any(option.regroup for option in combo):  # a view whose uneven chunks are not whole rows on either side
        try:                                     # ((12, 8) -> (16, 6) over 3: 32 elements are 5.33 rows of 6)
            view_regroups(in_shapes[0], out_shapes[0], ins[0], out, mesh.shape)
        except IndivisibleShardError:
            return False
    return True


def op_strategies(view: OpView, options: list[AxisOption], mesh: MeshSpec) -> list[Strategy]:
    """Every combination of one per-axis option per mesh axis that is valid (`_valid`); order-preserving,
    deduplicated. This is the strategy space of an op node that chooses (not a follower).

    Memoised (`_STRATEGY_CACHE`) on everything it reads: the options, the mesh and the view's input and output
    shapes (`_valid` reads nothing else), so the instances of a repeated block, the stages of a pipeline and the
    meshes tried again by the search enumerate each distinct (options, shapes, mesh) once."""
    return list(_product_strategies(tuple(options), mesh, _shapes(view.in_shapes), _shapes(view.out_shapes)))


def _shapes(shapes) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(s) for s in shapes)


# Distinct (options, mesh, shapes) keys kept per memoised function: a Llama-2-7B search and its stage solves use
# a few hundred; the bound only keeps a long-lived process from growing without limit.
_STRATEGY_CACHE = 8192


@functools.lru_cache(maxsize=_STRATEGY_CACHE)
def _product_strategies(options: tuple[AxisOption, ...], mesh: MeshSpec, in_shapes: tuple, out_shapes: tuple
                        ) -> tuple[Strategy, ...]:
    seen, res = set(), []
    for combo in itertools.product(options, repeat=mesh.ndim):
        ins = tuple(Layout(tuple(c.inputs[k] for c in combo)) for k in range(len(in_shapes)))
        out = Layout(tuple(c.output for c in combo))
        s = Strategy(ins, out)
        if s not in seen and _valid(combo, ins, out, mesh, in_shapes, out_shapes):
            seen.add(s)
            res.append(s)
    return tuple(res)


def _layouts(shape: tuple[int, ...], per_axis: list[list], mesh: MeshSpec) -> list[Layout]:
    return [L for L in (Layout(c) for c in itertools.product(*per_axis)) if fits(shape, L, mesh)]


def _follow(leader: NodeSpace, options: list[AxisOption], view: OpView, mesh: MeshSpec) -> list[Strategy]:
    """A follower's strategies: its leader's output layouts pushed through its rule (module docstring); an
    axis the rule cannot map, or whose result breaks an evenness need, is made Replicate. Memoised like
    `op_strategies` on all it reads (the leader's output layouts, the options, the mesh, the view's shapes)."""
    return list(_followed(tuple(s.output for s in leader.strategies), tuple(options), mesh,
                          _shapes(view.in_shapes), _shapes(view.out_shapes)))


@functools.lru_cache(maxsize=_STRATEGY_CACHE)
def _followed(leader_outputs: tuple[Layout, ...], options: tuple[AxisOption, ...], mesh: MeshSpec,
              in_shapes: tuple, out_shapes: tuple) -> tuple[Strategy, ...]:
    mapping: dict = {}
    for o in options:
        mapping.setdefault(o.inputs[0], o)
    rep = mapping[R]
    res = []
    for output in leader_outputs:
        combo = [mapping.get(p, rep) for p in output]
        for a in reversed(range(mesh.ndim)):
            ins, out = (Layout(tuple(c.inputs[0] for c in combo)),), Layout(tuple(c.output for c in combo))
            if _valid(tuple(combo), ins, out, mesh, in_shapes, out_shapes):
                break
            combo[a] = rep
        ins, out = (Layout(tuple(c.inputs[0] for c in combo)),), Layout(tuple(c.output for c in combo))
        res.append(Strategy(ins, out))
    return tuple(res)


def received_with_grad(tg: TracedGraph) -> list[str]:
    """The input placeholders of `tg` that carry a gradient: none of a whole model's graph (user inputs arrive
    without one, as `build_spaces` plans them and autograd runs them: a first layer's product keeps no weight); of a
    pipeline stage's graph (`tg.cut_from`: the whole graph it was cut from), the values it receives that depend on
    a trained parameter there (`cost_model.memory.backward_nodes`), whose gradients it sends back. Round 27 (r27e):
    every floating input counted as one before."""
    whole = tg.cut_from
    if whole is None:
        return []
    trained = [ph for p in whole.parameters.values() if not p.is_buffer and p.requires_grad for ph in p.placeholders]
    live = backward_nodes(whole.graph_module, trained)
    return [n for n in tg.input_names if n in live]


def build_spaces(tg: TracedGraph, mesh: MeshSpec, config: PlanConfig,
                 received: dict[str, Layout] | None = None) -> dict[str, NodeSpace]:
    """`NodeSpace` per graph node (placeholders, ops, output), in graph order.

    `received`: input placeholder -> the one layout it arrives in, with a gradient sent back when it is
    floating point (a pipeline stage's values from the previous stage, in their producer's layout:
    `planner.stage_layouts`); other inputs are user inputs (batch-sharded over data axes or replicated, no
    gradient).

    Raises:
        ValueError: a data axis or an axis role naming an axis that is not a mesh axis; a user input whose
            batch dim does not divide over a "ddp"/"fsdp" axis; a received layout that does not fit its value.
    """
    data_axes = _data_axes(mesh, config)
    written = written_inputs(tg)
    written_params = {}
    for ph, op in sorted(written_placeholders(tg, Role.PARAMETER)):
        written_params.setdefault(ph, op)
    spaces: dict[str, NodeSpace] = {}
    for name, info in tg.nodes.items():
        inputs = tensor_inputs(tg, info)
        if received and name in received:
            spaces[name] = _received_space(info, received[name], mesh)
            continue
        if info.op == "placeholder" or info.op == "get_attr":
            param = tg.param_of_placeholder(name)
            writer = next((written_params[ph] for ph in (param.placeholders if param is not None else ())
                           if ph in written_params), None)
            spaces[name] = _placeholder_space(info, param, mesh, config, data_axes,
                                              written=name in written, writer=writer)
            continue
        if info.op == "output":
            spaces[name] = NodeSpace(name, "output", inputs,
                                     [Strategy(tuple(Layout.replicate(mesh.ndim) for _ in inputs), None)], False)
            continue
        req = (any(spaces[i.producer].requires_grad for i in inputs) and bool(info.outputs)
               and carries_grad(info.outputs[0].dtype) and info.op_name != "aten.detach.default")
        view = op_view(tg, info, inputs)
        rule = rule_for(info.target, view)
        options = rule(view) if rule is not None else None
        if options is None:
            rep = [Strategy(tuple(Layout.replicate(mesh.ndim) for _ in inputs), Layout.replicate(mesh.ndim))]
            why = unverified_overload(info.target, view) if rule is None else " with these arguments (its rule's docstring says why)"
            spaces[name] = NodeSpace(name, "op", inputs, rep, req, fallback=f"no sharding rule for {info.op_name}{why}")
            continue
        leader = _leader(tg, info, inputs, options, spaces)
        followed = None if leader is None else _follow(spaces[inputs[0].producer], options, view, mesh)
        if followed is not None and _takes_each_as_it_is(spaces[inputs[0].producer], followed):
            spaces[name] = NodeSpace(name, "op", inputs, followed, req, leader=leader)
        else:
            spaces[name] = NodeSpace(name, "op", inputs, op_strategies(view, options, mesh), req)
    _keep_tp_weights_usable(tg, mesh, config, spaces)
    _check_roles_take_effect(tg, mesh, config, spaces)
    return spaces


def _check_roles_take_effect(tg: TracedGraph, mesh: MeshSpec, config: PlanConfig, spaces: dict[str, NodeSpace]) -> None:
    """Raise ValueError for a role that cannot shard anything: a "ddp"/"fsdp" axis over which no user input
    can be batch-sharded, a "tp" axis over which no parameter can be stored sharded."""
    for i, axis in enumerate(mesh.axis_names):
        role = config.role_of(axis)
        if role in ("ddp", "fsdp"):
            names = [n for n in tg.input_names if n in spaces]
            if not any(s.output.placements[i] != R for n in names for s in spaces[n].strategies):
                shapes = ", ".join(f"{n} {tuple(tg.nodes[n].outputs[0].shape)} (batch dim {config.batch_dim_of(n)})"
                                   for n in names if tg.nodes[n].outputs) or "none"
                written = sorted(written_inputs(tg) & set(names))
                if written:
                    raise ValueError(
                        f"axis_roles[{axis!r}]={role!r}: no user input can be sharded over {axis} (size "
                        f"{mesh.size(axis)}) on mesh {mesh}: forward writes input(s) {', '.join(written)} in place "
                        "(the caller's tensor, which one device mutates whole; so it is kept whole on every rank, "
                        f"a batch shard would write only this rank's rows); inputs: {shapes}. Remedy: write a "
                        "copy in forward (`x = x.mul(2)` instead of `x.mul_(2)`), or another role")
                raise ValueError(f"axis_roles[{axis!r}]={role!r}: no user input can be sharded over {axis} (size "
                                 f"{mesh.size(axis)}) on mesh {mesh}; inputs: {shapes}. Remedy: a batch of at least "
                                 f"{mesh.size(axis)} along the batch dim (batch_dims/default_batch_dim), or another role")
        if role == "tp":
            params = [p for p in tg.parameters.values() if not p.is_buffer and p.placeholders[0] in spaces]
            if not any(s.output.placements[i] != R for p in params for s in spaces[p.placeholders[0]].strategies):
                held = {ph for p in params for ph in p.placeholders}
                no_rule = sorted({tg.nodes[n].op_name for n, sp in spaces.items() if sp.fallback
                                  and any(t.producer in held for t in sp.inputs)})
                why = (f"every parameter is used by an op without a sharding rule ({', '.join(no_rule)}), which "
                       "takes it whole" if no_rule else f"no parameter dim divides by {mesh.size(axis)}")
                remedy = ("another role for this axis, or compute those ops from sharding-friendly ones (e.g. "
                          "torch.nn.utils.parametrize.remove_parametrizations before tracing)" if no_rule else
                          "a tp size that divides the hidden sizes, or another role")
                raise ValueError(f"axis_roles[{axis!r}]='tp': no parameter can be stored sharded over {axis} (size "
                                 f"{mesh.size(axis)}) on mesh {mesh}: {why}. Remedy: {remedy}")


def _keep_tp_weights_usable(tg: TracedGraph, mesh: MeshSpec, config: PlanConfig, spaces: dict[str, NodeSpace]) -> None:
    """Under "tp" roles, keep the stored layouts of each parameter that every use can consume without a
    gather or all-to-all over a tp axis (`EdgeRoles`); when the forced layouts leave none, fall back to the
    usable layouts sharded over as many forced axes as possible, and record why."""
    data, tp = role_axes(mesh, config)
    if not tp:
        return
    rule = EdgeRoles(used_replicated=data, keep_shard=tp)
    roles = config.roles_on(mesh.axis_names)
    for p in tg.parameters.values():
        space = spaces.get(p.placeholders[0])
        if p.is_buffer or space is None:
            continue
        shape = tuple(p.shape)
        wanted = [(use, {s.inputs[k] for s in spaces[use].strategies})
                  for use in p.uses for k, ti in enumerate(spaces[use].inputs) if ti.producer in p.placeholders]
        usable = lambda L: all(any(not rule.forbids(L, b, shape, mesh) for b in layouts) for _, layouts in wanted)
        keep = [s for s in space.strategies if usable(s.output)]
        if keep:
            _set_param_strategies(spaces, p.placeholders, keep)
            continue
        forced_layouts = [s.output for s in space.strategies]
        blocker = next((use for use, layouts in wanted
                        if not any(not rule.forbids(L, b, shape, mesh) for L in forced_layouts for b in layouts)), None)
        relaxed = [L for L in _param_layouts(shape, roles, mesh, force=False) if usable(L)]
        _set_param_strategies(spaces, p.placeholders,
                              [Strategy((), L) for L in _most_sharded(relaxed, _forced_axes(roles, shape))])
        by = f" by {tg.nodes[blocker].op_name} ({blocker})" if blocker else ""
        space.fallback = (f"axis roles {dict(config.axis_roles)}: parameter {p.fqn} {shape} cannot be stored "
                          f"sharded over every forced axis and used{by} as the roles require; stored "
                          + " or ".join(str(s.output) for s in space.strategies))


def _leader(tg: TracedGraph, info: NodeInfo, inputs, options, spaces) -> str | None:
    """The group leader a node may follow, or None (see module docstring)."""
    if len(inputs) != 1:
        return None
    prod = spaces[inputs[0].producer]
    if prod.kind not in ("op", "input") or tg.nodes[prod.name].block != info.block:
        return None
    firsts = [o.inputs[0] for o in options]
    if len(set(firsts)) != len(firsts):
        return None
    return prod.leader or prod.name



def _takes_each_as_it_is(producer: NodeSpace, followed: list[Strategy]) -> bool:
    """Whether a would-be follower takes every output layout of its producer without a layout change (module
    docstring). Where its rule cannot map one (a slice or view over the sharded dim, a Partial into an op that
    needs the sum), following would fix that redistribution to a gather to Replicate, although an all-to-all to
    another dim (or a reduce-scatter) may be what a plan needs: under "ddp"/"fsdp" roles, which forbid gathering
    activations, that made TimeSformer's `embeddings[:batch_size, 0]` over the merged (batch x frames) dim
    infeasible. Such a node chooses its own strategies instead."""
    return all(f.inputs[0] == p.output for f, p in zip(followed, producer.strategies))


def _set_param_strategies(spaces: dict[str, NodeSpace], placeholders, strategies: list[Strategy]) -> None:
    """Give every placeholder of one (possibly tied) parameter the same stored layouts: they share ILP
    variables (`problem.py` groups them)."""
    for ph in placeholders:
        if ph in spaces:
            spaces[ph].strategies = list(strategies)


def _param_layouts(shape: tuple[int, ...], roles: list[str], mesh: MeshSpec, force: bool = True) -> list[Layout]:
    """Stored layouts a parameter may take under the axis roles: Replicate over "ddp" axes; with `force`,
    Shard over "fsdp" axes and (for >= 2-D parameters) "tp" axes, as many of them as the shape allows;
    Replicate or Shard(any dim) elsewhere."""
    shards = [Shard(d) for d in range(len(shape)) if shape[d] > 1]
    layouts = _layouts(shape, [[R] if role == "ddp" else [R] + shards for role in roles], mesh)
    return _most_sharded(layouts, _forced_axes(roles, shape)) if force else layouts


def _forced_axes(roles: list[str], shape: tuple[int, ...]) -> list[int]:
    """Mesh axes over which the roles want a parameter of `shape` stored Shard ("fsdp"; "tp" for >= 2-D)."""
    return [i for i, role in enumerate(roles) if role == "fsdp" or (role == "tp" and len(shape) >= 2)]


def _most_sharded(layouts: list[Layout], axes: list[int]) -> list[Layout]:
    """The layouts sharded over the most of `axes`."""
    counts = [sum(L.placements[i] != R for i in axes) for L in layouts]
    return [L for L, n in zip(layouts, counts) if n == max(counts, default=0)]


def _data_axes(mesh: MeshSpec, config: PlanConfig) -> tuple[str, ...]:
    """Axes user inputs may be sharded over: `config.data_axes`, else every axis not given the role "tp"."""
    for axis, _ in config.axis_roles:
        if axis not in mesh.axis_names:
            raise ValueError(f"axis_roles names mesh axis {axis!r}, but mesh {mesh} has axes {mesh.axis_names}; "
                             "name the roles after the mesh's axes")
    if config.data_axes is None:
        return tuple(a for a in mesh.axis_names if config.role_of(a) != "tp")
    for a in config.data_axes:
        mesh.index(a)
    return config.data_axes


def _received_space(info: NodeInfo, layout: Layout, mesh: MeshSpec) -> NodeSpace:
    """The space of a value that arrives in `layout` (`build_spaces`' `received`)."""
    out = info.outputs[0] if info.outputs else None
    if info.op != "placeholder" or out is None or not fits(tuple(out.shape), layout, mesh):
        raise ValueError(f"received layout {layout} of {info.name!r} (op {info.op}, shape "
                         f"{tuple(out.shape) if out is not None else None}) does not fit mesh {mesh}: a received value "
                         "is a tensor placeholder of a stage graph laid out as its producer's output")
    return NodeSpace(info.name, "input", (), [Strategy((), layout)], carries_grad(out.dtype))


def _placeholder_space(info: NodeInfo, param: ParamInfo | None, mesh: MeshSpec, config: PlanConfig,
                       data_axes: tuple[str, ...], written: bool = False, writer: str | None = None) -> NodeSpace:
    """The space of placeholder `info` standing for parameter/buffer `param` (None: a user input or constant).
    `written`: a user input that forward writes in place (`written_inputs`): Replicate only.
    `writer`: the op that writes parameter `param` in place in forward (`written_placeholders`), or None. An
    in-place op writes the stored tensor (`mutation_edges`: no layout change on the way), while a "ddp"/"fsdp"
    axis has every parameter used Replicate: a parameter stored Shard over an "fsdp" axis could be neither
    written where it lives nor used whole, and every plan was infeasible. Such a parameter is stored Replicate
    over the "fsdp" axes instead (as under "ddp"), recorded as a fallback."""
    shape = tuple(info.outputs[0].shape) if info.outputs else ()
    roles = config.roles_on(mesh.axis_names)
    if info.role is Role.INPUT and written:
        return NodeSpace(info.name, "input", (), [Strategy((), Layout.replicate(mesh.ndim))], False)
    if info.role is Role.PARAMETER and param is not None and not param.is_buffer:
        fsdp = [a for a, r in zip(mesh.axis_names, roles) if r == "fsdp"] if writer else []
        stored = ["ddp" if r == "fsdp" and fsdp else r for r in roles]
        space = NodeSpace(info.name, "param", (), [Strategy((), L) for L in _param_layouts(shape, stored, mesh)],
                          param.requires_grad, param_fqn=param.fqn)
        if fsdp:
            space.fallback = (f"axis roles {dict(config.axis_roles)}: parameter {param.fqn} {shape} is written in "
                              f"place in forward ({writer}), so it is stored Replicate over the 'fsdp' axes "
                              f"{', '.join(fsdp)} (written where it lives and used whole there, as under 'ddp'); "
                              "to shard it, update it outside forward (e.g. after optimizer.step())")
        return space
    if info.role is Role.INPUT:
        bd = config.batch_dim_of(info.name)
        shardable = bd is not None and len(shape) > 0 and shape[bd] > 1
        per_axis = [([] if role in ("ddp", "fsdp") and shardable else [R])
                    + ([Shard(bd % len(shape))] if shardable and a in data_axes else [])
                    for a, role in zip(mesh.axis_names, roles)]
        layouts = _layouts(shape, per_axis, mesh)
        if not layouts:
            data = [f"{a} (size {mesh.size(a)})" for a, role in zip(mesh.axis_names, roles) if role in ("ddp", "fsdp")]
            raise ValueError(f"user input {info.name!r} of shape {shape}: its batch dim {bd} cannot be sharded over "
                             f"the data-parallel axes {', '.join(data)} of mesh {mesh} (axis_roles "
                             f"{dict(config.axis_roles)}); use a batch divisible by their product, or another role")
        return NodeSpace(info.name, "input", (), [Strategy((), L) for L in layouts], False)
    return NodeSpace(info.name, "buffer", (), [Strategy((), Layout.replicate(mesh.ndim))], False,
                     param_fqn=param.fqn if param is not None else None)


def nearest_strategies(edited: str, offered) -> list[str]:
    """`offered` strategies ("S(0)R RS(1) -> S(0)S(1)") ordered by how many of `edited`'s input layouts they keep,
    then whether they keep its output layout, then by text: the fixes of a hand edit first. Round 23 new-user
    trial: an mm edited to 'S(0)R RS(1) -> S(0)R' was offered 'PP RR -> PP', 'PR RP -> PP', ... (sorted by text)
    before 'S(0)R RS(1) -> S(0)S(1)', the one-layout fix."""
    def layouts(text: str) -> tuple[list[str], str]:
        ins, _, out = text.partition("->")
        return ins.split(), out.strip()
    ins, out = layouts(edited)

    def key(text: str):
        their_ins, their_out = layouts(text)
        return -sum(a == b for a, b in zip(ins, their_ins)), their_out != out, text
    return sorted(offered, key=key)


def unplannable_strategies(tg: TracedGraph, mesh: MeshSpec, config: PlanConfig, nodes: dict) -> list[str]:
    """The nodes of a plan (`nodes`: name -> `NodePlan`) whose strategy the planner could not have chosen for
    `tg` on `mesh` under `config`, one readable line each (empty when every strategy is one it offers).

    A plan file edited by hand passes the JSON checks of `Plan.load` with a strategy no rule gives its op (a
    3x3 conv sharded along a spatial dim computes without its neighbours' rows; a loss mean declared
    Replicate where each rank holds its own batch's mean), or a stored layout the program cannot keep (a
    BatchNorm running buffer written in place, sharded): the emitted program then trains other numbers than
    one device, silently. Allowed here: an op's rule strategies on the mesh (`op_strategies`, which holds a
    follower's too), Replicate for an op without a rule, a parameter's layouts under the roles with the
    relaxed fallback of `_keep_tp_weights_usable`, and a buffer's or user input's space. The graph output
    is checked by its edges (`Plan.load`)."""
    spaces = build_spaces(tg, mesh, config)
    roles = config.roles_on(mesh.axis_names)
    problems = []
    for name, space in spaces.items():
        chosen = nodes.get(name)
        if chosen is None or space.kind == "output":
            continue
        info = tg.nodes[name]
        if space.kind == "param":
            allowed = [Strategy((), L) for L in _param_layouts(tuple(info.outputs[0].shape), roles, mesh, force=False)]
        elif space.kind == "op" and space.leader is not None:
            view = op_view(tg, info, space.inputs)
            allowed = op_strategies(view, rule_for(info.target, view)(view), mesh)
        else:
            allowed = space.strategies
        text = {f"{' '.join(map(str, s.inputs))} -> {s.output}".lstrip() for s in allowed}
        if chosen.strategy not in text:
            shown = nearest_strategies(chosen.strategy, text)[:6]
            problems.append(f"{name} ({info.op_name}, {space.kind}{f' {space.param_fqn}' if space.param_fqn else ''}): "
                            f"'{chosen.strategy}' is not a strategy the planner offers it on mesh {mesh} (it offers "
                            f"{', '.join(repr(s) for s in shown)}{' ...' if len(text) > len(shown) else ''})")
    return problems
