"""The data-parallel gradient sync of pipeline stages as the pipeline search prices it (`planner.search`,
step 3): the runtime defers each stage's bucketed all-reduce to the stage's last backward
(`rewriter.grad_sync.deferred_sync`) and starts each bucket while that backward produces its gradients, so the
simulator (`planner.simulate`, `StageTimes.stage_sync_s`) overlaps the sync with it; these functions give the
buckets, the StageTimes fields of a priced partition, and the lower bound the branch and bound uses."""
from __future__ import annotations

import itertools

from cost_model.communication import step_collective_s
from cost_model.topology import CoreSharing, MeshTopology

from ..rewriter.grad_sync import bucket_sizes


def stage_syncs(dp: int, grads_bytes: list[float], topo: MeshTopology, overlap: bool,
                produced: list[list[tuple[float, float]]] | None = None
                ) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]:
    """(bucket seconds, ready fractions) per model stage of its dp gradient all-reduce as the runtime runs it
    (`rewriter.grad_sync`: a first bucket of `FIRST_BUCKET_BYTES`, then `DEFAULT_BUCKET_BYTES` each, one
    all-reduce per bucket, each priced as every collective (`step_collective_s`: its time + the wait for the
    slowest rank, `DeviceSpec.collective_sync_s`), started while the stage's last backward produces the
    gradients; none when dp = 1. `grads_bytes`: per stage, its gradient bytes per device. Without `overlap` one
    all-reduce of the stage's flat gradient buffer after that backward (Megatron-LM's local DDP).

    When a bucket is ready (`ready_fractions`): `produced[k]` lists stage k's segments in the order backward
    runs them (head first, embedding last) as (seconds of that segment in the stage's last backward action,
    gradient bytes it produces), each segment producing its bytes evenly over its seconds; a bucket is ready
    at the fraction of the action's seconds by which its last byte is produced. Without `produced`, bytes
    are taken as produced evenly over the action (right for a stage of identical blocks only: an embedding's
    dense gradient, e.g. 1.05 GB per device of Llama-3-70B's at tp 4, is produced by the last, cheapest op of
    the first stage's backward, so its all-reduce cannot overlap that backward; round 19).

    Stages of equal bytes and equal `produced` get the same (pure) result, computed once per call; each distinct
    bucket size is priced once (round 24: a 1T GPT's partition at pp=128 has ~150 buckets per stage and 128-256
    stages, 4.1M collective prices per search before)."""
    secs, ready = [], []
    per_stage: dict[tuple, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    per_bucket: dict[float, float] = {}
    for k, nbytes in enumerate(map(float, grads_bytes)):
        made = tuple(produced[k]) if produced is not None else ((1.0, nbytes),)
        hit = per_stage.get((nbytes, made))
        if hit is None:
            sizes = [] if dp == 1 or not nbytes else bucket_sizes(nbytes) if overlap else [nbytes]
            for b in sizes:
                if b not in per_bucket:
                    per_bucket[b] = step_collective_s("all_reduce", b, topo, ("dp",))
            hit = per_stage[(nbytes, made)] = (tuple(per_bucket[b] for b in sizes),
                                               ready_fractions(list(itertools.accumulate(sizes)), list(made)))
        secs.append(hit[0])
        ready.append(hit[1])
    return tuple(secs), tuple(ready)


def sync_cpu_s(dp: int, grads_bytes: list[float], sharing: CoreSharing | None, overlap: bool) -> tuple[float, ...]:
    """Per model stage, the process CPU seconds one of its ranks spends in its dp gradient all-reduce (round 21):
    the same buckets as `stage_syncs` (one per `bucket_sizes` bucket, or one flat buffer without `overlap`),
    each `sharing.collective_cpu_s("all_reduce", bytes)` (`CoreSharing.collective_cpu`, measured by calibration
    at the cluster's process count; 0 when not measured, with dp = 1, or on a GPU cluster: `sharing` None). The
    simulator holds the sync as a wait that uses no core; gloo's threads reduce on the shared cores meanwhile,
    so the pipeline search counts this CPU in its floor of the ranks' CPU over the cores
    (`StageTimes.host_cpu_s`, `planner.sharing.cpu_floor_s`)."""
    if sharing is None or dp == 1:
        return tuple(0.0 for _ in grads_bytes)
    return tuple(sum(sharing.collective_cpu_s("all_reduce", b)
                     for b in (bucket_sizes(float(n)) if overlap else [float(n)]) if n) for n in grads_bytes)


def ready_fractions(ends: list[float], produced: list[tuple[float, float]]) -> tuple[float, ...]:
    """For buckets whose last bytes are at cumulative byte offsets `ends` of the backward's gradient order, the
    fraction of the backward action's seconds after which each is ready (`stage_syncs`). `produced`: (seconds,
    bytes) per segment in backward order. A bucket whose bytes come from a segment of no seconds is ready when
    the segments before it are done (floored at 1e-12: the simulator's fractions lie in (0, 1]); with no
    seconds at all, every bucket at the end (1.0)."""
    total_s = sum(t for t, _ in produced)
    if total_s <= 0:
        return tuple(1.0 for _ in ends)
    out, done_s, done_b, it = [], 0.0, 0.0, iter(produced)
    seg_s, seg_b = 0.0, 0.0
    for end in ends:
        while done_b + seg_b < end * (1 - 1e-12) and (nxt := next(it, None)) is not None:
            done_s, done_b = done_s + seg_s, done_b + seg_b
            seg_s, seg_b = nxt
        at = done_s + (seg_s * min(1.0, max(0.0, end - done_b) / seg_b) if seg_b > 0 else seg_s)
        out.append(min(1.0, max(1e-12, at / total_s)))
    return tuple(out)


def exposed_lb(sync: float, window: float, overlap: float) -> float:
    """A lower bound on the seconds a rank's stage syncs of `sync` seconds delay its end, when they overlap a
    window of at most `window` seconds (`planner.simulate`: the last bucket is ready at the window's end; only
    the fraction `overlap`, the device's comm_overlap, of a sync can hide)."""
    return (1 - overlap) * sync + overlap * max(0.0, sync - window)


def sync_times(res: dict, codec: str, overlap: float) -> dict:
    """StageTimes' sync fields of a priced partition (`candidates._Context._price_partition`'s result) with `codec`
    ("none": the plain all-reduces): each stage's sync overlaps its last backward, a bf16 codec's scaled by its
    rank's compressed / plain seconds; PowerSGD's waits after the rank's last action (backward waits for its
    buckets, `steptime`); ZeRO-1's all-gather after the sync."""
    ranks, (syncs, ready) = res["ranks"], res["stage_sync"]
    after = tuple(r["after"] for r in ranks)
    if codec == "powersgd":
        return dict(grad_sync_s=tuple(r["sync"] + r["after"] for r in ranks))
    if codec != "none":
        ratio = [r["sync"] / r["plain_sync"] if r["plain_sync"] > 0 else 1.0 for r in ranks]
        syncs = tuple(tuple(x * ratio[st["rank"]] for x in k) for k, st in zip(syncs, res["stages"]))
    return dict(grad_sync_s=after, stage_sync_s=syncs, stage_sync_ready=ready, sync_overlap=overlap)
