"""Pipeline schedules: which rank runs a virtual stage, how many microbatches a rank keeps in flight, and
the closed forms the action-list simulator (`planner.simulate`) reproduces. Step times are priced by
simulating each schedule's own action list (`planner.simulate`); the closed forms below are kept as the
simulator's tests (`tests/unit/test_simulate.py`).

Notation: p pipeline ranks, m microbatches per step (per data-parallel replica), v virtual stages (model
chunks) per rank, S = p * v stages in pipeline order. With equal stages, F, B, W are a chunk's
per-microbatch forward, input-gradient and weight-gradient seconds and T = v (F + B + W) a rank's.

=================== ===== ============================================== ===========================================
schedule            v     bubble (simulated = closed form, equal stages)  peak in-flight microbatches of rank r
=================== ===== ============================================== ===========================================
"gpipe"             1     (p - 1) T                                      m
"1f1b"              1     (p - 1) T                                      min(p - r, m)
"interleaved_1f1b"  2     (p - 1) T / v                                  min(2(p - r - 1) + (v - 1) p + 1, v m) / v
"zbv"               2     (p - 1) F at F = B = W (ZB-H1's (p - 1)        min(p, m)
                          (F + B - W) there; not at unequal times)
"dualpipev"         2     (p - 1) F at F = B = W (as zbv); DeepSeek's    min(p, m) + 1/2 (= PP + 1
                          (PP/2 - 1)(F&B + B - 3W) is 2 (p - 1) F: its   stage-microbatches, PP = 2p:
                          pairs wait both inputs, torch's do not          DeepSeek's table)
"bitpipe"           2     (p - 2) F when F = B (ratio (p - 2) /         (3p + 2) / 8 + min(r, p - 1 - r) / 4
                          2 copies, (4m + p - 2)); B = 2F: 2(p - 2) F +  (simulated = closed form, m = k p)
                          units of p (k - 1)(p - 3) F for m = k p, p >= 4
=================== ===== ============================================== ===========================================

Sources: GPipe (Huang et al. 2019) and 1F1B/PipeDream-Flush both idle (p - 1) microbatch-slots per step;
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
Sec. 2.2: bubble time (p - 1)(t_f + t_b), i.e. a bubble *ratio* (bubble / ideal) of (p - 1) / m, and
(p - 1) / (v m) for the interleaved schedule whose chunks are v times shorter. The interleaved in-flight count
is Megatron-LM's warm-up count (`num_warmup_microbatches = (p - r - 1) * 2 + (v - 1) * p`, plus the one in the
steady state), counted in chunk-microbatches, each holding 1/v of the rank's activations. Zero bubble: Qi et
al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv 2401.10241), Sec. 3.1/Table 1: ZB-H1's bubble is
(p - 1)(T_F + T_B - T_W) at 1F1B's activation memory. torch's `ScheduleZBVZeroBubble` list, simulated with
chunk times F = B = W, idles exactly (p - 1)(F + B - W) = (p - 1) F, a bubble ratio (p - 1) / (3 v m): the
ZB-H1 bubble on chunk times. That is also what the authors' own ZB-V list (their greedy scheduler,
sail-sg/zero-bubble-pipeline-parallelism zerobubble/scheduler/zbv.py) idles per step at F = B = W: their
README's "ZBV bubble 0" counts each rank's idle after its first action (the start-up ramp (p - 1) F, which no
schedule avoids within one step, is hidden across steps by their optimizer post-validation), and torch's list
idles 0 in that measure too; at unequal times their list idles less (F, I, W = 2, 1, 1, p = 4: 6 vs 8).
DualPipeV (torch's `ScheduleDualPipeV`, after DeepSeek-V3, arXiv 2412.19437) runs its OVERLAP_F_B pairs back to
back without a custom overlap function: same bubble as zbv with equal times, half a chunk-microbatch more in
flight. torch's DualPipeV list is DeepSeek's `DualPipeV.step` order action for action
(github.com/deepseek-ai/DualPipe, dualpipe/dualpipev.py; tests/unit/test_simulate.py), but DeepSeek's runtime
starts an overlapped F&B pair only when both its inputs are there, which gives its README's bubble (PP/2 - 1)(F&B
+ B - 3W) (B a full backward; PP = 2p stages) for F <= I and W <= I: 2 (p - 1) F at F = I = W, twice what torch's
runtime (each half waits only its own input) idles. Neither ZB-H1's form nor DeepSeek's is exact at unequal times
(e.g. p = 4, m = 8, F, I, W = 2, 1, 1: zbv 8, form 6); the planner prices the simulated lists, never the forms.
Activations: ZBV 1x 1F1B (sail-sg/zero-bubble-pipeline-parallelism README table), DualPipeV PP + 1
stage-microbatches (DeepSeek-V3 report Table 2); interleaved 1F1B's rank 0 holds Korthikanti et al. 2022 Sec.
4.2.3's L (1 + (p - 1) / (p v)) layers' activations (m >= its warm-up).

BitPipe (Wu et al., arXiv 2410.19367; `planner.bitpipe`): two pipelines in opposite directions, each
over 2p model stages in a V; rank r holds model stages {r, 2p-1-r} of the down copy and {p-1-r, p+r} of
the up copy (two weight copies per model stage, `copies` below); microbatches in units of p, half down and
half up; the bubble and in-flight closed forms are the simulator's on the paper's figures' order
(`planner.bitpipe` docstring: the paper's own bubble table could not be read here). Round 18 derives a lower
bound by hand from the placement alone, (p / 2 - 1)(F + B) (`bitpipe_bubble_bound_s`), which the order meets
at F = B and exceeds otherwise.

Validity (`invalid_reason`): bitpipe needs an even pp >= 2 and m a multiple of pp; 1f1b needs m >= p
(torch's Schedule1F1B refuses fewer microbatches than stages), interleaved_1f1b m divisible by p, zbv
m >= 2p, dualpipev m >= 2p (torch's ScheduleDualPipeV: m >= stages).

`bubble_fraction` = bubble / (ideal + bubble), the share of the pipeline time a rank idles;
`bubble_ratio` = bubble / ideal (Narayanan's (p - 1) / m).
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model.hardware import OWN_RUNNER_SCHEDULES
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
    Schedule("dualpipev", 2, "ScheduleDualPipeV"),
    Schedule("bitpipe", 2, "BitPipe (planner.bitpipe lists; runtime.bitpipe)"),
)}
V_PLACED = ("zbv", "dualpipev")  # stage k and 2p - 1 - k on one rank
# run by our own runner (runtime.bitpipe), not a torch schedule; one set with the cost model, which prices their
# actions at that runner's measured costs (`PipelineActionCost.for_schedule`)
RUNNER_SCHEDULES = OWN_RUNNER_SCHEDULES


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
    if schedule in V_PLACED and m < 2 * p:
        return f"{schedule} needs microbatches >= 2 pp"
    if schedule == "bitpipe" and (p < 2 or p % 2 or m % p):
        return "bitpipe needs an even pp >= 2 and an even microbatch count, a multiple of pp"
    return None


def buffer_copies_reason(schedule: str, mutated: dict[str, str]) -> str | None:
    """Why `schedule` cannot run a model whose forward updates buffers (or parameters) in place (`mutated`: FQN ->
    the node writing it, `TracedGraph.mutated_state`), or None when it can.

    One device keeps such a buffer (a counter, an EMA, BatchNorm's running statistics) once and updates it on
    microbatch 0, 1, ..., m - 1 in turn. A schedule holding ONE copy of each stage does the same (each stage
    runs its forwards in microbatch order). BitPipe holds two copies of every stage (ranks r and p - 1 - r),
    each updating its own buffers on half of the microbatches; no merge after the step equals the sequential
    update (an EMA's microbatch j reads the value after microbatches 0..j - 1, which the other copy computed),
    so it is refused instead of run inexactly."""
    if copies(schedule) == 1 or not mutated:
        return None
    fqn, node = next(iter(mutated.items()))
    more = f" (and {len(mutated) - 1} more)" if len(mutated) > 1 else ""
    return (f"{schedule} keeps {copies(schedule)} copies of every stage, but the forward updates {fqn!r} in "
            f"place (node {node}){more}: the copies would diverge from one device's sequential update. Remedy: "
            "another schedule (1f1b, zbv, interleaved_1f1b, dualpipev, gpipe keep one copy)")


def copies(schedule: str) -> int:
    """Pipelines through the model: 2 for bitpipe (each model stage held twice), else 1."""
    return 2 if schedule == "bitpipe" else 1


def ranks_of_stage(schedule: str, stage: int, p: int) -> tuple[int, ...]:
    """The pipeline rank of each copy of model stage `stage` (`rank_of_stage` for one copy; bitpipe: the
    down copy's V rank and the up copy's mirrored rank, `planner.bitpipe.bitpipe_placement`)."""
    if schedule == "bitpipe":
        down = rank_of_stage(schedule, stage, p)
        return down, p - 1 - down
    return (rank_of_stage(schedule, stage, p),)


def rank_of_stage(schedule: str, stage: int, p: int) -> int:
    """Pipeline rank (0..p-1) of virtual stage `stage` (0..p*v-1): looped for interleaved, V for zbv and
    dualpipev and for bitpipe's down copy (`ranks_of_stage` gives both bitpipe copies)."""
    v = get_schedule(schedule).virtual_stages
    if not 0 <= stage < p * v:
        raise ValueError(f"stage={stage}: must be in [0, {p * v}) for {schedule} on {p} ranks")
    if (schedule in V_PLACED or schedule == "bitpipe") and stage >= p:
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
    if schedule == "bitpipe":
        return (3 * p + 2) / 8 + min(rank, p - 1 - rank) / 4  # the simulated peak, m = k p (module docstring)
    return min(p, m) + (0.5 if schedule == "dualpipev" else 0.0)  # zbv, dualpipev


def bitpipe_bubble_bound_s(p: int, m: int, f: float, b: float) -> float:
    """A lower bound on any BitPipe step's bubble, derived by hand here (round 18; NOT the paper's table, which
    could not be read: `planner.bitpipe` docstring): (p / 2 - 1)(F + B) seconds, i.e. a step of at least
    (2m + p / 2 - 1)(F + B), for p even ranks, m = k p microbatches, every chunk (1 / 2p of the model) taking
    F seconds forward and B backward, no transfer time (the assumptions of Chimera's bubble count, Li & Hoefler
    SC'21 Sec. 3, which BitPipe's analysis builds on).

    Derivation (the V-shaped placement of `planner.bitpipe`: down stage s on rank s for s < p, 2p - 1 - s
    after; up stage s on rank p - 1 - s for s < p, s - p after; h = p / 2):
    1. Work: each microbatch runs 2p chunks of its pipeline, F then B each; each rank holds 4 chunks (2 per
       pipeline) and each chunk serves the m / 2 microbatches of its pipeline, so every rank computes
       4 (m / 2)(F + B) = 2m (F + B).
    2. Ramp: rank h - 1 holds down stages h - 1 and p + h and up stages h and p + h - 1. Its earliest input
       is the down pipeline's first microbatch after down stages 0 .. h - 2 (ranks 0 .. h - 2, one forward
       each, in sequence): it cannot start before (h - 1) F (the up pipeline reaches it after h F).
    3. Drain: for every microbatch, a rank's first-half chunk (down stage h - 1 or up stage h) runs its
       backward after its second-half chunk's (the gradient flows from stage 2p - 1 to 0), so rank h - 1's
       last action is a first-half backward, after which down stages h - 2 .. 0 (or up stages h - 1 .. 0)
       still run h - 1 (or h) backwards in sequence: at least (h - 1) B more.
    So the step lasts at least (h - 1) F + 2m (F + B) + (h - 1) B, and rank h - 1 (every rank does 2m (F + B))
    idles at least (h - 1)(F + B) = (p / 2 - 1)(F + B). With F = B that is (p - 2) F, a bubble ratio
    (p - 2) / (4m + p - 2) of the step (Chimera's (D - 2) / (2N + D - 2) with each microbatch's work split
    over twice the chunks); the authors' order (`planner.bitpipe`) attains it exactly at F = B (simulated,
    tests/unit/test_simulate.py) and idles more otherwise (m = p: (p - 2) max(F, B), e.g. 2 (p - 2) F at
    B = 2F, the figures' drawing; the bound there is 1.5 (p - 2) F).

    Raises:
        ValueError: p odd or < 2, m not a positive multiple of p, or F / B negative.
    """
    if p < 2 or p % 2 or m < p or m % p or f < 0 or b < 0:
        raise ValueError(f"bitpipe bubble bound: need an even p >= 2, m a positive multiple of p and F, B >= 0; "
                         f"got p={p}, m={m}, F={f}, B={b}")
    return (p / 2 - 1) * (f + b)


def bubble_fraction(pipeline_s: float, bubble_s: float) -> float:
    """bubble / (ideal + bubble): 0 when nothing idles."""
    return bubble_s / pipeline_s if pipeline_s > 0 else 0.0


def bubble_ratio(pipeline_s: float, bubble_s: float) -> float:
    """bubble / ideal (Narayanan et al. 2021's (p - 1) / m)."""
    ideal = pipeline_s - bubble_s
    return bubble_s / ideal if ideal > 0 else 0.0
