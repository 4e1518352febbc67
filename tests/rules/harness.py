"""The rule harness (DESIGN.md rule 8): run every strategy of a rule on simulated per-rank shards and compare
with the op on the global tensors, forward and backward.

For one `Sample` of an op and one mesh:
1. a one-op `TracedGraph` is built (placeholders for the tensor arguments, the op, getitems of its outputs,
   and the output node returning the outputs and every argument the op mutates);
2. every strategy the planner could give the op (`strategies.op_strategies` over the rule's options, so the
   evenness filter is the planner's) is turned into a `ShardingSpec` in which the inputs ARRIVE in the
   strategy's input layouts and the outputs LEAVE in its output layout (no redistribution at all), and each
   rank's program is made by the real rewriter (`rewrite`, checked by `verify`);
3. the inputs are cut per rank (`core.layout.local_region`: torch.chunk's uneven split), Partial inputs as
   random summands; every rank runs its program and backward with the cotangent's local piece, on the
   threaded process group (`sim.world`);
4. outputs are assembled per the output layout (Shard placed by region, Partial summed, Replicate checked
   equal on every rank) and compared with the global op; input gradients are assembled per the gradient
   semantics of `core.redistribute`: every rank holds the full gradient of a Replicate or Partial input (the
   rewriter's `grad_all_reduce` sums the partial gradients of a Replicate input of a split computation) and
   its shard of the gradient of a Shard input.
"""
from __future__ import annotations

import itertools
import operator

import torch
import torch.fx
from torch.utils import _pytree as pytree

from parallelizer.core.layout import Layout, Partial, Replicate, Shard, local_region
from parallelizer.core.mesh import MeshSpec
from parallelizer.planner.rules import RuleEntry
from parallelizer.planner.strategies import Strategy, op_strategies, op_view, tensor_inputs
from parallelizer.rewriter.apply import rewrite
from parallelizer.rewriter.spec import NodeSharding, ShardingSpec, mesh_coords
from parallelizer.rewriter.verify import verify
from parallelizer.tracer.graph import NodeInfo, Role, TensorMeta, TracedGraph, mutated_args

from sim import agreed, world

MESHES = (MeshSpec(("a",), (2,)), MeshSpec(("a",), (3,)), MeshSpec(("a",), (4,)), MeshSpec(("a", "b"), (2, 2)))
RTOL, ATOL = 1e-5, 1e-6   # fp32, comparing two different op graphs (sums in another order); atol is
                          # relative to the largest magnitude of the expected tensor (1e-6 of it, at least 1e-6)


class Mismatch(AssertionError):
    """A strategy whose sharded result differs from the op on global tensors."""


def _metas(value) -> tuple[TensorMeta, ...]:
    return tuple(TensorMeta(tuple(t.shape), t.dtype) for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


def one_op_graph(op, args: tuple, kwargs: dict) -> tuple[TracedGraph, list[torch.Tensor], str]:
    """(graph, global input tensors in placeholder order, name of the op node) for `op(*args, **kwargs)`."""
    graph = torch.fx.Graph()
    tensors: list[torch.Tensor] = []

    def placeholder(x):
        if isinstance(x, torch.Tensor):
            node = graph.placeholder(f"x{len(tensors)}")
            node.meta["val"] = x
            tensors.append(x)
            return node
        return x

    fx_args, fx_kwargs = pytree.tree_map(placeholder, (args, kwargs))
    node = graph.call_function(op, tuple(fx_args), dict(fx_kwargs))
    clones = [t.clone() for t in tensors]
    value = op(*pytree.tree_map_only(torch.Tensor, lambda t: clones[_index(tensors, t)], args),
               **pytree.tree_map_only(torch.Tensor, lambda t: clones[_index(tensors, t)], kwargs))
    node.meta["val"] = value
    returned = []
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            item = graph.call_function(operator.getitem, (node, i))
            item.meta["val"] = v
            returned.append(item)
    elif isinstance(value, torch.Tensor):
        returned.append(node)
    uses: list = []
    torch.fx.node.map_arg((node.args, node.kwargs), uses.append)
    returned += [node.args[p] for p in mutated_args(node) if p < len(node.args) and isinstance(node.args[p], torch.fx.Node)]
    out = graph.output(tuple(returned))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    nodes = {}
    for n in gm.graph.nodes:
        role = Role.INPUT if n.op == "placeholder" else Role.OUTPUT if n.op == "output" else Role.ACTIVATION
        nodes[n.name] = NodeInfo(n.name, n, n.op, n.target if n.op == "call_function" else None, role,
                                 _metas(n.meta.get("val")), "")
    del out
    tg = TracedGraph(exported=None, graph_module=gm, nodes=nodes, parameters={}, blocks=[],
                     input_names=tuple(n.name for n in gm.graph.nodes if n.op == "placeholder"))
    return tg, tensors, node.name


def _index(tensors: list[torch.Tensor], t: torch.Tensor) -> int:
    return next(i for i, x in enumerate(tensors) if x is t)


def strategies(entry: RuleEntry, tg: TracedGraph, name: str, mesh: MeshSpec) -> list[Strategy]:
    info = tg.nodes[name]
    view = op_view(tg, info, tensor_inputs(tg, info))
    return op_strategies(view, entry.rule(view), mesh)


def _spec(tg: TracedGraph, name: str, s: Strategy, mesh: MeshSpec) -> ShardingSpec:
    nodes = {name: NodeSharding(s.inputs, s.output)}
    out_node = tg.graph_module.graph.output_node()
    outs = []
    for r in out_node.args[0]:
        if r.op == "placeholder":
            outs.append(s.inputs[tg.input_names.index(r.name)])
        else:
            outs.append(s.output)
            if r.name != name:
                nodes[r.name] = NodeSharding((s.output,), s.output)
    nodes["output"] = NodeSharding(tuple(outs), Layout.replicate(mesh.ndim))
    return ShardingSpec(mesh, nodes, {}, dict(zip(tg.input_names, s.inputs)))


def _piece(x: torch.Tensor, layout: Layout, mesh: MeshSpec, coords) -> torch.Tensor:
    starts, lengths = local_region(tuple(x.shape), layout, mesh, coords)
    for d, (st, n) in enumerate(zip(starts, lengths)):
        x = x.narrow(d, st, n)
    return x


def _split_partial(x: torch.Tensor, layout: Layout, mesh: MeshSpec, gen: torch.Generator) -> dict:
    """Per mesh coordinate, a summand of `x` over the Partial axes (equal on the other axes, and adding up to
    `x`): random for fp32/fp64; for lower precision, x/2, x/4, ... (exact in any float format)."""
    coords = list(itertools.product(*[range(n) for n in mesh.shape]))
    p_axes = [a for a, p in enumerate(layout) if isinstance(p, Partial)]
    keys = sorted({tuple(c[a] for a in p_axes) for c in coords})
    exact_split = x.dtype not in (torch.float32, torch.float64)
    by_key: dict = {}
    for i, key in enumerate(keys[1:], start=1):
        by_key[key] = x * 2.0 ** -i if exact_split else (0.5 * torch.randn(x.shape, generator=gen)).to(x.dtype)
    by_key[keys[0]] = x * 2.0 ** -(len(keys) - 1) if exact_split else x - sum(by_key.values())
    return {c: by_key[tuple(c[a] for a in p_axes)] for c in coords}


def local_inputs(tensors: list[torch.Tensor], s: Strategy, mesh: MeshSpec, seed: int) -> dict:
    """coords -> list of this rank's local inputs."""
    gen = torch.Generator().manual_seed(seed)
    coords = list(itertools.product(*[range(n) for n in mesh.shape]))
    per = {c: [] for c in coords}
    for x, layout in zip(tensors, s.inputs):
        parts = _split_partial(x, layout, mesh, gen) if any(isinstance(p, Partial) for p in layout) else None
        for c in coords:
            src = parts[c] if parts is not None else x
            per[c].append(_piece(src, layout, mesh, c).clone())
    return per


def assemble(locals_: dict, layout: Layout, shape: tuple[int, ...], mesh: MeshSpec, exact: bool, what: str) -> torch.Tensor:
    """The global tensor from per-coordinate local values under `layout` (module docstring); replicas must
    agree (bitwise when `exact`)."""
    p_axes = [a for a, p in enumerate(layout) if isinstance(p, Partial)]
    plain = Layout(tuple(Replicate() if isinstance(p, Partial) else p for p in layout))
    summed: dict = {}
    for c, v in locals_.items():
        key = tuple(None if a in p_axes else c[a] for a in range(mesh.ndim))
        summed[key] = v.clone() if key not in summed else summed[key] + v
    ref = next(iter(locals_.values()))
    out = torch.zeros(shape, dtype=ref.dtype)
    filled = torch.zeros(shape, dtype=torch.bool)
    for key, v in summed.items():
        c = tuple(0 if k is None else k for k in key)
        starts, lengths = local_region(shape, plain, mesh, c)
        if tuple(v.shape) != tuple(lengths):
            raise Mismatch(f"{what}: rank at {c} holds shape {tuple(v.shape)}, layout {layout} wants {lengths}")
        region = tuple(slice(st, st + n) for st, n in zip(starts, lengths))
        if filled[region].all() and v.numel():
            _close(v, out[region], exact, f"{what}: replicas disagree ({layout})")
        out[region] = v
        filled[region] = True
    return out


def _close(actual: torch.Tensor, expected: torch.Tensor, exact: bool, what: str) -> None:
    if exact or not (actual.is_floating_point() or actual.is_complex()):  # (complex: FFT kernels round per batch size)
        same = torch.equal(actual, expected) or (
            actual.is_floating_point() and torch.equal(actual.nan_to_num(), expected.nan_to_num()))
        if not same:
            diff = (actual.double() - expected.double()).abs().max() if actual.numel() else 0.0
            raise Mismatch(f"{what}: not bitwise equal; max |diff| {diff:.3g}")
        return
    try:
        if actual.dtype in (torch.float32, torch.float64, torch.complex64, torch.complex128):  # atol relative to the magnitude
            scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
            torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL * scale, equal_nan=True)
        else:
            torch.testing.assert_close(actual, expected, equal_nan=True)
    except AssertionError as exc:
        raise Mismatch(f"{what}: {str(exc).splitlines()[0]} {' '.join(str(exc).split()[-12:])}") from None


def check(entry: RuleEntry, sample, mesh: MeshSpec, seed: int = 0) -> int:
    """Run every strategy of `entry` on `sample` over `mesh`; returns how many ran. Raises Mismatch naming the
    op, sample, strategy and what differs."""
    args, kwargs = sample.materialize(seed)
    tg, tensors, name = one_op_graph(sample.op, args, kwargs)
    node = tg.nodes[name].node
    mutating = bool(mutated_args(node))
    ran = 0
    flags = sample.grad_flags()
    for s in strategies(entry, tg, name, mesh):
        try:
            _check_strategy(entry, tg, name, tensors, s, mesh, seed, mutating, flags)
        except Mismatch as exc:
            raise Mismatch(f"{sample.op} {_describe(sample)} on mesh {mesh}, strategy "
                           f"{' '.join(map(str, s.inputs))} -> {s.output}: {exc}") from None
        ran += 1
    return ran


def _describe(sample) -> str:
    return pytree.tree_map(lambda x: f"T{tuple(x.shape)}" if hasattr(x, "shape") else x, (sample.args, sample.kwargs),
                           is_leaf=lambda x: hasattr(x, "make")).__repr__()


def _check_strategy(entry, tg, name, tensors, s: Strategy, mesh: MeshSpec, seed: int, mutating: bool,
                    flags: list[bool]) -> None:
    spec = _spec(tg, name, s, mesh)
    per = local_inputs(tensors, s, mesh, seed + 1)
    out_node = tg.graph_module.graph.output_node()
    returned = list(out_node.args[0])
    out_layouts = spec.nodes["output"].inputs
    # the reference: the op on global tensors, with a random cotangent for every float output
    wants_grad = [t.is_floating_point() and not mutating and f for t, f in zip(tensors, flags)]
    ref_in = [t.clone().requires_grad_(w) for t, w in zip(tensors, wants_grad)]
    ref_env = torch.fx.Interpreter(tg.graph_module).run(*ref_in)
    ref_out = list(ref_env)
    gen = torch.Generator().manual_seed(seed + 2)
    cot = [torch.randn(o.shape, generator=gen).to(o.dtype) if o.is_floating_point() and o.requires_grad else None
           for o in ref_out]
    grad_pairs = [(o, c) for o, c in zip(ref_out, cot) if c is not None]
    ref_grads = ()
    if grad_pairs and any(t.requires_grad for t in ref_in):
        try:
            ref_grads = torch.autograd.grad([o for o, _ in grad_pairs], [t for t in ref_in if t.requires_grad],
                                            [c for _, c in grad_pairs], allow_unused=True)
        except RuntimeError as exc:  # an op without a derivative (floor_divide, ...): forward only
            if "derivative" not in str(exc) and "not implemented" not in str(exc):
                raise
            cot = [None] * len(cot)
    coords_of = {r: mesh_coords(mesh, r) for r in range(mesh.world_size)}

    def rank_fn(rank: int):
        if rank >= mesh.world_size:
            return None
        c = coords_of[rank]
        local = [t.requires_grad_(w) for t, w in zip(per[c], wants_grad)]
        with agreed(mesh.world_size):  # a rank that fails here stops the others before they wait in a collective
            program = rewrite(tg, spec, rank)
            verify(program, tg, spec)
        outs = list(program.graph_module(*local))
        pairs = [(o, _piece_cot(cg, lay, mesh, c)) for o, cg, lay in zip(outs, cot, out_layouts)
                 if cg is not None and o.requires_grad]
        grads = ()
        wants = [t for t in local if t.requires_grad]
        if pairs and wants:
            grads = torch.autograd.grad([o for o, _ in pairs], wants, [g for _, g in pairs], allow_unused=True)
        return [o.detach() for o in outs], [None if g is None else g.detach() for g in grads]

    results = world().run(rank_fn)[:mesh.world_size]
    exact_ok = entry.exact and not any(isinstance(p, Partial) for L in (*s.inputs, s.output) for p in L)
    for k, (ref, layout) in enumerate(zip(ref_out, out_layouts)):
        locals_ = {coords_of[r]: results[r][0][k] for r in range(mesh.world_size)}
        if entry.random:
            assemble_shapes(locals_, layout, tuple(ref.shape), mesh)
            continue
        got = assemble(locals_, layout, tuple(ref.shape), mesh, exact_ok, f"output {k} ({returned[k].name})")
        _close(got, ref.detach(), exact_ok, f"output {k} ({returned[k].name}) in layout {layout}")
    if entry.random or not ref_grads:
        return
    wants = [i for i, t in enumerate(ref_in) if t.requires_grad]
    for j, i in enumerate(wants):
        ref_g = ref_grads[j]
        got_locals = {coords_of[r]: results[r][1][j] for r in range(mesh.world_size)}
        if ref_g is None or any(v is None for v in got_locals.values()):
            if ref_g is not None and ref_g.abs().max() > 0:
                raise Mismatch(f"input {i} gets no gradient on some rank, reference has one")
            continue
        got = assemble(got_locals, _grad_layout(s, i), tuple(ref_g.shape), mesh, False, f"grad of input {i}")
        _close(got, ref_g, False, f"gradient of input {i} (layout {s.inputs[i]})")


def _piece_cot(g: torch.Tensor, layout: Layout, mesh: MeshSpec, c) -> torch.Tensor:
    """The local cotangent of an output: its region for Shard, the whole for Replicate and Partial (the
    gradient of a Partial value is the full gradient on every rank)."""
    plain = Layout(tuple(Replicate() if isinstance(p, Partial) else p for p in layout))
    return _piece(g, plain, mesh, c).clone()


def _grad_layout(s: Strategy, i: int) -> Layout:
    """How the local gradients of input i assemble: a Partial input gets the full gradient (Replicate); a
    Replicate input of a computation split over an axis gets partial sums there, which the edge's
    `grad_all_reduce` (emitted by the rewriter from `grad_partial_axes`) turns into the full gradient, so it is
    Replicate too; a Shard input gets its shard of the gradient."""
    return Layout(tuple(Replicate() if isinstance(p, Partial) else p for p in s.inputs[i]))


def assemble_shapes(locals_: dict, layout: Layout, shape: tuple[int, ...], mesh: MeshSpec) -> None:
    plain = Layout(tuple(Replicate() if isinstance(p, Partial) else p for p in layout))
    for c, v in locals_.items():
        want = local_region(shape, plain, mesh, c)[1]
        if tuple(v.shape) != tuple(want):
            raise Mismatch(f"rank at {c}: shape {tuple(v.shape)}, layout {layout} wants {want}")
