"""The memory peak of one training step on a rank, as a timeline of its backward, not a sum of kinds (round 25, r25c).

`Plan.cost.memory_bytes` lists what a rank holds by kind (params, grads, optimizer, activations, outputs, buffers) and
their sum, "total". The sum adds every parameter gradient to every saved activation, and leaves out what the step
holds only for a while. Neither is how memory behaves: autograd frees an op's saved tensors when that op's backward
has run, and makes a parameter's gradient when the backward reaches the parameter's last use; so the saved
activations shrink while the gradients grow (Round 24 (lead): a 1.02 B GPT on one H200 peaked at 21.24 GB where the
sum said 23.89 GB). On the other hand the step holds, beside them, the gradients of activations flowing back (the
logits' gradient at the loss's backward), the parameters FSDP gathers again in backward and their unsharded
gradients before the reduce-scatter, and the gradient buckets of DDP (`rewriter.grad_sync`: a kept flat buffer per
bucket, plus the partial gradients of the open bucket), which the sum did not count at all (round 25: 2-rank GPT-2
plans measured 4-33% above the sum).

`step_peak` walks the backward in reverse graph order. At the backward of op node i (position i in graph order):

    live(i) = resident + acts(i) + grads(i) + pending(i) + act_grads(i) + gathered(i)
    resident   = params + optimizer + buffers + returned outputs + DDP's kept bucket buffers (one copy of the
                 gradients bucketed: `rewriter.grad_sync` keeps them from one step to the next)
    acts(i)    = sum of saved[j] for j <= i (each storage charged to its first saver, which is the last of its
                 savers to run backward, `local_storage.local_saved_bytes`), with a recomputed region's saving
                 (`RegionPrice.saved_delta_bytes`, <= 0) applied from the position after its last node: inside the
                 region its activations are made again
    grads(i)   = gradient bytes of every trained parameter (not bucketed) whose last use is at or after i
    pending(i) = bucketed gradients made but not yet flattened into a bucket: the first bucket is flattened at
                 `FIRST_BUCKET_BYTES`, each next one at `bucket_bytes` (`rewriter.grad_sync.bucket_sizes`)
    act_grads(i) = the gradient of every value v whose producer is at or before i and some consumer at or after i
                 (made at its last consumer's backward, freed after its producer's), local bytes of v (none when
                 every consumer is a sum, `_EXPANDED_GRAD`); plus, at the
                 backward of a composite op kept whole, the gradients inside it (`_BACKWARD_SCRATCH`)
    gathered(i)= per value the program gathers from a parameter's shard (one per (parameter, use layout): ZeRO-3 /
                 FSDP): its full copy when the program gathers it again in backward (`rewriter.reshard`), from the
                 backward of its last reader in graph order (the first to run; readers: the ops that may read it in
                 backward, `rewriter.reshard.backward_readers`) through the backward of its first, after which
                 autograd frees it (r26c; it stayed whole to the end of backward before); and its unsharded
                 gradient from its last use's backward to its first use's (then the reduce-scatter)

and after the backward, at the optimizer step: resident + all gradients + the AdamW
step's temporaries (`adamw_temporary_bytes`).
The forward is walked too (round 26, r26d): at op node i of the forward

    fwd(i) = resident + acts(i) + alive(i)
    alive(i) = every local storage the forward made (an op's output, a redistributed or autocast copy, a gathered
               FSDP parameter: `local_storage.StorageSpan`) from the node that makes it to its last reader in forward,
               up to (not including) the op that saves it for backward, from which acts(i) counts it

with no parameter gradient (the loop sets them to None after its step, torch's default `zero_grad`), and one moment
more at the output node (round 27, r27e): the program brings the returned values to the output's layouts there,
outside any call_function (`rewriter.apply._output`: a batch-sharded logits gathered whole), so the local value
lives until that collective, which holds a second whole copy while it runs (`local_storage._returned`); a value
returned as made is resident only (it was counted twice between its op and its last reader before). Its transients
mostly have their mirror image in backward (the gradient of the same value), but not those that carry no gradient
(integer labels, masks, a loss's per-token values, a batch-sharded loss's count and its all-reduce, values read by
sums only): round 25 (r25c) measured the activation-heavy GPT-2 ddp / fsdp plans peaking in forward at the loss, 3-9%
above the backward's walk. The peak is the largest of all these moments. Left out: buffers a kernel or a collective
allocates and frees inside one op (workspace), the copies redistributions make in backward.

Used by `api.to_plan` (`memory_bytes["peak"]`). The ILP keeps linear rows (`problem.build_problem`).
"""
from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..core.layout import Layout, local_shape
from ..core.redistribute import grad_partial_axes
from ..rewriter.grad_sync import DEFAULT_BUCKET_BYTES, bucket_sizes, runtime_buckets
from ..rewriter.reshard import backward_readers
from ..tracer import TracedGraph
from ..tracer.graph import carries_grad
from .costs import Pricer
from .local_storage import StorageSpan
from .strategies import NodeSpace, Strategy, TensorInput

__all__ = ["StepPeak", "adamw_temporary_bytes", "backward_scratch_bytes", "gather_readers", "grad_spans", "step_peak",
           "use_transients"]

def adamw_temporary_bytes(param_bytes: list[int]) -> int:
    """The most bytes torch's single-tensor Adam / AdamW step (`torch.optim.adam._single_tensor_adam`, the CPU default:
    no foreach kernels there) holds beside the state, for local parameters of `param_bytes` in the optimizer's order:
    at parameter i's `exp_avg_sq.sqrt() / bias_correction2_sqrt` the square root and the quotient (2 of its size),
    and the previous parameter's `denom`, which the loop variable keeps until it is assigned again."""
    best, prev = 0, 0
    for b in param_bytes:
        best, prev = max(best, prev + 2 * b), b
    return best

_BACKWARD_SCRATCH = {torch.ops.aten.cross_entropy_loss.default: 1}
"""Composite ops that export keeps whole, by how many tensors of their first input's local size their backward holds
beside that input's gradient: cross-entropy's backward is nll_loss_backward (a logits-sized gradient of the
log-softmax) then _log_softmax_backward_data (the logits' gradient), both alive at once (measured: the 2-rank GPT-2
tp plan peaks in _log_softmax_backward_data)."""

_EXPANDED_GRAD = {torch.ops.aten.sum.default, torch.ops.aten.sum.dim_IntList}
"""Ops whose backward returns their input's gradient as `grad.expand(input sizes)` (torch's derivatives.yaml, sum:
`self: grad.expand_symint(self.sym_sizes())`; sum.dim_IntList: `sum_backward`, unsqueeze + expand): a view of the
reduced gradient, no storage of the input's size (mean divides the expanded gradient: a full tensor)."""


@dataclass(frozen=True, slots=True)
class StepPeak:
    """The priced peak of one training step on a rank (module docstring), bytes.

    Attributes:
        peak_bytes: the largest live total over the step.
        at: where it is reached: "forward at <node>", "backward of <node>", "end of backward" or "optimizer step".
        resident_bytes: what the rank holds through the whole step (params, optimizer, buffers, returned values,
            DDP's kept buckets).
        saved_bytes, grad_bytes, transient_bytes: at the peak, the saved activations alive, the parameter
            gradients made (with the open bucket's partial gradients) and the rest (activation gradients, gathered
            parameters and their unsharded gradients, optimizer temporaries; in forward the storages alive and not
            saved).
    """

    peak_bytes: int
    at: str
    resident_bytes: int
    saved_bytes: int
    grad_bytes: int
    transient_bytes: int


def step_peak(tg: TracedGraph, strategy_of: Mapping[str, Strategy], spaces: Mapping[str, NodeSpace], pricer: Pricer,
              saved: Mapping[str, int], *, resident_bytes: int,
              recompute_deltas: Mapping[tuple[str, ...], int] | None = None,
              bucket_bytes: int = DEFAULT_BUCKET_BYTES, forward_spans: Sequence[StorageSpan] = ()) -> StepPeak:
    """The peak of one step on the largest rank (rank 0's shards, `core.layout.local_shape`) for the chosen
    strategies (module docstring).

    Args:
        tg, strategy_of, spaces, pricer: the graph, each node's chosen Strategy, the nodes' NodeSpaces (inputs,
            requires_grad) and the plan's Pricer (mesh, priced dtypes, bytes per parameter).
        saved: bytes each op node keeps for backward on the rank (`local_storage.local_saved_bytes`).
        resident_bytes: params + optimizer + buffers + returned values, held through the step (bytes).
        recompute_deltas: {nodes of a recomputed region, in graph order: its saved-bytes change (<= 0)}; None: none.
        bucket_bytes: the runtime's DDP bucket size (`ParallelModule(grad_bucket_bytes=)`); 0: no buckets.
        forward_spans: the forward's local storages (`local_storage.local_saved_bytes(spans=)`); empty: the forward
            is not walked.
    Returns:
        A `StepPeak`.
    Raises:
        KeyError: a node of `tg` without a strategy in `strategy_of` (a plan of another graph).
    """
    mesh = pricer.mesh
    order = [n for n, s in spaces.items() if s.kind == "op"]
    pos = {n: i for i, n in enumerate(order)}
    end = len(order)
    consumers: dict[str, list[tuple[str, int]]] = {}
    for n, s in spaces.items():
        for k, ti in enumerate(s.inputs):
            consumers.setdefault(ti.producer, []).append((n, k))
    grads_at = [0] * (end + 1)      # non-bucketed gradient bytes made at the backward of position i
    bucketed: list[tuple[int, int]] = []  # (position of the last use, gradient bytes) of bucketed parameters
    gathered = [0] * (end + 2)      # difference array: regathered parameters and their unsharded gradients
    kept = 0
    backward_readers_of: dict[str, dict[str, list[str]]] = {}

    live = pricer.backward_nodes(tg)

    def readers(ph: str) -> dict[str, list[str]]:
        if ph not in backward_readers_of:
            backward_readers_of[ph] = gather_readers(tg, ph, live)
        return backward_readers_of[ph]

    trained: list[int] = []         # local parameter bytes in the optimizer's order (the module's)
    for p in tg.parameters.values():
        if p.is_buffer:
            continue
        stored = strategy_of[p.placeholders[0]].output
        numel = math.prod(local_shape(p.shape, stored, mesh))
        param_b, grad_b, _ = pricer.param_state_bytes(numel, p.requires_grad)
        if grad_b:
            trained.append(param_b)
        uses = [(c, k) for ph in p.placeholders for c, k in consumers.get(ph, ()) if c in pos]
        if not grad_b or not uses:
            continue
        last, is_bucketed = max(pos[c] for c, _ in uses), False
        gathers: dict[tuple, tuple[int, list[str]]] = {}  # one gathered value per (placeholder, use layout, grad axes)
        for c, k in uses:
            in_bucket, full, key = use_transients(pricer, stored, strategy_of[c], k, spaces[c].inputs[k], bucket_bytes)
            is_bucketed |= in_bucket
            if full is not None:
                gathers.setdefault(key, (full, []))[1].append(c)
        for (ph, _, _), (full, users) in gathers.items():
            _gathered_life(gathered, [pos[c] for c in users], full * param_b // max(numel, 1),
                           full * grad_b // max(numel, 1),
                           [pos[r] for u in users for r in readers(ph).get(u, ()) if r in pos])
        if is_bucketed:
            kept += grad_b
            bucketed.append((last, grad_b))
        else:
            grads_at[last] += grad_b
    # activations alive at the backward of position i: a prefix sum, recomputed regions' savings after their end
    acts_delta = [0] * (end + 2)
    for i, n in enumerate(order):
        acts_delta[i] += saved.get(n, 0)
    for nodes, delta in (recompute_deltas or {}).items():
        inside = [pos[n] for n in nodes if n in pos]
        if inside:
            acts_delta[max(inside) + 1] += delta
    # gradients of activations: live from the last consumer's backward to the producer's
    grad_delta = [0] * (end + 2)    # difference array over positions
    for n, lo, hi, shape, dtype in grad_spans(tg, spaces, pricer, pos, consumers):
        if strategy_of[n].output is None:
            continue
        nbytes = math.prod(local_shape(shape, strategy_of[n].output, mesh)) * dtype.itemsize
        grad_delta[lo] += nbytes
        grad_delta[hi + 1] -= nbytes
    for n in order:  # the backward of a composite op kept whole holds an input-sized gradient inside it
        nbytes = backward_scratch_bytes(tg, pricer, spaces[n], strategy_of[n])
        grad_delta[pos[n]] += nbytes
        grad_delta[pos[n] + 1] -= nbytes
    acts = _prefix(acts_delta)
    act_grads = _prefix(grad_delta)
    gathered = _prefix(gathered)
    later = [0] * (end + 2)         # gradients made at positions >= i
    for i in range(end, -1, -1):
        later[i] = later[i + 1] + grads_at[i]
    pending = _pending(bucketed, end, bucket_bytes)
    resident = resident_bytes + kept
    step_tmp = adamw_temporary_bytes(trained)
    best = StepPeak(resident + later[0] + step_tmp, "optimizer step", resident, 0, later[0], step_tmp)
    flatten = resident + later[0] + pending[0]  # the end of backward: the open bucket flattened
    if flatten > best.peak_bytes:
        best = StepPeak(flatten, "end of backward", resident, 0, later[0] + pending[0], 0)
    for i in range(end - 1, -1, -1):
        if order[i] not in live:
            continue
        transient = act_grads[i] + gathered[i]
        total = resident + acts[i] + later[i] + pending[i] + transient
        if total > best.peak_bytes:
            best = StepPeak(total, f"backward of {order[i]}", resident, acts[i], later[i] + pending[i], transient)
    alive = _prefix(_forward_alive(forward_spans, {**pos, "output": end}, end))
    for i in range(end + 1 if forward_spans else 0):  # position `end`: the output node's redistributions (round 27)
        if resident + acts[i] + alive[i] > best.peak_bytes:
            at = f"forward at {order[i]}" if i < end else "forward at output"
            best = StepPeak(resident + acts[i] + alive[i], at, resident, acts[i], 0, alive[i])
    return best


def use_transients(pricer: Pricer, stored: Layout, strategy: Strategy, k: int, ti: TensorInput,
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> tuple[bool, int | None, tuple]:
    """What one use of a parameter (input `k` of a node taking `strategy`; `ti` its TensorInput, the placeholder its
    producer) holds beside the rows' linear terms, for the parameter stored in `stored` (module docstring):
    (whether its first step is DDP's bucketed all-reduce, `rewriter.grad_sync.runtime_buckets`: its gradient kept in
    a bucket; the local elements of the full copy the program gathers again in backward, or None when it does not
    (`Step.regather`); the gathered value's key (placeholder, use layout, gradient axes): uses with one key share
    one copy). Shared by `step_peak` and the ILP's rows (`peak_rows`)."""
    use = strategy.inputs[k]
    axes = grad_partial_axes(use, strategy.output, pricer.mesh)
    steps = pricer.steps(stored, use, ti.shape, ti.dtype, axes, True, True)
    bucketed = bucket_bytes > 0 and runtime_buckets(steps, 0, True)
    regathers = any(st.kind == "all_gather" and st.regather for st in steps)
    return bucketed, math.prod(local_shape(ti.shape, use, pricer.mesh)) if regathers else None, \
        (ti.producer, str(use), axes)


def gather_readers(tg: TracedGraph, ph: str, live: frozenset[str]) -> dict[str, list[str]]:
    """{direct user of placeholder `ph`: the ops that may read its gathered copy in backward through it}
    (`rewriter.reshard.backward_readers`, by node name; {} when the program keeps the copy). `live`: the names of
    the nodes whose backward runs (`Pricer.backward_nodes`): an op keeps the copy only where its partner operand
    needs a gradient (round 27, r27e), as the program decides at run time."""
    found = backward_readers(tg.nodes[ph].node, lambda m: m.name in live)
    return {u.name: [r.name for r in rs] for u, rs in found.items()}


def backward_scratch_bytes(tg: TracedGraph, pricer: Pricer, space: NodeSpace, strategy: Strategy) -> int:
    """Bytes the backward of op node `space.name` holds inside it, at its own backward only (`_BACKWARD_SCRATCH`:
    a composite op kept whole, e.g. cross-entropy's logits-sized gradients), for its strategy; 0 for other ops."""
    scratch = _BACKWARD_SCRATCH.get(tg.nodes[space.name].target, 0)
    if not scratch or not space.requires_grad or not space.inputs:
        return 0
    ti = space.inputs[0]
    return scratch * math.prod(local_shape(ti.shape, strategy.inputs[0], pricer.mesh)) * pricer.input_itemsize(tg, ti)


def _gathered_life(gathered: list[int], uses: list[int], param_bytes: int, grad_bytes: int, readers: list[int]) -> None:
    """Add one gathered parameter value's backward life to the difference array `gathered` (positions in graph order,
    walked in reverse): its full copy, when the program gathers it again (`readers`: the positions of the ops that
    read it in backward, `rewriter.reshard.backward_readers`), from the first of them to run (the last in graph
    order) through the last one's backward, after which autograd frees it (`rewriter.reshard`, step 3); its
    unsharded gradient from its last use's backward (`uses`) to its first use's, whose end runs the reduce-scatter."""
    if readers:
        gathered[min(readers)] += param_bytes
        gathered[max(readers) + 1] -= param_bytes
    gathered[min(uses)] += grad_bytes
    gathered[max(uses) + 1] -= grad_bytes
def grad_spans(tg: TracedGraph, spaces: Mapping[str, NodeSpace], pricer: Pricer, pos: Mapping[str, int],
               consumers: Mapping[str, list[tuple[str, int]]]) -> list[tuple[str, int, int, tuple, torch.dtype]]:
    """[(node, lo, hi, global shape, dtype as run)] of every value whose gradient backward materialises: alive from
    the backward of its last consumer (position hi) to its producer's (lo; a getitem's, the tuple's producer). Left
    out: values without a gradient (no requires_grad, integer dtypes, tuples: their elements count), values only
    returned (the loss is the root) or read by sums only (`_EXPANDED_GRAD`: an expanded view, no storage)."""
    out = []
    for n in pos:
        space, info = spaces[n], tg.nodes[n]
        outs = [o for o in info.outputs if carries_grad(o.dtype)]
        if not space.requires_grad or len(info.outputs) != 1 or not outs:
            continue
        source = info.node.args[0].name if info.target is operator.getitem else n
        users = [c for c, _ in consumers.get(n, ()) if c in pos]
        if not users or all(tg.nodes[c].target in _EXPANDED_GRAD for c in users):
            continue
        out.append((n, pos.get(source, pos[n]), max(pos[c] for c in users), tuple(outs[0].shape),
                    pricer.value_dtype(tg, n, outs[0].dtype)))  # as run (autocast)
    return out


def _prefix(delta: list[int]) -> list[int]:
    out, run = [], 0
    for d in delta:
        run += d
        out.append(run)
    return out


def _pending(bucketed: list[tuple[int, int]], end: int, bucket_bytes: int) -> list[int]:
    """Per position i, the bucketed partial gradients made at positions >= i and not yet flattened: gradients
    arrive in backward order (the last use first) and a bucket is flattened when it reaches its size
    (`rewriter.grad_sync.bucket_sizes`: the first at `FIRST_BUCKET_BYTES`); the last one at the end of backward."""
    out = [0] * (end + 1)
    if not bucketed:
        return out
    total = sum(b for _, b in bucketed)
    bounds, run = [], 0.0
    for size in bucket_sizes(total, bucket_bytes)[:-1]:  # the last bucket is flattened at the end of backward
        run += size
        bounds.append(run)
    made = {i: 0 for i in range(end + 1)}
    for last, b in bucketed:
        made[last] += b
    cum, flushed, k = 0, 0.0, 0
    for i in range(end, -1, -1):
        cum += made[i]
        while k < len(bounds) and cum >= bounds[k]:
            flushed, k = bounds[k], k + 1
        out[i] = int(cum - flushed)
    return out


def _forward_alive(spans: Sequence[StorageSpan], pos: Mapping[str, int], end: int) -> list[int]:
    """Difference array over positions of the forward's storages alive and not yet saved (module docstring, fwd)."""
    delta = [0] * (end + 2)
    for sp in spans:
        lo, hi = pos.get(sp.first), pos.get(sp.last)
        if lo is None or hi is None:
            continue
        if sp.saver in pos:
            hi = min(hi, pos[sp.saver] - 1)
        if hi >= lo:
            delta[lo] += sp.nbytes
            delta[hi + 1] -= sp.nbytes
    return delta
