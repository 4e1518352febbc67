"""Pipeline schedules as closed forms: which rank runs a virtual stage, how many microbatches a rank keeps
in flight, and how long one step takes given per-microbatch stage times.

Notation: p pipeline ranks, m microbatches per step (per data-parallel replica), v virtual stages (model
chunks) per rank, S = p * v stages in pipeline order. Per microbatch, the bottleneck rank spends F seconds in
forward, B in backward-for-inputs and W in backward-for-weights (summed over its v chunks; T = F + B + W).

=================== ===== ============================================ =============================================
schedule            v     step time (pipeline part)                    peak in-flight microbatches of rank r
=================== ===== ============================================ =============================================
"gpipe"             1     (m + p - 1) T                                m
"1f1b"              1     (m + p - 1) T                                min(p - r, m)
"interleaved_1f1b"  >=2   m T + (p - 1) T / v                          min(2(p - r - 1) + (v - 1) p + 1, v m) / v
"zbv"               2     m T + (p - 1) max(0, F + B - 2 W) / 2        min(p, m)
=================== ===== ============================================ =============================================

Sources: GPipe (Huang et al. 2019) and 1F1B/PipeDream-Flush both idle (p - 1) microbatch-slots per step;
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
Sec. 2.2: bubble time (p - 1)(t_f + t_b), i.e. a bubble *ratio* (bubble / ideal) of (p - 1) / m, and
(p - 1) / (v m) for the interleaved schedule whose chunks are v times shorter. The interleaved in-flight count
is Megatron-LM's warm-up count (`num_warmup_microbatches = (p - r - 1) * 2 + (v - 1) * p`, plus the one in the
steady state), counted in chunk-microbatches, each holding 1/v of the rank's activations. Megatron and
torch.distributed.pipelining ask for m divisible by p there. Zero bubble: Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024 (arXiv 2401.10241): splitting backward into B and W lets W fill the bubble; ZB-H2's
bubble is (p - 1)(T_F + T_B - 2 T_W) per stage; ZB-V (2 chunks per rank in a V, torch's
`ScheduleZBVZeroBubble`) reaches it at 1F1B's peak activation memory (the paper's table: bubble 0 and 1x
memory when T_F = T_B = T_W). We apply that bubble to chunk times (F, B, W of the rank halved) and require
m >= 2p, where the V schedule reaches its steady state.

Validity (`invalid_reason`): 1f1b needs m >= p (torch's Schedule1F1B refuses fewer microbatches than stages),
interleaved_1f1b m divisible by p, zbv m >= 2p.

`bubble_fraction` = bubble / (ideal + bubble), the share of the pipeline time a rank idles;
`bubble_ratio` = bubble / ideal (Narayanan's (p - 1) / m).
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model.memory import inflight_microbatches as _cost_model_inflight


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule: its name, virtual stages per rank, and the torch.distributed.pipelining class."""

    name: str
    virtual_stages: int
    torch_class: str


SCHEDULES: dict[str, Schedule] = {s.name: s for s in (
    Schedule("gpipe", 1, "ScheduleGPipe"),
    Schedule("1f1b", 1, "Schedule1F1B"),
    Schedule("interleaved_1f1b", 2, "ScheduleInterleaved1F1B"),
    Schedule("zbv", 2, "ScheduleZBVZeroBubble"),
)}


def get_schedule(name: str) -> Schedule:
    """The `Schedule` called `name`. Raises ValueError listing the known names."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"unknown pipeline schedule {name!r}; use one of {sorted(SCHEDULES)}") from None


def invalid_reason(schedule: str, p: int, m: int, num_blocks: int) -> str | None:
    """Why (schedule, p ranks, m microbatches) cannot run `num_blocks` blocks, or None when it can."""
    v = get_schedule(schedule).virtual_stages
    if p * v > num_blocks:
        return f"{p * v} stages > {num_blocks} blocks"
    if schedule == "1f1b" and m < p:  # torch's Schedule1F1B raises for fewer microbatches than stages
        return "1f1b needs microbatches >= pp"
    if schedule == "interleaved_1f1b" and m % p:
        return "interleaved_1f1b needs microbatches divisible by pp"
    if schedule == "zbv" and m < 2 * p:
        return "zbv needs microbatches >= 2 pp"
    return None


def rank_of_stage(schedule: str, stage: int, p: int) -> int:
    """Pipeline rank (0..p-1) of virtual stage `stage` (0..p*v-1): looped for interleaved, V for zbv."""
    v = get_schedule(schedule).virtual_stages
    if not 0 <= stage < p * v:
        raise ValueError(f"stage={stage}: must be in [0, {p * v}) for {schedule} on {p} ranks")
    if schedule == "zbv" and stage >= p:
        return 2 * p - 1 - stage
    return stage % p


def inflight_microbatches(schedule: str, p: int, m: int, rank: int) -> float:
    """Peak microbatches (in units of the rank's whole per-microbatch activations) rank `rank` keeps saved
    for backward (table in the module docstring; gpipe/1f1b from `cost_model.memory.inflight_microbatches`).

    Raises:
        ValueError: unknown schedule, or counts/rank out of range.
    """
    v = get_schedule(schedule).virtual_stages
    if schedule in ("gpipe", "1f1b"):
        return float(_cost_model_inflight(schedule, p, m, rank))
    if not (p >= 1 and m >= 1 and 0 <= rank < p):
        raise ValueError(f"p={p}, m={m}, rank={rank}: need p, m >= 1 and 0 <= rank < p")
    if schedule == "interleaved_1f1b":
        return min(2 * (p - rank - 1) + (v - 1) * p + 1, v * m) / v
    return float(min(p, m))  # zbv


def pipeline_time_s(schedule: str, p: int, m: int, f_s: float, b_s: float, w_s: float) -> tuple[float, float]:
    """(pipeline seconds, bubble seconds) of one step; f_s, b_s, w_s: the bottleneck rank's per-microbatch
    forward, input-gradient and weight-gradient seconds (module docstring)."""
    v = get_schedule(schedule).virtual_stages
    t = f_s + b_s + w_s
    if schedule in ("gpipe", "1f1b"):
        bubble = (p - 1) * t
    elif schedule == "interleaved_1f1b":
        bubble = (p - 1) * t / v
    else:
        bubble = (p - 1) * max(0.0, f_s + b_s - 2 * w_s) / v
    return m * t + bubble, bubble


def bubble_fraction(pipeline_s: float, bubble_s: float) -> float:
    """bubble / (ideal + bubble): 0 when nothing idles."""
    return bubble_s / pipeline_s if pipeline_s > 0 else 0.0


def bubble_ratio(pipeline_s: float, bubble_s: float) -> float:
    """bubble / ideal (Narayanan et al. 2021's (p - 1) / m)."""
    ideal = pipeline_s - bubble_s
    return bubble_s / ideal if ideal > 0 else 0.0
