"""Kinks crossed by rounding: why a right float32 program may differ from one device by a whole gradient.

A kink is a point where an op's gradient jumps: ReLU at 0 (threshold), a clamp's bounds (clamp, hardtanh), `abs`
at 0, `maximum` / `minimum` of two equal values, a comparison that a `where` reads (gt, lt, ge, le), and the
selection of max-pool, `max` / `min` over a dim, argmax / argmin, sort / topk between tied values. Two float32
computations of the same function (one device's kernels, the plan's program with another summation order) land
within rounding of each other, and an element within rounding of a kink may land on different sides: its WHOLE
gradient is then kept on one side and dropped on the other (or routed to another element), which no bound
derived from rounding covers (ResNet pp=2 x dp=2, round 21: one element of 32,768 after a ReLU, 16% of that
block's largest gradient, ratio 561, while the plan replayed in float64 equals the float64 model at 1e-13).

`locate` finds such elements on one rank: it runs the plan's float32 program (this rank's, `ParallelModule`)
and the traced graph on one device (float32, the same weights and inputs) once forward, records every kink op's
inputs and outputs in both, and counts the elements where the two take different sides of the kink (`_SIDES`)
while the op's continuous value agrees within float32's tolerance (torch.testing's rtol 1.3e-6, atol 1e-5: a
tie or a value at the kink, not a different value). The rehearsal calls it only when the float32 comparison
failed and the SAME plan replayed in float64 equals the float64 model (`runtime.replay64`: a wrong program,
missing or doubled term stays as far off there), and then judges "match" naming the elements (op, node,
count, the two float32 values) in the report; without such an element the DIFFER stands.
"""
from __future__ import annotations

import contextlib
import copy

import torch

from ..rewriter.apply import AsEmitted
from ..rewriter.spec import ShardingSpec
from ..rewriter.state import shard_tensor
from .tolerance import tolerances

_UNREADABLE = (RuntimeError, TypeError, ValueError, KeyError, IndexError, StopIteration)
"""What running the traced graph on one device may raise here (`locate`): then no crossing is reported."""

# op name (the overload packet's) -> how its side of the kink is read (`_crossed`)
_SIDES = {
    "relu": "threshold", "threshold": "threshold", "hardtanh": "clamp", "clamp": "clamp", "clamp_min": "clamp",
    "clamp_max": "clamp", "abs": "sign", "maximum": "pick", "minimum": "pick", "fmax": "pick", "fmin": "pick",
    "gt": "compare", "lt": "compare", "ge": "compare", "le": "compare",
    "max_pool1d_with_indices": "select", "max_pool2d_with_indices": "select", "max_pool3d_with_indices": "select",
    "max": "select", "min": "select", "sort": "select", "topk": "select", "argmax": "index", "argmin": "index",
}


def kink_op(node: torch.fx.Node) -> str | None:
    """The op name of `node` when it is a kink op (`_SIDES`; `max` / `min` only over a dim: with indices), else None."""
    if node.op != "call_function":
        return None
    name = getattr(getattr(node.target, "overloadpacket", None), "__name__", None)
    if name in ("max", "min") and "dim" not in str(node.target):
        return None
    return name if name in _SIDES else None


class _Recorder(AsEmitted):
    """Runs a graph and keeps (args, output) of every kink op (`kink_op`) by the traced node it stands for (a
    rank program's node names its traced node in `meta["source"]`, `rewriter.apply`), detached."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.seen: dict[str, tuple] = {}

    def run_node(self, n: torch.fx.Node):
        out = super().run_node(n)
        if kink_op(n):
            args, _ = self.fetch_args_kwargs_from_env(n)
            self.seen[n.meta.get("source", n.name)] = (n, _detached(args), _detached(out))
        return out


def _detached(tree):
    return torch.utils._pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Elementwise: a and b agree within `dtype`'s tolerance (torch.testing's rtol, atol)."""
    rtol, atol = tolerances(dtype)
    a, b = torch.broadcast_tensors(a.double(), b.double())
    return (a - b).abs() <= atol + rtol * b.abs()


def _crossed(op: str, mine: tuple, ref: tuple, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask over the op's output (this rank's shard): the two runs took different sides of the kink while
    the op's INPUTS agree within `dtype`'s tolerance (so both lie within it of the kink: a value at the kink, or a
    tie between the values a selection picks from); an input of another value on the other side (a wrong sign,
    another maximum) is never a crossing. `mine` / `ref`: (args, output) of the plan's program and of one
    device, the reference sharded as the plan holds it."""
    (a, out), (ra, rout) = mine, ref
    kind = _SIDES[op]
    near = _close(a[0], ra[0], dtype)
    if kind == "threshold":
        level = a[1] if op == "threshold" else 0
        return ((a[0] > level) != (ra[0] > level)) & near
    if kind == "clamp":
        lo, hi = (a[1] if len(a) > 1 else None), (a[2] if len(a) > 2 else None)
        if op == "hardtanh":
            lo, hi = (a[1] if len(a) > 1 else -1.0), (a[2] if len(a) > 2 else 1.0)
        if op == "clamp_max":
            lo, hi = None, a[1]

        def side(x):
            s = torch.zeros_like(x, dtype=torch.int8)
            s = s + (x < lo).to(torch.int8) if lo is not None else s
            return s + 2 * (x > hi).to(torch.int8) if hi is not None else s
        return (side(a[0]) != side(ra[0])) & near
    if kind == "sign":
        return ((a[0] >= 0) != (ra[0] >= 0)) & near
    if kind in ("pick", "compare"):  # both operands agree (the second may be a number)
        both = near & _close(a[1], ra[1], dtype) if isinstance(a[1], torch.Tensor) else near
        sides = (a[0] > a[1]) != (ra[0] > ra[1]) if kind == "pick" else out != rout
        return sides & both
    # selections: another index picked, where the values at both indices tie in both runs' inputs
    idx, ridx = (out[1], rout[1]) if kind == "select" else (out, rout)
    at = _selected(op, a, idx.shape)
    tie = (_close(at(a[0], idx), at(a[0], ridx), dtype) & _close(at(ra[0], idx), at(ra[0], ridx), dtype)
           & _close(at(a[0], idx), at(ra[0], idx), dtype))
    return (idx != ridx).reshape(tie.shape) & tie


def _selected(op: str, args: tuple, shape: torch.Size):
    """`at(x, idx)`: the values of input x at a selection op's indices `idx` (of `shape`), for max / min over a
    dim, sort / topk (along their dim), argmax / argmin (a dim or the flattened input) and max-pool (indices
    into the flattened pooled dims, 1 to 3 of them)."""
    if op.startswith("max_pool"):
        pooled = int(op[len("max_pool")])

        def at(x, idx):
            return x.flatten(-pooled).gather(-1, idx.flatten(-pooled)).reshape(shape)
        return at
    if op in ("argmax", "argmin") and (len(args) < 2 or args[1] is None):
        return lambda x, idx: x.flatten()[idx]
    dim = args[2] if op == "topk" and len(args) > 2 else args[1] if op != "topk" and len(args) > 1 else -1
    keep = op in ("sort", "topk") or (len(args) > 2 and bool(args[2]))

    def at(x, idx):
        return x.gather(dim, idx if keep else idx.unsqueeze(dim)).reshape(shape)
    return at


def _graph_args(traced, model: torch.nn.Module, inputs: tuple, kwargs: dict) -> list:
    """The placeholders' values of `traced.graph_module` for `model(*inputs, **kwargs)` on one device: each
    parameter / buffer / lifted constant by its FQN, then the user inputs (`TracedGraph.tensor_inputs`)."""
    owner = {ph: p for p in traced.parameters.values() for ph in p.placeholders}
    constants = traced.constant_values()
    state = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    user = iter(traced.tensor_inputs(inputs, kwargs))
    args = []
    for node in traced.graph_module.graph.find_nodes(op="placeholder"):
        p = owner.get(node.name)
        args.append(next(user) if p is None else constants[p.fqn] if p.is_constant else state[p.fqn])
    return args


def locate(rank: int, model_fn, model_kwargs: dict, spec: ShardingSpec, traced) -> list[tuple]:
    """This rank's kink crossings at the first forward (module docstring): (node, op, count, plan value, one
    device's value) per kink node with at least one crossed element, the values at the first such element; an
    element replicated over a mesh axis is counted on the rank at coordinate 0 of that axis only, so the counts
    add up over ranks. Collective: every rank of `spec`'s mesh calls it (the program's collectives run)."""
    from .module import ParallelModule

    torch.manual_seed(0)
    model, inputs, *rest = model_fn(**model_kwargs)
    kwargs = rest[0] if rest else {}
    reference = copy.deepcopy(model)
    pm = ParallelModule(traced, spec, rank, model)
    with torch.no_grad():
        mine = _Recorder(pm.program.graph_module)
        mine.run(*pm._state(), *traced.tensor_inputs(copy.deepcopy(inputs), copy.deepcopy(kwargs)))
        try:  # no collective from here: every rank fails alike (the same graph and inputs), the DIFFER stands
            ref = _Recorder(traced.graph_module)
            ref.run(*_graph_args(traced, reference, copy.deepcopy(inputs), copy.deepcopy(kwargs)))
        except _UNREADABLE:
            return []
    return _compare(mine.seen, ref.seen, spec, pm.coords)


def locate_pipeline(model_fn, model_kwargs: dict, spec: ShardingSpec, pipe: dict) -> list[tuple]:
    """`locate` for a pipeline plan (`runtime.pipeline_rehearsal`): one float32 step of the plan, each of this
    rank's stage programs recorded per call (call j: microbatch j, the order every schedule runs a stage's
    forwards in), against the traced microbatch graph run on one device on microbatch j (the reference the
    pipeline rehearsal accumulates). A stage whose program ran another number of times than there are
    microbatches (recomputation) is not read. Collective: every rank of the plan calls it."""
    from torch.utils import _pytree as pytree

    from .pipeline_rehearsal import _weighting, pipeline_run

    torch.manual_seed(0)
    model, inputs, *rest = model_fn(**model_kwargs)
    kwargs, m = (rest[0] if rest else {}), pipe["microbatches"]
    reference = copy.deepcopy(model)
    run, traced, flat, _ = pipeline_run(model, tuple(inputs), kwargs, spec, pipe)
    calls = {}
    for s in run.stages:
        gm, record = s._returning().graph_module, calls.setdefault(id(s), [])

        def forward(*args, gm=gm, record=record):
            recorder = _Recorder(gm)
            out = recorder.run(*args)
            record.append(recorder.seen)
            return out
        gm.forward = forward  # this step only (removed below)
    try:
        target, count, _ = _weighting(traced, flat, m, model)
        run.step(*flat, target=target, item_count=count)
    finally:
        for s in run.stages:
            del s._returning().graph_module.forward
    found = []
    with torch.no_grad(), contextlib.suppress(*_UNREADABLE):  # no collective here: a failure leaves the DIFFER
        for j in range(m):
            args, kw = pytree.tree_map(lambda t: t.tensor_split(m)[j] if isinstance(t, torch.Tensor) else t,
                                       (tuple(inputs), kwargs))
            ref = _Recorder(traced.graph_module)
            ref.run(*_graph_args(traced, reference, args, kw))
            for s in run.stages:
                if len(calls[id(s)]) == m:
                    found += [(f"{name} (microbatch {j})", *rest)
                              for name, *rest in _compare(calls[id(s)][j], ref.seen, s.spec, s.coords)]
    return found


def _compare(mine: dict, ref: dict, spec: ShardingSpec, coords: tuple[int, ...]) -> list[tuple]:
    """(node, op, count, plan value, one device's value) of each kink node recorded in both runs (`_Recorder.seen`)
    with crossed elements (`_crossed`), one device's values sharded as the plan holds them at `coords`."""
    found = []
    for name, (node, args, out) in sorted(mine.items()):
        layouts = spec.nodes.get(name)
        if name not in ref or layouts is None or any(p.is_partial() for p in layouts.output.placements):
            continue
        op = kink_op(node)
        _, rargs, rout = ref[name]
        positions = [i for i, x in enumerate(node.args) if isinstance(x, torch.fx.Node)]
        try:
            rargs = list(rargs)
            for k, i in enumerate(positions):  # each tensor argument as this rank holds it (its use layout)
                if isinstance(rargs[i], torch.Tensor) and k < len(layouts.inputs):
                    rargs[i] = shard_tensor(rargs[i], layouts.inputs[k], spec.mesh, coords)
            rout = torch.utils._pytree.tree_map(
                lambda t: shard_tensor(t, layouts.output, spec.mesh, coords) if isinstance(t, torch.Tensor) else t,
                rout)
            dtype = next(t.dtype for t in torch.utils._pytree.tree_leaves(args) if isinstance(t, torch.Tensor)
                         and t.is_floating_point())
            mask = _crossed(op, (args, out), (tuple(rargs), rout), dtype)
        except _UNREADABLE:  # a layout or shape this check cannot read
            continue
        owner = all(c == 0 for c, p in zip(coords, layouts.output.placements) if not p.is_shard())
        count = int(mask.sum().item()) if owner else 0
        if count:
            first = mask.nonzero()[0].tolist()
            value = lambda t: float((t[0] if isinstance(t, tuple) else t).double()[tuple(first)])  # noqa: E731
            found.append((name, f"{op} ({node.target})", count, value(out), value(rout)))
    return found


def first_step_grads_outside(result: dict) -> bool:
    """Whether this rank's gradients of the FIRST step (the step whose forward `locate` reads) are outside their
    bound: where a kink crossed at that forward acts. A rehearsal compares the first step's gradients
    (`result["grad"]`); a pipeline rehearsal every step's, naming the step of the largest |diff|, which must be 0.
    Without it the difference enters later (the optimizer's step, a later forward) and is not laid to the kinks:
    the float64 replay checks one forward and backward, not the steps (a wrong ZeRO-1 update would differ only
    in the parameters after the steps)."""
    _, name, ratio = result["grad"]
    return ratio > 1 and ("(step " not in name or name.endswith("(step 0)"))


def kinks_note(results: list[dict]) -> str:
    """The report's evidence of the crossings over every rank (`locate` per rank, in `results[i]["kinks"]`):
    '' when none, or when no rank's first-step gradients are outside their bound (`first_step_grads_outside`).
    Counts add over ranks; the values are the first rank's that found the node."""
    if not any(first_step_grads_outside(r) for r in results if "grad" in r):
        return ""
    by_node: dict[str, list] = {}
    for r in results:
        for name, op, count, plan_value, ref_value in r.get("kinks") or ():
            if name in by_node:
                by_node[name][1] += count
            else:
                by_node[name] = [op, count, plan_value, ref_value]
    if not by_node:
        return ""
    total = sum(v[1] for v in by_node.values())
    where = "; ".join(f"{op} at node {name}: {count} (plan {pv:.3g}, one device {rv:.3g})"
                      for name, (op, count, pv, rv) in sorted(by_node.items())[:4])
    return (f"{total} element(s) crossed a kink by rounding ({where}{'; ...' if len(by_node) > 4 else ''}): the "
            "plan's float32 value and one device's agree within float32's tolerance but lie on different sides of "
            "the op's kink, so that element's whole gradient is kept on one side and dropped (or sent to another "
            "element) on the other; the same plan replayed in float64 equals the float64 model, so the program is "
            "right (runtime/kinks.py)")
