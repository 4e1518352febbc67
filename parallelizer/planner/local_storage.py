"""Bytes each op keeps for backward ON A RANK under a plan's chosen strategies: storages as the rank's program has
them, not as the global graph has them (round 24, r24d; RESULTS.md "Round 24 (r24d)").

`cost_model.memory.saved_tensor_owners` charges each saved storage once, to its first saver, with storages found by
following views in the GLOBAL traced graph (global shapes and strides). A rank runs the same ATen ops on its local
shards, and which storage a saved tensor keeps alive can differ there:

1. *view or copy*: reshape / flatten / unflatten / contiguous / reshape_as are views exactly when torch can view the
   SOURCE'S strides (at::computeStride), and the local source has other sizes: GQA's repeat_kv
   (k[:, :, None].expand(B, kv, n_rep, S, D).reshape(B, kv * n_rep, S, D)) copies globally but is a view on a rank
   holding ONE kv head (a size-1 dim merges with the stride-0 one): attention keeps the unexpanded k, n_rep times
   fewer bytes; the reverse (a view globally, a copy locally) alike;
2. *a redistribution makes a storage*: a consumer that receives a value in another layout than its producer's
   (all-gather, all-to-all, reduce-scatter, local slice, `core.redistribute.edge_steps`) keeps the collective's output,
   a storage of its own, shared only with the consumers that take the same redistribution (`shared_uses`: one per
   value, target layout, gradient axes and epoch); globally both savers keep one storage (the tp=4 Llama's k / v
   projections reading the RMSNorm output as S(2) while q_proj gathers it to R: 32 KiB per layer per rank unpriced);
3. *local strides*: a non-view op's output is laid out as the global one (dense in the global stride order, as
   TensorIterator orders its output by its inputs'; SDPA's (B, S, H, D) layout), so the checks of 1 on later views
   read the rank's strides.

`local_saved_bytes` replays the graph once, in graph order, on meta tensors of local shapes (no data): a view op runs
on the local values with its size argument localised (torch decides view or copy; a storage is the meta tensor's
storage), any other op makes fresh dense outputs; then each op's saved slots (`cost_model.memory.saved_slots`) are
charged their whole local storage if no earlier saver holds it (parameters, buffers and their redistributed copies to
nobody, as the global rule). It needs every node's strategy, so it prices a PLAN (`api.to_plan`'s activations, a
pipeline stage's `segments.price_segments` and `pipeline_memory.pipeline_rank_memory`); the ILP's per-strategy memory
row keeps the global storages (`Pricer.node_cost`), which cannot see another node's choice, and is corrected from
replays of the plans it picks (`memory_fit.solve_fitting`, round 25).
"""
from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from cost_model._fx import node_values, tensor_nbytes, tensors_in
from cost_model.compute import is_free_op, is_identity_dropout
from cost_model.memory import SavedShare, saved_activation_bytes, saved_slots

from ..core.layout import Layout, local_shape
from ..core.redistribute import grad_partial_axes
from ..tracer import TracedGraph
from .costs import Pricer, _vocab_parallel_saved_bytes
from .shared_uses import use_epochs
from .strategies import NodeSpace, Strategy, tensor_inputs

__all__ = ["StorageSpan", "local_saved_bytes", "plan_choice"]

aten = torch.ops.aten
_META = torch.device("meta")
_SIZE_ARG_OPS = {aten.view, aten.reshape, aten._unsafe_view, aten.expand}  # size argument 1: the output shape
_FOLDING = {aten.matmul.default, aten.linear.default, aten.einsum.default}  # composites whose autograd keeps
# reshaped (permuted) operands


def local_saved_bytes(tg: TracedGraph, strategy_of: Mapping[str, Strategy], spaces: Mapping[str, NodeSpace],
                      pricer: Pricer, spans: list[StorageSpan] | None = None) -> dict[str, int]:
    """{op node name: bytes it keeps for backward on the largest rank (rank 0's shards, as `core.layout.local_shape`)}
    for the strategies `strategy_of` (every placeholder and op node of `tg`), each local storage charged once, whole,
    to its first saver in graph order (module docstring). Ops whose backward does not run are 0.

    Args:
        tg: the traced graph (a pipeline stage's own graph for a stage: received values are its placeholders).
        strategy_of: node name -> its chosen Strategy (`Plan.nodes` parsed, or the ILP's choice).
        spaces: node name -> its NodeSpace (inputs, requires_grad), for the price of an op the replay cannot run.
        pricer: the plan's Pricer (mesh, priced dtypes, which args require grad).
        spans: a list to extend with one `StorageSpan` per local storage the forward makes (every op output, a
            redistributed or autocast copy; not the parameters' and buffers' own), for the forward's timeline
            (`planner.peak.step_peak`, round 26); None: not collected.
    Returns:
        Bytes per op node (ints >= 0); the sum is the rank's saved activations for one (micro)batch.
    """
    mesh = pricer.mesh
    resident_names = {ph for p in tg.parameters.values() for ph in p.placeholders}
    live = pricer.backward_nodes(tg)
    epochs = use_epochs(tg)
    values: dict[str, Any] = {}
    resident: set[int] = set()      # storages of parameters and buffers (and copies made of them)
    owned: dict[int, None] = {}     # storages charged to an earlier saver (in the order charged)
    span_of: dict[int, list] = {}   # storage -> [bytes, first node, last node, saver]: `StorageSpan`
    moved: dict[tuple, torch.Tensor] = {}  # one redistributed copy per (value, layout, gradient axes, epoch)
    held: list[torch.Tensor] = []   # keeps every meta storage alive, so no storage id is reused
    out: dict[str, int] = {}

    def received(node: str, k: int, producer: str, want: Layout, shape, dtype) -> torch.Tensor:
        have, src = strategy_of[producer].output, values.get(producer)
        dtype = pricer.value_dtype(tg, producer, dtype)  # as run (under the autocast recipe: its dtypes)
        if isinstance(src, torch.Tensor) and (have == want or not _moves(pricer, have, want, shape, dtype)):
            return src
        out_layout = strategy_of[node].output  # None: the output node (its redistributions carry no gradient axes)
        axes = grad_partial_axes(want, out_layout, mesh) if out_layout is not None else ()
        key = (producer, str(want), axes, epochs.get(node, 0))
        if key not in moved:
            t = torch.empty(local_shape(shape, want, mesh), dtype=dtype, device=_META)
            if producer in resident_names or (isinstance(src, torch.Tensor) and _key(src) in resident):
                resident.add(_key(t))
            moved[key] = t
            held.append(t)
        return moved[key]

    for node in tg.graph_module.graph.nodes:
        name, s = node.name, strategy_of.get(node.name)
        if node.op == "output" and s is not None and spans is not None:
            for k, ti in enumerate(spaces[name].inputs):  # the returned values, brought to the output's layouts
                src = values.get(ti.producer)
                if isinstance(src, torch.Tensor):
                    _returned(span_of, src, received(name, k, ti.producer, s.inputs[k], ti.shape, ti.dtype))
            continue
        if s is None or node.op not in ("placeholder", "call_function") or s.output is None:
            continue
        info = tg.nodes[name]
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                values[name] = _dense(val, local_shape(tuple(val.shape), s.output, mesh),
                                      pricer.value_dtype(tg, name, val.dtype))
                held.append(values[name])
                if name in resident_names:
                    resident.add(_key(values[name]))
            continue
        if node.target is operator.getitem:
            src = values.get(node.args[0].name) if isinstance(node.args[0], torch.fx.Node) else None
            if isinstance(src, (list, tuple)) and isinstance(src[node.args[1]], torch.Tensor):
                values[name] = src[node.args[1]]
            continue
        space = spaces[name]
        it = iter(enumerate(space.inputs))
        ac = pricer.node_dtypes(tg, name)
        casts = {k: d for k, d in enumerate(ac.inputs) if k in ac.casts} if ac is not None else {}

        def local_arg(n: torch.fx.Node) -> torch.Tensor:
            k, ti = next(it)
            got = received(name, k, ti.producer, s.inputs[k], ti.shape, ti.dtype)
            if k in casts:
                copy = got.to(casts[k])  # autocast's copy for this op: a storage of its own (a weight's: resident)
                if _key(got) in resident:
                    resident.add(_key(copy))
                held.append(copy)
                got = copy
            if spans is not None and not (ti.producer in resident_names and got is values.get(ti.producer)):
                _touch(span_of, got, name)  # a parameter's or buffer's own storage is resident, not a span
            return got

        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), local_arg)
        args, kwargs = _on_meta(tuple(args)), _on_meta(dict(kwargs))
        result = _local_output(node, info, s, args, kwargs, pricer, pricer.out_dtypes(tg, info))
        values[name] = result
        held.extend(tensors_in(result))
        if spans is not None:
            for t in tensors_in(result):
                _touch(span_of, t, name)
        if name in live and space.requires_grad:
            before = len(owned)
            out[name] = _saved_here(tg, node, space, s, args, kwargs, result, pricer, resident, owned, resident_names,
                                    held)
            for key in itertools.islice(reversed(owned), len(owned) - before):
                if key in span_of and span_of[key][3] is None:
                    span_of[key][3] = name
    if spans is not None:
        spans.extend(StorageSpan(*v) for v in span_of.values())
    return out


@dataclass(frozen=True, slots=True)
class StorageSpan:
    """A local storage of the forward (`local_saved_bytes(spans=)`): `nbytes`, the node that makes it (`first`: its
    op, or the first reader of a redistributed / autocast copy), the last node that reads it in forward (`last`), and
    the op that saves it for backward (`saver`, None when no op does: it is freed after `last`)."""

    nbytes: int
    first: str
    last: str
    saver: str | None


def _touch(span_of: dict[int, list], t: torch.Tensor, name: str) -> None:
    """Extend `t`'s storage span to node `name` (a new span from it when the storage is new)."""
    key = _key(t)
    if key in span_of:
        span_of[key][2] = name
    else:
        span_of[key] = [t.untyped_storage().nbytes(), name, name, None]


def _returned(span_of: dict[int, list], src: torch.Tensor, got: torch.Tensor) -> None:
    """The spans of a returned value (the output node's input `src`, delivered as `got`): the delivered value is
    resident for the whole step (`problem.returned_bytes`, in the peak's resident bytes), so a storage returned as
    made is no forward span (it was counted twice, round 26); one the output redistributes (a batch-sharded
    logits gathered whole: `rewriter.apply._output`, outside any call_function) stays alive until that collective,
    and a gather holds a second whole copy while it runs (`StorageSpan` at "output"; round 27, r27e)."""
    if got is src:
        if _key(src) in span_of and span_of[_key(src)][0] == tensor_nbytes(src):
            del span_of[_key(src)]
        return
    _touch(span_of, src, "output")
    if tensor_nbytes(got) > tensor_nbytes(src):  # a gather: gloo's all-gather receives into a flat buffer of its own
        span_of[("output", len(span_of))] = [tensor_nbytes(got), "output", "output", None]


def _saved_here(tg, node, space, s, args, kwargs, result, pricer, resident, owned, resident_names, held) -> int:
    """The op's saved bytes on local values: each saved slot's whole storage if no earlier saver holds it. `held`
    keeps the tensors made here alive (a storage id is its address: a freed one could be reused)."""
    name = node.name
    grads = pricer.grad_args(tg, name)
    params = tuple(i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node) and a.name in resident_names)
    try:
        if node.target in _FOLDING:
            live = pricer.backward_nodes(tg)
            return _autograd_saved(node.target, args, kwargs, lambda a: isinstance(a, torch.fx.Node) and a.name in live,
                                   node.args, resident, owned, held)
        arg_slots, out_slots = saved_slots(node.target, args, kwargs, result, grads)
        factors: dict[str, list[tuple[int, float]]] = {"args": [], "outputs": []}
        outputs = tensors_in(result)
        slots = [("args", i, tensors_in(args[i])) for i in arg_slots if i not in params and i < len(args)]
        slots += [("outputs", i, [outputs[i]]) for i in out_slots if i < len(outputs)]
        for kind, i, tensors in slots:
            whole = sum(tensor_nbytes(t) for t in tensors)
            factor = _charge(tensors, resident, owned) / whole if whole else 1.0
            if factor != 1.0:
                factors[kind].append((i, factor))
        share = SavedShare(tuple(factors["args"]), tuple(factors["outputs"]))
        saved = saved_activation_bytes(node.target, args, kwargs, result, param_args=params, share=share,
                                       grad_args=grads)
    except Exception:  # noqa: BLE001 -- an op the replay cannot price on local values: the per-strategy price
        return pricer.node_cost(tg, tg.nodes[name], space, s).saved_bytes
    in_local = [local_shape(ti.shape, L, pricer.mesh) for ti, L in zip(space.inputs, s.inputs)]
    itemsize = pricer.in_dtypes(tg, tg.nodes[name], space)[0].itemsize if space.inputs else 4
    return saved + _vocab_parallel_saved_bytes(tg.nodes[name], s, in_local, itemsize)


def _autograd_saved(target, args: tuple, kwargs: dict, needs_grad, graph_args: tuple, resident: set[int],
                    owned: dict[int, None], held: list[torch.Tensor]) -> int:
    """Bytes of the storages a composite op's autograd keeps, found by running it on the local meta values under
    `saved_tensors_hooks`, each value requiring grad as its fx node in `graph_args` does (`needs_grad(node)`; an
    einsum's operands one by one): matmul / linear / einsum keep the FOLDED operands their decomposition hands to
    mm / bmm (`tensor.expand(batch + (n, m)).reshape(b, n, m)`, ATen's _matmul_impl; einsum's permutes), a view
    of the argument or a copy by its local strides (a repeat_kv'd k with stride 0 on its one local KV head is copied
    there, not in the global graph), and only those whose partner requires grad (round 27)."""
    saved: list[torch.Tensor] = []

    def leaf(a, n):
        if isinstance(a, (list, tuple)) and isinstance(n, (list, tuple)) and len(a) == len(n):
            return type(a)(leaf(x, m) for x, m in zip(a, n))
        if isinstance(a, torch.Tensor):
            return a.detach().requires_grad_(bool(needs_grad(n)) and a.is_floating_point())
        return a

    ins = [leaf(a, n) for a, n in zip(args, graph_args)]
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        target(*ins, **kwargs)
    held.extend(saved)
    return _charge(saved, resident, owned)


def _charge(tensors, resident: set[int], owned: dict[int, None]) -> int:
    """Bytes of the whole storages of `tensors` not resident nor charged before; marks them charged."""
    charged = 0
    for t in tensors:
        key = _key(t)
        if key not in resident and key not in owned:
            owned[key] = None
            charged += t.untyped_storage().nbytes()
    return charged


def _local_output(node: torch.fx.Node, info, s: Strategy, args: tuple, kwargs: dict, pricer: Pricer,
                  dtypes: list[torch.dtype]) -> Any:
    """The op's local output: a view op run on the local values (its size argument localised; torch decides view or
    copy from the local strides), an identity dropout its input, any other op fresh dense tensors laid out as the
    global output (`_dense`) in `dtypes` (each output's dtype as run, `Pricer.out_dtypes`)."""
    target, mesh = node.target, pricer.mesh
    shapes = [local_shape(tuple(o.shape), s.output, mesh) for o in info.outputs]
    gvals = tensors_in(node.meta.get("val"))
    inputs = tensors_in(args)
    single = not isinstance(node.meta.get("val"), (tuple, list))
    if inputs and isinstance(target, torch._ops.OpOverload) and is_identity_dropout(target, args, kwargs):
        return inputs[0]
    if inputs and isinstance(target, torch._ops.OpOverload) and target.is_view and len(gvals) == len(shapes):
        try:
            res = target(*_localised(target, args, shapes), **kwargs)
            if [tuple(t.shape) for t in tensors_in(res)] == shapes:
                return res
        except Exception:  # noqa: BLE001 -- a view whose other arguments read global sizes (slice of a sharded dim)
            pass
        gargs, gkw, gout = node_values(node)
        if single and is_free_op(target, gargs, gout, gkw) and inputs[0].dtype == dtypes[0]:
            base = inputs[0]  # a view as in the global graph, of the local source's storage
            return base.as_strided(shapes[0], _dense(gvals[0], shapes[0], base.dtype).stride(), base.storage_offset())
    fresh = [_dense(g, shape, d) for g, shape, d in zip(gvals, shapes, dtypes)]
    return fresh[0] if single and fresh else fresh


def _localised(target: torch._ops.OpOverload, args: tuple, shapes: list) -> tuple:
    """`args` with the size argument of a view op set to its local output shape (`rewriter.localize.SIZE_ARG`)."""
    if target.overloadpacket in _SIZE_ARG_OPS and len(args) > 1:
        return (args[0], list(shapes[0])) + args[2:]
    if target is aten.unflatten.int and len(args) > 2:
        dim = args[1] % args[0].dim()
        return (args[0], args[1], list(shapes[0][dim:dim + len(args[2])])) + args[3:]
    return args


def _dense(like: torch.Tensor, shape, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of `shape` laid out densely in `like`'s stride order (outer to inner by decreasing stride)."""
    order = sorted(range(len(shape)), key=lambda d: (-like.stride()[d], d)) if like.dim() == len(shape) else \
        list(range(len(shape)))
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= max(int(shape[d]), 1)
    return torch.empty_strided(tuple(shape), tuple(strides), dtype=dtype, device=_META)


def _moves(pricer: Pricer, have: Layout, want: Layout, shape, dtype) -> bool:
    """Whether the rewriter emits a step between the two layouts (`Pricer.steps`; an impossible change counts)."""
    try:
        return bool(pricer.steps(have, want, tuple(shape), dtype, (), False))
    except Exception:  # noqa: BLE001 -- ImpossibleRedistributionError: the plan cannot hold it; a copy
        return True


def _on_meta(tree: Any) -> Any:
    """Device arguments set to meta (an op naming the cpu would copy out of a meta tensor: `cost_model._fx.to_meta`)."""
    if isinstance(tree, dict):
        return {k: _META if k == "device" and v is not None else _on_meta(v) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_on_meta(v) for v in tree)
    return _META if isinstance(tree, torch.device) else tree


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def plan_choice(tg: TracedGraph, nodes: Mapping, live: frozenset[str]) -> tuple[dict[str, Strategy],
                                                                               dict[str, NodeSpace]]:
    """(strategy per node, one-strategy NodeSpace per op node) of a Plan's `nodes` (`NodePlan`: layout strings) for
    the nodes of `tg` (a pipeline stage's graph: its received values are placeholders named as their producers);
    `live`: the nodes whose backward runs (`Pricer.backward_nodes` of the whole traced graph)."""
    strategy_of, spaces = {}, {}
    for name, info in tg.nodes.items():
        if name not in nodes or info.node.op not in ("placeholder", "call_function"):
            continue
        plan_node = nodes[name]
        out = None if plan_node.output is None else Layout.parse(plan_node.output)
        strategy_of[name] = Strategy(tuple(Layout.parse(x) for x in plan_node.inputs), out)
        if info.node.op == "call_function":
            spaces[name] = NodeSpace(name, "op", tensor_inputs(tg, info), [strategy_of[name]], name in live)
    return strategy_of, spaces
