"""BitPipe as an action list: which rank runs which forward / backward of which stage copy and microbatch.

BitPipe (Wu, Chen, Yu, "BitPipe: Bidirectional Interleaved Pipeline Parallelism for Accelerating Large
Models Training", arXiv 2410.19367; reference implementation github.com/wuhouming/BitPipe,
megatron/core/pipeline_parallel/bitpipe_schedule.py and parallel_state.py) fuses two ideas:

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
memory per device; the BitPipe reference code builds 4 model chunks per rank). Device r holds model stages {r, 2p - 1 - r} (down) and
{p - 1 - r, p + r} (up); device p - 1 - r holds the same four model stages with the pipelines swapped, so
the gradient all-reduce of every stage is between the pair (r, p - 1 - r). The down pipeline runs the
first half of the microbatches, the up pipeline the second half (m must be even), as the reference's figure
(docs/BitPipe_images/BitPipe-v.svg: 4 devices, stages s1..s8, microbatches 1-2 down and 3-4 up, "local
copying" at the tip of both V-shaped pipelines) draws it. The paper's bubble formula could not be read here
(only the abstract of arXiv 2410.19367 was reachable): the bubble figures below are this module's own. The gradient exchange of
a stage copy starts eagerly, as soon as its last backward of the step is done (the paper's "eager
gradient synchronization"), and overlaps the rest of the schedule.

Action vocabulary: torch.distributed.pipelining's `_Action(stage_index, computation_type,
microbatch_index)` with computation types F (forward) and B (full backward). Because a model stage has two
copies, the stage index in an action names a COPY: x = d * 2p + s is model stage s of pipeline d
(0 down, 1 up); `bitpipe_placement(p)[x]` is its device. Microbatch indices are global
(0 .. m - 1), each run by exactly one pipeline. The result is the simulator's `ActionSchedule`
(planner/action_schedule.py): action stage x = c * 2p + k is copy c of model stage k.

The order within each rank comes from a list-scheduling simulation with forward 1 and backward 2 time
units per chunk (backward ~ 2x forward, as in Narayanan et al. SC'21): a rank that becomes free runs a ready
forward (deepest stage first, then the oldest microbatch of its pipeline), else a ready backward (oldest
microbatch first); a pipeline injects a new microbatch (stage-0 forward) only while fewer than
`max_inflight` (default p) of its microbatches wait for their stage-0 backward, which bounds activation
memory as 1F1B's p in-flight microbatches do. This rule is ours (the reference implementation hard-codes
per-rank orders); on the unit-time simulation its bubble is close to Chimera's (p - 2) / 2 full-stage
slots halved by the 2-way interleave, i.e. 1.5 (p - 2) units: p=4: 3-7 units, p=8: 10-13, p=16: 30-40
for m = p .. 4p (`list_schedule`'s makespan - 6m). Every rank's order follows one feasible execution (each action
starts after its dependencies ended), so executing each rank's list in order with non-blocking sends and
blocking receives cannot deadlock.
"""
from __future__ import annotations

from torch.distributed.pipelining.schedules import _Action, _ComputationType

from .action_schedule import ActionSchedule

FORWARD = _ComputationType.FORWARD
BACKWARD = _ComputationType.FULL_BACKWARD
FORWARD_UNITS, BACKWARD_UNITS = 1, 2  # per chunk; backward ~ 2x forward (Narayanan et al. SC'21, Sec. 3.5)


def bitpipe_placement(p: int) -> tuple[int, ...]:
    """copy -> rank for p ranks: down stage s on s (s < p) or 2p - 1 - s; up stage s on p - 1 - s or s - p.

    Raises ValueError unless p is even and >= 2 (the two pipelines pair rank r with rank p - 1 - r)."""
    if p < 2 or p % 2:
        raise ValueError(f"bitpipe needs an even number of pipeline ranks >= 2, got pp={p}: the two pipelines "
                         "pair rank r with rank pp - 1 - r. Remedy: pp=2, 4, 8, ...")
    down = [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    return tuple(down + [p - 1 - r for r in down])


def bitpipe_actions(p: int, m: int, *, max_inflight: int | None = None) -> ActionSchedule:
    """The BitPipe action lists of p ranks and m microbatches (module docstring): an `ActionSchedule` named
    "bitpipe" with S = 2p model stages, `copies=2`, stage_to_rank from `bitpipe_placement`.

    Args:
        p: pipeline ranks (even, >= 2); m: microbatches per step (even, >= 2).
        max_inflight: per pipeline, the most microbatches injected and not yet through their stage-0
            backward (default p); >= 1.
    Raises:
        ValueError: p odd or < 2, m odd or < 2, max_inflight < 1.
    """
    orders, _ = list_schedule(p, m, max_inflight=max_inflight)
    return ActionSchedule("bitpipe", {r: tuple(o) for r, o in enumerate(orders)},
                          dict(enumerate(bitpipe_placement(p))), 2 * p, m, copies=2)


def list_schedule(p: int, m: int, *, max_inflight: int | None = None) -> tuple[list[list[_Action]], int]:
    """(per-rank action lists, makespan in units) of the unit-time list schedule (F = 1, B = 2 per chunk;
    module docstring). Raises ValueError as `bitpipe_actions`."""
    copy_to_rank = bitpipe_placement(p)
    if m < 2 or m % 2:
        raise ValueError(f"bitpipe needs an even number of microbatches >= 2 (half run down, half up), got "
                         f"microbatches={m}. Remedy: an even microbatch count")
    cap = p if max_inflight is None else max_inflight
    if cap < 1:
        raise ValueError(f"max_inflight={cap}: must be >= 1 (microbatches in flight per pipeline)")
    num_stages = 2 * p
    half = m // 2
    done: dict[tuple[str, int, int], int] = {}  # (kind, copy, microbatch) -> end time
    pending = {(kind, c, j) for c in range(2 * num_stages) for j in
               (range(half) if c < num_stages else range(half, m)) for kind in "FB"}
    free_at = [0] * p
    inflight = [0, 0]  # per pipeline: microbatches injected whose stage-0 backward has not run
    orders: list[list[_Action]] = [[] for _ in range(p)]
    now = 0
    while pending:
        progressed = False
        for rank in range(p):
            if free_at[rank] > now:
                continue
            may_inject = [n < cap for n in inflight]
            pick = _pick(rank, now, pending, done, copy_to_rank, num_stages, half, may_inject)
            if pick is None:
                continue
            kind, c, j = pick
            pending.discard(pick)
            length = FORWARD_UNITS if kind == "F" else BACKWARD_UNITS
            free_at[rank] = done[pick] = now + length
            if c % num_stages == 0:
                inflight[c // num_stages] += 1 if kind == "F" else -1
            orders[rank].append(_Action(c, FORWARD if kind == "F" else BACKWARD, j))
            progressed = True
        if not progressed:
            later = [t for t in list(free_at) + list(done.values()) if t > now]
            if not later:  # cannot happen for valid arguments; kept to turn a logic error into an error
                raise RuntimeError(f"bitpipe_actions(p={p}, m={m}): no action can run; {len(pending)} left")
            now = min(later)
    return orders, max(free_at)


def _pick(rank: int, now: int, pending: set, done: dict, copy_to_rank: tuple[int, ...], num_stages: int,
          half: int, may_inject: list[bool]) -> tuple[str, int, int] | None:
    """The action rank `rank` starts at `now`: a ready forward (deepest stage first, then the oldest
    microbatch; a stage-0 forward only while its pipeline is below the in-flight cap), else a ready
    backward (oldest microbatch first, then deepest stage)."""
    def finished(key) -> bool:
        return key in done and done[key] <= now

    backward, forward = [], []
    for kind, c, j in pending:
        if copy_to_rank[c] != rank:
            continue
        s = c % num_stages
        age = j - (0 if c < num_stages else half)  # position in its own pipeline
        if kind == "B":
            after = ("B", c + 1, j) if s < num_stages - 1 else ("F", c, j)
            if finished(("F", c, j)) and finished(after):
                backward.append((age, -s, c, j))
        elif (s > 0 and finished(("F", c - 1, j))) or (s == 0 and may_inject[c // num_stages]):
            forward.append((-s, age, c, j))
    if forward:
        *_, c, j = min(forward)
        return "F", c, j
    if backward:
        *_, c, j = min(backward)
        return "B", c, j
    return None
