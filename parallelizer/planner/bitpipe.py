"""BitPipe as an action list: which rank runs which forward / backward of which stage copy and microbatch.

BitPipe (Wu, Chen, Yu, "BitPipe: Bidirectional Interleaved Pipeline Parallelism for Accelerating Large
Models Training", arXiv 2410.19367; reference implementation github.com/wuhouming/BitPipe,
megatron/core/pipeline_parallel/bitpipe_schedule.py, figures docs/BitPipe_images/BitPipe-v.svg and
scale-moreb.svg) fuses two ideas:

- bidirectional pipelines (Chimera, Li & Hoefler SC'21): two pipelines over the same p devices in
  opposite directions, the "down" pipeline entering at device 0 and the "up" pipeline at device p - 1;
  every stage therefore has TWO weight copies, one per pipeline, whose gradients are all-reduced between
  the two devices holding them (the reference's "bd" group pairs pipeline ranks j and p - 1 - j);
- interleaved virtual stages with a V-shaped placement: each pipeline cuts the model into 2p stages, and
  stage s of the down pipeline runs on device s for s < p and on device 2p - 1 - s after that, so the
  hand-off between stages p - 1 and p is a local copy, not a transfer. The up pipeline is the mirror
  image: stage s on device p - 1 - s for s < p, on device s - p after that.

So each of the p devices holds 4 chunks of 1 / (2p) of the model (2 per pipeline), i.e. 2 / p of the
model's weights: twice a 1F1B stage, as in Chimera (Li & Hoefler SC'21, Table 1: 2 M_theta of weight
memory per device; the reference builds 4 model chunks per rank). Device r holds model stages {r, 2p - 1 - r}
(down) and {p - 1 - r, p + r} (up); device p - 1 - r holds the same four model stages with the pipelines
swapped, so the gradient all-reduce of every stage is between the pair (r, p - 1 - r). The gradient
exchange of a stage copy starts eagerly, as soon as its last backward of the step is done (the paper's
"eager gradient synchronization"), and overlaps the rest of the schedule.

Microbatches come in units of p (the schedule's basic unit, BitPipe-v.svg: p = 4 devices, microbatches 1-2
down and 3-4 up): unit u's microbatches u p .. u p + p/2 - 1 run down, u p + p/2 .. u p + p - 1 run up,
so m must be a multiple of p (the reference raises otherwise). Larger m concatenate units directly
(scale-moreb.svg (b), "direct concatenation", no flush between units).

Per-rank order (`bitpipe_actions`, written from the reference schedule's structure and checked against the
two figures): with h = p / 2, rank r calls its chunks A (the first-half stage of the pipeline that enters
on its side: down stage r for r < h, up stage p - 1 - r otherwise), A' (the other pipeline's first-half
stage), Z (A's pipeline's second-half stage) and Z' (A''s second-half stage), and a = h - r for r < h, r - h + 1
otherwise (1 .. h: how many microbatches of its own pipeline reach it before the other pipeline's). A unit's
forwards run in the order A[:a], then (A'[i], A[a + i]) for i < h - a, then (A'[h - a + i], Z'[i]) for i < a,
then (Z[i], Z'[a + i]) for i < h - a, then Z[h - a:] (chunk[i]: the unit's i-th microbatch of that chunk's
pipeline); its backwards in the same pattern with (A, A', Z, Z') replaced by (Z, Z', A, A'). Forwards and
backwards interleave as in Megatron's 1F1B: w = p + h + min(r, p - 1 - r) warm-up forwards, then u = 2p - w
forward/backward pairs; between two units the rank runs the unit's remaining backwards, then (u > 1) one
forward of the next unit followed by u - 1 forward/backward pairs (scale-moreb.svg (b), ranks 0 and p - 1:
"b1 F5 F6 b2"; the reference's loop, as we read it, runs "b1 F5 b2 F6": 54 instead of 53 units at p = 4,
m = 8 with B = 2F), then the rest of the
next unit's w warm-up forwards; after the last unit its u pairs and the remaining backwards.

Bubble (tests/unit/test_simulate.py; the simulator, no transfer time, equal chunks): the paper's text
(its bubble table) could not be read here, only its abstract; the two figures could. With a chunk's forward
F and backward B equal (Chimera's convention behind its bubble ratio (D - 2) / (2N + D - 2), Li & Hoefler
SC'21 Sec. 3), every rank idles exactly (p - 2) F for every m = k p: bubble / step = (D - 2) / (4N + D - 2)
with D = p devices, N = m microbatches (4N chunk-passes of work per device). With B = 2F (the figures'
drawing) the bubble is 2 (p - 2) F at m = p (BitPipe-v.svg: 4 idle units of 28 at p = 4) and grows by
(p - 3) F per further unit for p >= 4 (scale-moreb.svg (b): 5 idle units of 53 at p = 4, m = 8); p = 2
idles nothing. The runtime runs full backward (B, no input/weight split), which is what both analyses assume.

Action vocabulary: torch.distributed.pipelining's `_Action(stage_index, computation_type,
microbatch_index)` with computation types F (forward) and B (full backward). Because a model stage has two
copies, the stage index in an action names a COPY: x = d * 2p + s is model stage s of pipeline d
(0 down, 1 up); `bitpipe_placement(p)[x]` is its device. Microbatch indices are global (0 .. m - 1), each
run by exactly one pipeline. The result is the simulator's `ActionSchedule` (planner/action_schedule.py).
Every rank's order is replayed by the simulator without deadlock (each action starts after its
dependencies ended), so executing each rank's list in order with non-blocking sends and blocking receives
cannot deadlock.
"""
from __future__ import annotations

import numpy as np
from torch.distributed.pipelining.schedules import _Action, _ComputationType

from .action_schedule import ActionSchedule

FORWARD = _ComputationType.FORWARD
BACKWARD = _ComputationType.FULL_BACKWARD


def bitpipe_placement(p: int) -> tuple[int, ...]:
    """copy -> rank for p ranks: down stage s on s (s < p) or 2p - 1 - s; up stage s on p - 1 - s or s - p.

    Raises ValueError unless p is even and >= 2 (the two pipelines pair rank r with rank p - 1 - r)."""
    if p < 2 or p % 2:
        raise ValueError(f"bitpipe needs an even number of pipeline ranks >= 2, got pp={p}: the two pipelines "
                         "pair rank r with rank pp - 1 - r. Remedy: pp=2, 4, 8, ...")
    down = [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    return tuple(down + [p - 1 - r for r in down])


def bitpipe_actions(p: int, m: int) -> ActionSchedule:
    """The BitPipe action lists of p ranks and m microbatches (module docstring): an `ActionSchedule` named
    "bitpipe" with S = 2p model stages, `copies=2`, stage_to_rank from `bitpipe_placement`.

    Args:
        p: pipeline ranks (even, >= 2); m: microbatches per step (a multiple of p).
    Raises:
        ValueError: p odd or < 2; m not a positive multiple of p.
    """
    placement = bitpipe_placement(p)
    if m < p or m % p:
        raise ValueError(f"bitpipe needs an even microbatch count that is a multiple of pp={p} (units of pp "
                         f"microbatches, half down and half up), got microbatches={m}. Remedy: microbatches="
                         f"{p * max(1, -(-m // p))}")
    orders = {r: tuple(_rank_order(p, m, r)) for r in range(p)}
    return ActionSchedule("bitpipe", orders, dict(enumerate(placement)), 2 * p, m, copies=2)


def _rank_order(p: int, m: int, r: int) -> list[_Action]:
    """Rank r's forwards and backwards in run order (module docstring, "Per-rank order")."""
    h, S = p // 2, 2 * p
    own_down = r < h
    a = h - r if own_down else r - h + 1
    down_first, up_first, down_second, up_second = r, S + p - 1 - r, S - 1 - r, S + p + r
    A, A2 = (down_first, up_first) if own_down else (up_first, down_first)
    Z, Z2 = (down_second, up_second) if own_down else (up_second, down_second)

    def unit(u: int, x: int, x2: int, z: int, z2: int, kind) -> list[_Action]:
        def mb(c: int, i: int) -> _Action:  # the unit's i-th microbatch of chunk c's pipeline
            return _Action(c, kind, u * p + (h if c >= S else 0) + i)
        seq = [mb(x, i) for i in range(a)]
        for i in range(h - a):
            seq += [mb(x2, i), mb(x, a + i)]
        for i in range(a):
            seq += [mb(x2, h - a + i), mb(z2, i)]
        for i in range(h - a):
            seq += [mb(z, i), mb(z2, a + i)]
        return seq + [mb(z, i) for i in range(h - a, h)]

    units = m // p
    fwd = [act for u in range(units) for act in unit(u, A, A2, Z, Z2, FORWARD)]
    bwd = [act for u in range(units) for act in unit(u, Z, Z2, A, A2, BACKWARD)]
    warm = p + h + min(r, p - 1 - r)
    pairs = 2 * p - warm
    order, f, b = fwd[:warm], warm, 0
    for _ in range(units - 1):
        for _ in range(pairs):
            order += [fwd[f], bwd[b]]
            f, b = f + 1, b + 1
        order += bwd[b:b + warm - pairs + 1]
        b += warm - pairs + 1
        if pairs > 1:
            order.append(fwd[f])
            f += 1
        for _ in range(pairs - 1):
            order += [fwd[f], bwd[b]]
            f, b = f + 1, b + 1
        nxt = f + warm - pairs if pairs > 1 else f + warm
        order += fwd[f:nxt]
        f = nxt
    for _ in range(pairs):
        order += [fwd[f], bwd[b]]
        f, b = f + 1, b + 1
    return order + bwd[b:]


def held_with_posted_receives(saved_after, received) -> float:
    """Peak bytes one BitPipe rank holds over its action list when every cross-rank receive of the step is posted
    at the step's start (`runtime.bitpipe.BitPipeRunner._post_receives`, round 25 r25i), in the caller's units.

    Args:
        saved_after: (n,) bytes saved for backward after each of the rank's n actions, in list order (a forward
            of model stage k adds A_k until its backward).
        received: (n,) bytes of the receive buffers each action consumes (its stage's boundary tensors from
            another rank; 0 for none or a same-rank hand-off).
    Returns:
        max(sum(received), max_i saved_after[i] + sum(received[i + 1:])): every buffer is held from the step's
        start until its action has run. A forward's buffer then is the stage's input (A_k counts it where the
        stage saves it: `planner.local_storage`, a received value is a new tensor); a backward's is freed.
    Raises:
        ValueError: the two sequences differ in length, or a received size is negative.
    """
    saved, got = np.asarray(saved_after, dtype=float), np.asarray(received, dtype=float)
    if saved.shape != got.shape or saved.ndim != 1 or (got < 0).any():
        raise ValueError(f"held_with_posted_receives: need two sequences of one entry per action with received "
                         f"bytes >= 0, got {saved.shape} saved and {got.shape} received")
    pending = got.sum() - np.cumsum(got)  # after action i: the buffers of the actions still to run
    return float(max(got.sum(), (saved + pending).max(initial=0.0)))
