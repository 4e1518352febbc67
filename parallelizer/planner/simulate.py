"""Simulate one step of a pipeline schedule from its own action list: per-rank timelines, makespan, bubble
and peak in-flight activations per rank. What is priced is what runs: the lists are torch's.

Input: an `ActionSchedule` (`planner.action_schedule`), for torch's schedules and BitPipe built by
`planner.schedule_lists.action_schedule(name, p, m)` (re-exported here; its module docstring says from which
torch code each list comes).

Model (list scheduling with fixed per-rank order): every rank runs its actions in list order; an action
starts when its rank is free and its dependencies are done (`action_schedule` module: F(x, i) after
F(x-1, i) plus the transfer; I/B(x, i) after I/B(x+1, i) plus the transfer and after F(x, i); W(x, i) after
I(x, i)). Per-action seconds (`StageTimes`, per model stage): F, I, W; B = I + W. A transfer between model
stages k and k+1 costs `p2p_s[k]` when the two stages sit on different ranks and 0 on the same rank; it
is asynchronous (the sender goes on), but each directed rank pair is one link that carries one transfer at
a time, in the sender's list order: a transfer starts when its producer ends and the link's previous
transfer has arrived (so m transfers of p2p seconds take at least m p2p on a slow link, e.g. 100 Mb/s
between nodes; a rank's links to different peers do not share bandwidth; the processor-sharing pass of
`planner.sharing` keeps the contention-free transfers). `OVERLAP_F_B` (DualPipeV) runs its F
and B back to back, as torch's runtime does without a custom overlap function. Optional: `copy_sync_s[k]`,
the all-reduce between the copies of model stage k (BitPipe), started when every copy's last backward of k
is done and overlapping later compute (eager), and `copy_pack_s[k]`, the host work of packing / summing that
exchange on each copy's rank, added to the copy's last backward (CPU work: it shares the cores); `stage_sync_s[k]`, the data-parallel gradient all-reduce of
model stage k's gradients, which the runtime buckets and starts during the stage's last backward
(`rewriter.grad_sync.deferred_sync`; Megatron's `--overlap-grad-reduce` does the same): its
buckets (`stage_sync_s[k]`: seconds of each) become ready over that backward action [s, e] as backward
produces their gradients (bucket i at s + f_i (e - s), f_i = `stage_sync_ready[k][i]`, by default
(i + 1) / n for n buckets) and each rank all-reduces its stages' buckets one at a time in ready order, so rank
r's sync delays its end by `cost_model.communication.overlapped_comm_exposed_s` (only `sync_overlap`, the
device's comm_overlap, can hide; the last bucket is always exposed); `grad_sync_s[r]`, a wait after rank
r's last action and its overlapped sync (not overlapped: ZeRO-1's all-gather of the stepped parameters, or a
codec whose buckets backward must wait for). The step ends when the last of these ends.

Per-action runtime overhead (issue 14; optional `StageTimes.action_overhead`, a
`cost_model.hardware.PipelineActionCost`): every action also pays its kind's fixed host seconds on its rank's
timeline (F, I, W or B), plus one send for each cross-rank transfer it produces (F's activations to the next
stage, I/B's input gradients to the previous one) and one receive for the cross-rank transfer it consumes, as
torch's runtime builds, posts and waits on those ops around the action (same-rank hand-offs, the V's tip,
pay neither); and every rank starts its first action `step_s` after the step begins (the schedule's set-up).
A schedule that runs on the package's own runner (BitPipe) pays that runner's costs where the profile measured
them (`PipelineActionCost.for_schedule`, round 17), else torch's. Each cross-rank send and receive also pays
`comm_thread_s` (round 18): the CPU the communication library's own threads (gloo's) spend on the op, which
the posting thread's figures leave out; it is CPU work that takes a core like the rest (on one CPU machine the
ranks' gloo threads run on the same cores), charged to the action that sends or receives, and the same
figure for every runner (the library's, read from the top level of the cost, not `for_schedule`), per P2P op:
a transfer of n tensors is n ops at each end (`StageTimes.p2p_ops`, round 20: a GPT-2 cut carries the hidden
states and the attention mask, 2 ops each way, measured on both runners). Round 19: the
same threads also spend `comm_thread_per_byte_s` per byte of each transfer on both its ends (with
`StageTimes.p2p_bytes`), and each W action of torch's split backward pays `split_backward_per_node_s` per autograd
node of its stage (`StageTimes.backward_nodes`) and, round 26, `split_backward_per_byte_s` per byte of its stage's
weight gradients (`StageTimes.weight_grad_bytes`: the fresh gradients it adds into `.grad`): measured per schedule on 4 gloo ranks, zbv's 64 split backwards
cost its ranks more CPU than interleaved_1f1b's 32 extra transfers (benchmarks/RESULTS.md, round 19).
So with c_F = c_B = c and nothing else, GPipe / 1F1B take (m + p - 1)(F + B + 2c) at equal stages; with
send = recv = c on p = 2, each stage's F and B pay one transfer op each, again (m + 1)(F + B + 2c); step_s adds
itself to the makespan. The overhead is CPU work of the rank, so it shares the cores like compute (`cores`),
except `step_s`, a common start offset. Without it (None, every closed-form test) the actions cost their
compute only.

First touch of memory (round 23, rule corrected in round 27; optional `StageTimes.pool_bytes` with `act_bytes`):
a rank whose allocator already holds `pool_bytes[r]` bytes when the step starts (its kept heap) pays the kernel's
page faults for its live level beyond that, `PipelineActionCost.first_touch_per_byte_s` (the machine's, read from
the top level like `comm_thread_s`) per byte each action raises the running maximum by; the live level is its
in-flight activations (the peak walk below) plus, with `weight_grad_bytes`, the weight gradients each stage's first
B / W allocates (freed by `zero_grad(set_to_none=True)` after the step): `planner.first_touch`. So a rank of GPipe
with an empty pool pays m x act x c (+ its gradients) over the step, and one whose pool holds its live peak pays
nothing; a schedule's own activation peak is not that pool (GPipe alone at full size re-touches its gradients every
step, round 27). CPU work: it shares the cores like compute. None: nothing charged.

Formulation: the actions form a DAG (rank order + dependencies); the makespan is its longest path. The DAG,
a topological order grouped into levels and the per-rank in-flight counts depend only on (name, p, m) and
are compiled once (cached); pricing a cost vector is one vectorised pass over the levels (numpy), ~L numpy
steps for L levels (~ per-rank list length + p). The planner's branch and bound prices candidates by a lower bound
(`planner.search`, `_Context._price_partition`) and simulates only the candidates that survive it.

Ranks sharing cores (one CPU machine, `planner.sharing`): with `cores` the per-action seconds are solo
seconds and an event simulation slows each of k ranks computing at once by the machine's measured factor for
k (processor sharing); the optional per-rank optimizer step (`StageTimes.optimizer_s`) runs after the rank's
gradient sync and shares the cores too. Without `cores` (every GPU preset) each rank has its own device and
the vectorised pass above is used unchanged.

Peak in-flight activations of rank r: walking r's list in order, F(x, i) adds model stage k's activation
bytes, I or B(x, i) frees them (W keeps only the weight-gradient inputs, not counted); the peak of that
running sum. It depends on the order only, not on the times.

Bubble fraction of rank r = 1 - busy_r / makespan (compute only); `bubble_s` = makespan - the largest busy.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from cost_model.communication import overlapped_comm_exposed_s
from cost_model.hardware import PipelineActionCost

from ..errors import PipelineError
from .action_schedule import ActionSchedule
from .bitpipe import held_with_posted_receives
from .first_touch import first_touch_bytes  # noqa: F401 (re-exported: the bench reads it here)
from .schedule_lists import SIMULATED_SCHEDULES, action_schedule  # noqa: F401 (re-exported)
from .sharing import SharedCores, cpu_floor_s, shared_pass

_KIND = {"F": 0, "I": 1, "W": 2, "B": 3}
# Schedules whose runner posts every cross-rank receive of the step at its start and holds those buffers until
# their action runs (`peak_held_bytes`): BitPipe's own runner (round 25, r25i); torch's post each when it is due.
POSTS_RECEIVES_AT_START = frozenset({"bitpipe"})
@dataclass(frozen=True)
class StageTimes:
    """Per-microbatch costs of one candidate, per MODEL stage k (0..S-1), in seconds (bytes for act_bytes).

    Attributes:
        fwd_s, bwd_input_s, bwd_weight_s: F, I, W of stage k (B = I + W).
        p2p_s: S - 1 transfer seconds across the boundary k -> k+1 (activations), paid across ranks only.
        p2p_bwd_s: S - 1 seconds of the gradient k+1 -> k (default p2p_s).
        act_bytes: activation bytes one microbatch keeps on stage k until its I/B (default 1 each: then the
            peak is in stage-microbatches).
        copy_sync_s: per model stage, the all-reduce between its copies (only for copies > 1).
        copy_pack_s: per model stage, host seconds (solo CPU work) each copy's rank spends packing the stage's
            gradients for that exchange and summing / unpacking its twin's (`cost_model.pipeline_actions.
            copy_exchange_pack_s`), charged to the copy's last backward action (round 18; None: none).
        stage_sync_s: per model stage, the seconds of each bucket of the dp all-reduce of its gradients, which
            overlaps its last backward (module docstring); stage_sync_ready: per model stage, the fraction
            of that backward after which each bucket is ready (increasing, in (0, 1]; default (i + 1) / n);
            sync_overlap: the fraction of the syncs that can hide, in [0, 1].
        grad_sync_s: per rank, a wait after its last action and its overlapped stage syncs.
        optimizer_s: per rank, its optimizer step after its gradient sync (default none: the planner's step
            time leaves the optimizer out; `benchmarks/bench_schedules_runtime.py` times it in).
        action_overhead: the runtime's fixed seconds per action by kind, per send / receive and per step
            (module docstring; `DeviceSpec.pipeline_action`); None: none.
        p2p_bytes / p2p_bwd_bytes: S - 1 bytes of each transfer across boundary k -> k+1 (activations) and back
            (gradients; default p2p_bytes), for the communication threads' per-byte CPU
            (`PipelineActionCost.comm_thread_per_byte_s`, round 19); None: no per-byte CPU charged.
        backward_nodes: per model stage, the autograd nodes of one microbatch's backward (the planner's proxy:
            the stage's ATen ops + parameter tensors), for the split backward's graph walks
            (`PipelineActionCost.split_backward_per_node_s`, charged to each W action, round 19); None: none.
        weight_grad_bytes: per model stage, the bytes of its weight gradients on its rank, for the split backward's
            accumulation of fresh weight gradients (`PipelineActionCost.split_backward_per_byte_s`, charged to each
            W action, round 26); None: none.
        p2p_ops / p2p_bwd_ops: S - 1 counts of the P2P ops (one per tensor) each transfer across boundary
            k -> k+1 posts (activations) and back (gradients; default p2p_ops): both runners post one isend and
            one irecv per value crossing the cut (`planner.segments.Segments.cut_values`; torch's stages send a
            gradient for every received input, BitPipe's for every input it received with requires_grad), and
            the communication threads' `PipelineActionCost.comm_thread_s` is per op (round 20); None: 1 op per
            transfer.
        host_cpu_s: per rank, solo CPU seconds it spends outside its simulated actions and optimizer tail while
            its timeline shows a wait or nothing (round 21: gloo's threads reducing its dp gradient sync; the
            optimizer step the caller adds after the step); counted only in `SimResult.cpu_floor_s` (with
            `cores`); None: none.
        pool_bytes: per rank, bytes of memory its allocator holds when the step starts (its kept heap); its live
            level beyond it (activations + weight gradients, `planner.first_touch`) is first touched at
            `PipelineActionCost.first_touch_per_byte_s` (module docstring, round 23 / 27; needs act_bytes); None: no
            first-touch cost.
    """

    fwd_s: tuple[float, ...]
    bwd_input_s: tuple[float, ...]
    bwd_weight_s: tuple[float, ...]
    p2p_s: tuple[float, ...] = ()
    p2p_bwd_s: tuple[float, ...] | None = None
    act_bytes: tuple[float, ...] | None = None
    copy_sync_s: tuple[float, ...] | None = None
    grad_sync_s: tuple[float, ...] | None = None
    optimizer_s: tuple[float, ...] | None = None
    stage_sync_s: tuple[tuple[float, ...], ...] | None = None
    stage_sync_ready: tuple[tuple[float, ...], ...] | None = None
    sync_overlap: float = 1.0
    action_overhead: PipelineActionCost | None = None
    copy_pack_s: tuple[float, ...] | None = None
    p2p_bytes: tuple[float, ...] | None = None
    p2p_bwd_bytes: tuple[float, ...] | None = None
    backward_nodes: tuple[float, ...] | None = None
    p2p_ops: tuple[float, ...] | None = None
    p2p_bwd_ops: tuple[float, ...] | None = None
    host_cpu_s: tuple[float, ...] | None = None
    pool_bytes: tuple[float, ...] | None = None
    weight_grad_bytes: tuple[float, ...] | None = None

    @staticmethod
    def uniform(num_stages: int, f: float, i: float, w: float, p2p: float = 0.0) -> "StageTimes":
        """Every stage costs F = f, I = i, W = w; every boundary p2p."""
        return StageTimes((f,) * num_stages, (i,) * num_stages, (w,) * num_stages, (p2p,) * (num_stages - 1))


@dataclass(frozen=True)
class SimResult:
    """One simulated step. Seconds; per-rank tuples indexed by pp rank.

    Attributes:
        makespan_s: end of the step (compute, copy syncs, grad syncs and optimizer steps when given).
        compute_end_s: end of the last compute action.
        busy_s: per rank, seconds of compute (wall seconds its actions ran, slowed down when sharing cores).
        bubble_fraction: per rank, 1 - busy / compute_end_s.
        bubble_s: compute_end_s - max(busy_s) (the bottleneck rank's idle time).
        peak_inflight_bytes: per rank, peak activation bytes held (module docstring; in stage-microbatches
            when StageTimes.act_bytes is None); bitpipe with act_bytes and p2p_bytes: with the receive buffers
            its runner posts at the step's start (`planner.bitpipe.held_with_posted_receives`, round 25).
        inflight_microbatches: per rank, the peak of saved activations alone / (sum of act bytes of the rank's
            action stages), i.e. in units of the rank's whole per-microbatch activations.
        cpu_floor_s: with `cores`, `planner.sharing.cpu_floor_s` of every rank's CPU work (its actions' solo
            seconds, its optimizer tail, `StageTimes.host_cpu_s`): no step on shared cores is shorter (round 21);
            the makespan already respects it for the simulated work, the caller applies it (`candidates`:
            with the optimizer it adds after the step); 0.0 without `cores` (one device per rank).
    """

    makespan_s: float
    compute_end_s: float
    busy_s: tuple[float, ...]
    bubble_fraction: tuple[float, ...]
    bubble_s: float
    peak_inflight_bytes: tuple[float, ...]
    inflight_microbatches: tuple[float, ...]
    starts: np.ndarray
    ends: np.ndarray
    compiled: "_Compiled"
    cpu_floor_s: float = 0.0

    def timeline(self) -> dict[int, list[tuple[str, float, float]]]:
        """Per rank, (action as torch prints it, e.g. "3F7", start_s, end_s) in run order."""
        c = self.compiled
        return {r: [(repr(c.actions[n]), float(self.starts[n]), float(self.ends[n])) for n in c.by_rank[r]]
                for r in range(c.p)}


@dataclass(frozen=True)
class _Compiled:
    """The DAG of one ActionSchedule (module docstring: Formulation); node n = one action."""

    p: int
    S: int
    actions: tuple
    kind: np.ndarray        # (N,) 0 F, 1 I, 2 W, 3 B
    stage: np.ndarray       # (N,) model stage
    rank: np.ndarray        # (N,) pp rank
    pred: np.ndarray        # (N, 3) rank predecessor, transfer dependency, local dependency; N = none
    xfer: np.ndarray        # (N,) boundary index of the transfer dependency, S - 1 = none / same rank
    prev_link: np.ndarray   # (N,) consumer of the previous transfer on the same directed rank pair; N = none
    levels: tuple[np.ndarray, ...]
    by_rank: tuple[np.ndarray, ...]
    inflight_counts: tuple[np.ndarray, ...]  # per rank (steps, S): stage-microbatches held after each step
    last_bwd: tuple[tuple[int, ...], ...]    # per model stage, the node of each copy's last backward
    rank_stages: tuple[tuple[int, ...], ...]  # per rank, the model stage of each action stage it holds
    sends: np.ndarray       # (N,) cross-rank transfers the action produces (0 or 1)
    recvs: np.ndarray       # (N,) cross-rank transfers the action consumes (0 or 1)
    name: str = ""          # the schedule's name (its runner's per-action cost: PipelineActionCost.for_schedule)


def _overlapped_sync(c: _Compiled, starts: np.ndarray, ends: np.ndarray, times: StageTimes) -> np.ndarray:
    """(p,) seconds by which each rank's stage syncs (`StageTimes.stage_sync_s`, module docstring) delay its
    end: its stages' buckets, ready over each stage's last backward on this rank, all-reduced one at a time
    in ready order (`overlapped_comm_exposed_s`). Zeros without stage syncs.

    Raises:
        PipelineError: stage_sync_s / stage_sync_ready not one entry per model stage, a negative bucket time,
            ready fractions not increasing in (0, 1] or not one per bucket, or sync_overlap outside [0, 1].
    """
    if times.stage_sync_s is None:
        return np.zeros(c.p)
    syncs = tuple(tuple(float(x) for x in k) for k in times.stage_sync_s)
    ready = times.stage_sync_ready or tuple(tuple((i + 1) / len(k) for i in range(len(k))) for k in syncs)
    bad = (len(syncs) != c.S or len(ready) != c.S or not 0 <= times.sync_overlap <= 1
           or any(x < 0 for k in syncs for x in k)
           or any(len(f) != len(k) or any(not 0 < a <= 1 for a in f) or list(f) != sorted(f)
                  for f, k in zip(ready, syncs)))
    if bad:
        raise PipelineError(f"StageTimes.stage_sync_s {syncs} / stage_sync_ready {ready} / sync_overlap "
                            f"{times.sync_overlap}: need per model stage ({c.S}) bucket seconds >= 0 and as many "
                            f"increasing ready fractions in (0, 1], and an overlap in [0, 1]")
    out = np.zeros(c.p)
    for r, idx in enumerate(c.by_rank):
        pieces = []  # (ready s, seconds) of every bucket of rank r
        for k, nodes in enumerate(c.last_bwd):
            for n in (n for n in nodes if n < len(c.rank) and c.rank[n] == r):
                s0, width = float(starts[n]), float(ends[n] - starts[n])
                pieces += [(s0 + f * width, x) for f, x in zip(ready[k], syncs[k])]
        if pieces:
            pieces.sort()
            out[r] = overlapped_comm_exposed_s([t for t, _ in pieces], [x for _, x in pieces],
                                               float(ends[idx].max()), times.sync_overlap)
    return out


@functools.lru_cache(maxsize=64)
def compile_schedule(name: str, p: int, m: int) -> _Compiled:
    """`_compile(action_schedule(name, p, m))`, cached."""
    return _compile(action_schedule(name, p, m))


def _compile(sched: ActionSchedule) -> _Compiled:
    """Build the DAG of `sched` and its levels.

    Raises:
        PipelineError: the lists deadlock (a cycle: some action waits on one that its rank runs later).
    """
    S, p = sched.num_stages, sched.num_ranks
    acts, kind, stage, rank = [], [], [], []
    for r in range(p):
        for a in sched.actions[r]:
            acts.append(a)
            kind.append(_KIND[a.computation_type.value])
            stage.append(sched.model_stage(a.stage_index))
            rank.append(r)
    N = len(acts)
    index = {(a.stage_index, kind[n] if kind[n] != 3 else 1, a.microbatch_index): n for n, a in enumerate(acts)}
    pred = np.full((N, 3), N, dtype=np.int64)
    xfer = np.full(N, S - 1, dtype=np.int64)
    start = 0
    for r in range(p):
        n_r = len(sched.actions[r])
        pred[start + 1:start + n_r, 0] = np.arange(start, start + n_r - 1)
        start += n_r
    for n, a in enumerate(acts):
        x, i, k = a.stage_index, a.microbatch_index, stage[n]
        if kind[n] == 0:
            dep, boundary = ((x - 1, 0, i), k - 1) if k > 0 else (None, None)
        elif kind[n] == 2:
            dep, boundary = (x, 1, i), None
        else:
            dep, boundary = ((x + 1, 1, i), k) if k < S - 1 else (None, None)
            pred[n, 2] = index[(x, 0, i)]
        if dep is not None:
            pred[n, 1] = index[dep]
            if boundary is not None and sched.stage_to_rank[dep[0]] != sched.stage_to_rank[x]:
                xfer[n] = boundary
    # Kahn's algorithm, one frontier (level) at a time, on numpy arrays (CSR children; a repeated edge is
    # counted in both the in-degree and the children, so it cancels)
    src = pred.ravel()
    dst = np.repeat(np.arange(N, dtype=np.int64), 3)
    keep = src != N
    src, dst = src[keep], dst[keep]
    order = np.argsort(src, kind="stable")
    children = dst[order]
    starts = np.searchsorted(src[order], np.arange(N + 1))
    indeg = np.bincount(dst, minlength=N)
    frontier = np.flatnonzero(indeg == 0)
    levels, seen = [], 0
    while len(frontier):
        levels.append(frontier)
        seen += len(frontier)
        lens = starts[frontier + 1] - starts[frontier]
        total = int(lens.sum())
        if total == 0:
            break
        offs = np.repeat(starts[frontier] - np.cumsum(lens) + lens, lens) + np.arange(total)
        ch = children[offs]
        np.subtract.at(indeg, ch, 1)
        frontier = np.unique(ch[indeg[ch] == 0])
    if seen != N:
        stuck = [repr(acts[n]) for n in range(N) if indeg[n] > 0][:6]
        raise PipelineError(f"schedule {sched.name!r} (p={p}, m={sched.num_microbatches}) deadlocks: "
                            f"{stuck} wait on actions their rank runs later")
    kind_a, stage_a, rank_a = (np.array(v, dtype=np.int64) for v in (kind, stage, rank))
    prev_link = _link_order(pred[:, 1], xfer, rank_a, S)
    by_rank = tuple(np.flatnonzero(rank_a == r) for r in range(p))
    counts = []
    for r in range(p):
        idx = by_rank[r]
        delta = np.zeros((len(idx), S), dtype=np.int64)
        rows = np.arange(len(idx))
        delta[rows, stage_a[idx]] = np.where(kind_a[idx] == 0, 1, np.where(kind_a[idx] == 2, 0, -1))
        counts.append(np.cumsum(delta, axis=0))
    xs = np.array([a.stage_index for a in acts], dtype=np.int64)
    last = np.full(S * sched.copies, N, dtype=np.int64)
    bwd = np.flatnonzero(kind_a != 0)
    last[xs[bwd]] = bwd  # nodes increase within a rank, and a stage sits on one rank: the max wins
    last_bwd = tuple(tuple(int(last[c * S + k]) for c in range(sched.copies)) for k in range(S))
    rank_stages = tuple(tuple(sched.model_stage(x) for x, rr in sorted(sched.stage_to_rank.items()) if rr == r)
                        for r in range(p))
    recvs = (xfer != S - 1).astype(np.int64)
    sends = np.bincount(pred[recvs == 1, 1], minlength=N)[:N]
    return _Compiled(p, S, tuple(acts), kind_a, stage_a, rank_a, pred, xfer, prev_link, tuple(levels), by_rank,
                     tuple(counts), tuple(last_bwd), rank_stages, sends, recvs, sched.name)


def _link_order(producer: np.ndarray, xfer: np.ndarray, rank: np.ndarray, S: int) -> np.ndarray:
    """For each consumer n of a cross-rank transfer, the consumer of the transfer sent just before it on the
    same directed rank pair (sender's list order: node numbers increase along a rank's list), else N."""
    N = len(xfer)
    prev = np.full(N, N, dtype=np.int64)
    last: dict[tuple[int, int], int] = {}
    cons = np.flatnonzero(xfer != S - 1)
    for n in cons[np.argsort(producer[cons], kind="stable")]:
        key = (int(rank[producer[n]]), int(rank[n]))
        prev[n] = last.get(key, N)
        last[key] = int(n)
    return prev


def _size_overhead(c: _Compiled, times: StageTimes, over: PipelineActionCost) -> np.ndarray:
    """(N,) CPU seconds per action that grow with what it moves or walks (round 19): the communication
    threads' `comm_thread_per_byte_s` x the bytes of each cross-rank transfer it sends or receives (the
    library's figure, from the top level like `comm_thread_s`), and each W action's
    `split_backward_per_node_s` (its runner's) x its stage's `backward_nodes` plus (round 26)
    `split_backward_per_byte_s` x its stage's `weight_grad_bytes`. Zeros where the sizes are None.

    Raises:
        PipelineError: p2p_bytes / p2p_bwd_bytes not S - 1 bytes >= 0, backward_nodes / weight_grad_bytes not S
            values >= 0.
    """
    S, N = c.S, len(c.kind)
    out = np.zeros(N)
    if times.p2p_bytes is not None:
        fwd = np.asarray(times.p2p_bytes, dtype=float)
        bwd = fwd if times.p2p_bwd_bytes is None else np.asarray(times.p2p_bwd_bytes, dtype=float)
        if len(fwd) != S - 1 or len(bwd) != S - 1 or (fwd < 0).any() or (bwd < 0).any():
            raise PipelineError(f"StageTimes.p2p_bytes {times.p2p_bytes} / p2p_bwd_bytes {times.p2p_bwd_bytes}: "
                                f"need {S - 1} bytes >= 0 each (one per stage boundary)")
        cons = np.flatnonzero(c.xfer != S - 1)  # consumers of cross-rank transfers; the producer sends it
        nbytes = np.where(c.kind[cons] == 0, fwd[np.minimum(c.xfer[cons], S - 2)],
                          bwd[np.minimum(c.xfer[cons], S - 2)]) * times.action_overhead.comm_thread_per_byte_s
        np.add.at(out, cons, nbytes)
        np.add.at(out, c.pred[cons, 1], nbytes)
    if times.backward_nodes is not None:
        nodes = np.asarray(times.backward_nodes, dtype=float)
        if len(nodes) != S or (nodes < 0).any():
            raise PipelineError(f"StageTimes.backward_nodes {times.backward_nodes}: need {S} counts >= 0 (one per "
                                "model stage)")
        out += np.where(c.kind == 2, nodes[c.stage] * over.split_backward_per_node_s, 0.0)
    if times.weight_grad_bytes is not None:
        grads = np.asarray(times.weight_grad_bytes, dtype=float)
        if len(grads) != S or not np.isfinite(grads).all() or (grads < 0).any():
            raise PipelineError(f"StageTimes.weight_grad_bytes {times.weight_grad_bytes}: need {S} bytes >= 0 (one "
                                "per model stage)")
        out += np.where(c.kind == 2, grads[c.stage] * over.split_backward_per_byte_s, 0.0)
    return out


def _p2p_ops(c: _Compiled, times: StageTimes) -> np.ndarray:
    """(N,) P2P ops each action posts for the cross-rank transfers it sends and receives (`StageTimes.p2p_ops`,
    round 20): the ops of the transfer it produces plus those of the transfer it consumes; without p2p_ops
    `sends + recvs` (one op per transfer).

    Raises:
        PipelineError: p2p_ops / p2p_bwd_ops not S - 1 counts >= 1.
    """
    if times.p2p_ops is None and times.p2p_bwd_ops is None:
        return (c.sends + c.recvs).astype(float)
    S = c.S
    fwd = np.ones(S - 1) if times.p2p_ops is None else np.asarray(times.p2p_ops, dtype=float)
    bwd = fwd if times.p2p_bwd_ops is None else np.asarray(times.p2p_bwd_ops, dtype=float)
    if len(fwd) != S - 1 or len(bwd) != S - 1 or (fwd < 1).any() or (bwd < 1).any():
        raise PipelineError(f"StageTimes.p2p_ops {times.p2p_ops} / p2p_bwd_ops {times.p2p_bwd_ops}: need {S - 1} "
                            "counts >= 1 each (P2P ops per transfer, one per stage boundary)")
    cons = np.flatnonzero(c.xfer != S - 1)  # consumers of cross-rank transfers; the producer sends it
    ops = np.where(c.kind[cons] == 0, fwd[np.minimum(c.xfer[cons], S - 2)], bwd[np.minimum(c.xfer[cons], S - 2)])
    out = np.zeros(len(c.kind))
    np.add.at(out, cons, ops)
    np.add.at(out, c.pred[cons, 1], ops)
    return out


def simulate(name: str, p: int, m: int, times: StageTimes, cores: SharedCores | None = None) -> SimResult:
    """Simulate schedule `name` (module docstring) on p ranks with m microbatches at `times`; with `cores`,
    the p ranks share one machine's cores (`planner.sharing`: processor sharing, `times` are solo seconds).

    Raises:
        PipelineError: unknown schedule / refused (p, m) (`action_schedule`), or `times` not of length S.
    """
    return simulate_compiled(compile_schedule(name, p, m), times, cores)


def simulate_actions(sched: ActionSchedule, times: StageTimes, cores: SharedCores | None = None) -> SimResult:
    """Simulate an `ActionSchedule` built elsewhere (validated here; not cached)."""
    sched.validate()
    return simulate_compiled(_compile(sched), times, cores)


def simulate_compiled(c: _Compiled, times: StageTimes, cores: SharedCores | None = None) -> SimResult:
    """The timing pass over a compiled DAG (module docstring; with `cores` the processor-sharing pass of
    `planner.sharing`). Raises PipelineError on lengths != S or per-rank tuples not of length p."""
    S = c.S
    lens = {"fwd_s": len(times.fwd_s), "bwd_input_s": len(times.bwd_input_s),
            "bwd_weight_s": len(times.bwd_weight_s), "p2p_s": len(times.p2p_s) + 1}
    if any(n != S for n in lens.values()):
        raise PipelineError(f"StageTimes lengths {lens} (p2p_s + 1): need {S} model stages")
    f, i, w = (np.asarray(v, dtype=float) for v in (times.fwd_s, times.bwd_input_s, times.bwd_weight_s))
    table = np.stack([f, i, w, i + w])
    dur = table[c.kind, c.stage]
    over = None if times.action_overhead is None else times.action_overhead.for_schedule(c.name)
    start_s = 0.0
    if over is not None:  # module docstring: per-action runtime overhead
        comm = times.action_overhead.comm_thread_s  # the library's threads: the same for every runner
        dur = (dur + np.asarray(over.compute_s())[c.kind] + over.send_s * c.sends + over.recv_s * c.recvs
               + comm * _p2p_ops(c, times))
        start_s = over.step_s
        dur = dur + _size_overhead(c, times, over)
    if times.pool_bytes is not None:  # round 23 / 27: first touch of the live level beyond the kept heap
        per_byte = 0.0 if times.action_overhead is None else times.action_overhead.first_touch_per_byte_s
        dur = dur + first_touch_bytes(c, times) * per_byte
    if times.copy_pack_s is not None:  # BitPipe's exchange packing: CPU on each copy's rank after its last backward
        if len(times.copy_pack_s) != S or any(not x >= 0 for x in times.copy_pack_s):
            raise PipelineError(f"StageTimes.copy_pack_s {times.copy_pack_s}: need {S} seconds >= 0 (one per model "
                                "stage)")
        dur = dur.copy()
        for k, nodes in enumerate(c.last_bwd):
            if len(nodes) > 1:
                for n in nodes:
                    if n < len(dur):
                        dur[n] += float(times.copy_pack_s[k])
    bwd_p2p = times.p2p_s if times.p2p_bwd_s is None else times.p2p_bwd_s
    if len(bwd_p2p) != S - 1:
        raise PipelineError(f"StageTimes.p2p_bwd_s has {len(bwd_p2p)} entries: need {S - 1}")
    p2p = np.where(c.kind == 0, np.append(np.asarray(times.p2p_s, dtype=float), 0.0)[c.xfer],
                   np.append(np.asarray(bwd_p2p, dtype=float), 0.0)[c.xfer])
    N = len(dur)
    wait, tail = (np.zeros(c.p) if v is None else np.asarray(v, dtype=float)
                  for v in (times.grad_sync_s, times.optimizer_s))
    if len(wait) != c.p or len(tail) != c.p:
        raise PipelineError(f"StageTimes.grad_sync_s / optimizer_s have {len(wait)} / {len(tail)} entries: "
                            f"need one per rank ({c.p})")
    if cores is None:
        end, arrive = np.zeros(N + 1), np.zeros(N + 1)
        end[N] = start_s  # "no dependency" is ready when the step's set-up is done
        pr, cross = c.pred, c.xfer != S - 1
        consumer = np.full(N + 1, N, dtype=np.int64)  # producer -> consumer of its cross-rank transfer
        consumer[pr[cross, 1]] = np.flatnonzero(cross)
        for lv in c.levels:
            got = np.where(cross[lv], arrive[lv], end[pr[lv, 1]] + p2p[lv])
            end[lv] = np.maximum(np.maximum(end[pr[lv, 0]], got), end[pr[lv, 2]]) + dur[lv]
            out = consumer[lv]  # one action per rank per level: at most one send per directed link
            out = out[out != N]
            arrive[out] = np.maximum(end[pr[out, 1]], arrive[c.prev_link[out]]) + p2p[out]
        ends = end[:N]
        starts = ends - dur
        rank_end = np.array([ends[idx].max() if len(idx) else 0.0 for idx in c.by_rank])
        finish = rank_end + _overlapped_sync(c, starts, ends, times) + wait + tail
    else:  # the stage syncs' exposed part is read off a first pass's timeline (the same one when nothing
        # runs after the syncs; an optimizer tail sharing the cores may move other ranks' later actions)
        optimizer = None if times.optimizer_s is None else tail
        starts, ends, finish = shared_pass(c.by_rank, c.pred, dur, p2p, wait, optimizer, cores, start_s)
        if times.stage_sync_s is not None:
            starts, ends, finish = shared_pass(c.by_rank, c.pred, dur, p2p,
                                               wait + _overlapped_sync(c, starts, ends, times), optimizer, cores,
                                               start_s)
        end = np.append(ends, 0.0)
    compute_end = float(ends.max())
    busy = np.bincount(c.rank, weights=dur if cores is None else ends - starts, minlength=c.p)
    makespan = float(finish.max())
    if times.copy_sync_s is not None and any(len(nodes) > 1 for nodes in c.last_bwd):
        for k, nodes in enumerate(c.last_bwd):
            makespan = max(makespan, float(max(end[n] for n in nodes)) + float(times.copy_sync_s[k]))
    act = np.ones(S) if times.act_bytes is None else np.asarray(times.act_bytes, dtype=float)
    saved = tuple(float((cnt @ act).max(initial=0.0)) for cnt in c.inflight_counts)
    peak = saved if times.act_bytes is None else peak_held_bytes(c, act, times.p2p_bytes, times.p2p_bwd_bytes)
    per_mb = [float(sum(act[k] for k in ks)) for ks in c.rank_stages]
    floor = 0.0
    if cores is not None:  # round 21: every rank's CPU over the cores (`sharing.cpu_floor_s`)
        host = np.zeros(c.p) if times.host_cpu_s is None else np.asarray(times.host_cpu_s, dtype=float)
        if len(host) != c.p:
            raise PipelineError(f"StageTimes.host_cpu_s has {len(host)} entries: need one per rank ({c.p})")
        floor = cpu_floor_s(np.bincount(c.rank, weights=dur, minlength=c.p) + tail + host, cores)
    return SimResult(makespan, compute_end, tuple(float(b) for b in busy),
                     tuple(1.0 - float(b) / compute_end if compute_end > 0 else 0.0 for b in busy),
                     compute_end - float(busy.max()), peak,
                     tuple(pk / pm if pm > 0 else 0.0 for pk, pm in zip(saved, per_mb)), starts, ends, c, floor)


def peak_held_bytes(c: _Compiled, act_bytes, p2p_bytes=None, p2p_bwd_bytes=None) -> tuple[float, ...]:
    """Per rank, the peak activation bytes its runner holds over the step (`SimResult.peak_inflight_bytes`), the
    one rule the simulator and the search's first pass (`candidates._Context._price_partition`) price memory by:
    the running sum of saved activations (F(x, i) adds model stage k's `act_bytes[k]`, I / B frees them), and for
    BitPipe, whose runner posts every cross-rank receive of the step at its start (round 25, r25i), with those
    receive buffers held until their action runs (`planner.bitpipe.held_with_posted_receives`; `p2p_bytes` /
    `p2p_bwd_bytes`: S - 1 bytes of each boundary's activation / gradient transfer, default the activation's).

    Args:
        c: a compiled schedule (`compile_schedule`); act_bytes: S bytes per model stage and microbatch.
    Returns:
        p floats, bytes. Without p2p_bytes, or for a schedule whose runner posts each receive when its action
        runs (torch's), the saved activations' peak alone.
    """
    act = np.asarray(act_bytes, dtype=float)
    if c.name not in POSTS_RECEIVES_AT_START or p2p_bytes is None:
        return tuple(float((cnt @ act).max(initial=0.0)) for cnt in c.inflight_counts)
    fwd = np.asarray(p2p_bytes, dtype=float)
    bwd = fwd if p2p_bwd_bytes is None else np.asarray(p2p_bwd_bytes, dtype=float)
    return tuple(held_with_posted_receives(cnt @ act, _received_bytes(c, fwd, bwd, idx))
                 for cnt, idx in zip(c.inflight_counts, c.by_rank))


def _received_bytes(c: _Compiled, fwd: np.ndarray, bwd: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Bytes of the cross-rank receive buffers each action `idx` (one rank's, in order) consumes: `fwd` of its
    boundary for a forward, `bwd` for a backward; 0 without a transfer."""
    b = np.minimum(c.xfer[idx], c.S - 2)
    return np.where(c.xfer[idx] == c.S - 1, 0.0, np.where(c.kind[idx] == 0, fwd[b], bwd[b]))
