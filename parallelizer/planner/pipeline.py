"""`PipelinePlan`: the answer of `parallelizer.plan_pipeline` (search in `search.py`).

A mesh ("pp", "dp", "tp") (ranks row-major, tp innermost so a tensor-parallel group sits in one node, then
data parallel, then pipeline outermost, as Megatron-LM lays them out), a schedule with its microbatches, the
stages (virtual stages in pipeline order: which blocks, whether they hold the embedding "pre" / the head
"post", which pipeline rank and global ranks run them, their nodes, time and memory), the step-time
breakdown, throughput and MFU, per distinct stage kind a summary of the intra-stage ILP plan, and a search
report. `to_json()` is deterministic: sorted keys, floats rounded to 10 significant digits, wall-clock
times left out unless asked for.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..core.mesh import MeshSpec
from .compression import compression_line
from .boundary import BoundaryCompression
from .plan import Plan, _round
from .stages import partition_text

PIPELINE_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One (virtual) stage.

    Attributes:
        index: position in the pipeline (0 .. pp * v - 1).
        pp_rank: the pipeline rank running it (interleaved: index % pp; zbv: a V).
        first_block, last_block: inclusive indices of its blocks in the repeated-block group.
        includes_pre, includes_post: holds the ops before the first block / after the last block.
        ranks: global ranks running it (dp x tp of them).
        nodes: names of the traced nodes it owns (parameter placeholders of tied weights in two stages).
        fwd_s, bwd_s, wgrad_s: per microbatch seconds of forward, input-gradient and weight-gradient work
            (compute, tensor-parallel collectives and its point-to-point sends).
        state_bytes: parameters + gradients + optimizer state per device (optimizer / dp with ZeRO-1).
        activation_bytes: saved activations of ONE microbatch per device (after recomputation).
        recompute: the activation-recomputation mode of its blocks (`planner.recompute`: "none",
            "selective" or "full"; blocks a user checkpointed keep their own mode); its extra forward
            seconds are in `bwd_s`.
        lean: its intra-stage layout is the memory-lean one (`ilp.solve_lean`: sequence-parallel-like), which
            the search takes where it fits more blocks than the time-optimal layout and so is faster.
    """

    index: int
    pp_rank: int
    first_block: int
    last_block: int
    includes_pre: bool
    includes_post: bool
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    fwd_s: float
    bwd_s: float
    wgrad_s: float
    state_bytes: int
    activation_bytes: int
    recompute: str = "none"
    lean: bool = False
    contents: str = ""  # with layers of several kinds (`segments.Segments.block_kinds`): its layers' kinds

    @property
    def num_blocks(self) -> int:
        return self.last_block - self.first_block + 1

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.wgrad_s

    @property
    def kind(self) -> str:
        """Stages of one kind share their intra-stage solve: "6 blocks", "6 blocks + pre", ...; with layers of
        several kinds the kinds they hold, e.g. "2 blocks (model.layers.*, {model.layers.1,model.layers.3})"."""
        return (f"{self.num_blocks} blocks" + (f" ({self.contents})" if self.contents else "")
                + (" + pre" if self.includes_pre else "")
                + (" + post" if self.includes_post else "") + (", lean layout" if self.lean else ""))


@dataclass(frozen=True, slots=True)
class RankCost:
    """One pipeline rank: per-microbatch seconds of its stages, peak in-flight microbatches, memory."""

    pp_rank: int
    stages: tuple[int, ...]
    time_s: float
    inflight_microbatches: float
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class StageKindSummary:
    """The intra-stage plan of one stage kind (per microbatch, per device): seconds of compute and of each
    collective kind, and memory by category at the rank's peak."""

    kind: str
    stages: tuple[int, ...]
    compute_s: float
    comm_s: dict[str, float]
    memory_bytes: dict[str, int]


@dataclass(frozen=True, slots=True)
class SearchReport:
    """How the outer search went: candidates enumerated, excluded (with reasons and counts), pruned by the
    lower bound, priced, infeasible for memory; ILP solves (one per tp, two more per tp whose memory-lean layout
    was priced, `ilp.solve_lean`); wall-clock seconds."""

    candidates: int
    excluded: dict[str, int]
    pruned: int
    evaluated: int
    infeasible_memory: int
    ilp_solves: int
    time_s: float | None = None
    simulated: int = 0  # partitions priced exactly by simulating the schedule's action list


@dataclass(frozen=True, slots=True)
class ScheduleAlternative:
    """Why this schedule: the winner or the best candidate of another schedule, as the search priced it.

    Attributes:
        schedule, pp, dp, tp, microbatches: the candidate.
        step_s: simulated step seconds (None: not simulated, see reason).
        bubble_fraction: idle share of the bottleneck rank's pipeline time (simulated).
        peak_memory_bytes: the largest pp rank's bytes per device.
        p2p_bytes: activation + gradient bytes the busiest device sends to other pipeline ranks per step.
        reason: one line: "chosen: ..." or how it compares with the winner.
    """

    schedule: str
    pp: int
    dp: int
    tp: int
    microbatches: int
    step_s: float | None
    bubble_fraction: float | None
    peak_memory_bytes: int | None
    p2p_bytes: int | None
    reason: str

    def line(self) -> str:
        """`alternative_line` of this one."""
        return alternative_line(asdict(self))


def alternative_line(a: dict) -> str:
    """`schedule (pp, dp, tp, m): step, bubble, memory, p2p - reason` of a `ScheduleAlternative` as a dict (as
    the plan JSON keeps it in model.search.alternatives)."""
    what = (f"{a['step_s'] * 1e3:.1f} ms, bubble {a['bubble_fraction']:.1%}, peak {a['peak_memory_bytes'] / 1e9:.1f}"
            f" GB, p2p {a['p2p_bytes'] / 1e9:.2f} GB" if a["step_s"] is not None else "-")
    return f"{a['schedule']} (pp={a['pp']} dp={a['dp']} tp={a['tp']}, m={a['microbatches']}): {what} - {a['reason']}"


@dataclass(frozen=True)
class PipelinePlan:
    """See the module docstring. Times are seconds, memory bytes per device, throughput per GPU.

    step_breakdown_s keys: "pipeline" (the simulated compute makespan of the schedule's action list,
    `planner.simulate`), "bubble" (its idle part on the busiest rank), "dp_grad_sync" (the exposed part of
    the ranks' gradient all-reduces over dp, each stage's started during its last backward: `planner.simulate`), "tied_grad_sync" (embedding
    gradient exchanged between the first and last rank); step_time_s = pipeline + dp_grad_sync + tied_grad_sync.
    partition: which stage boundaries won for the chosen candidate: "dp" (the balancing dynamic program; not the
        mesh axis) or "uniform" (even); text: `stages.partition_text`.
    intra_stage_plan: the tp-axis ILP `Plan` of the whole graph (layouts per node; see `stage_layouts`),
    kept on the object but not in the JSON (its solver summary is, in `intra_stage_solver`).
    """

    mesh: MeshSpec
    schedule: str
    torch_schedule: str
    virtual_stages: int
    global_batch: int
    num_microbatches: int
    microbatch_size: int
    trace_batch: int
    stages: tuple[StageSpec, ...]
    ranks: tuple[RankCost, ...]
    bubble_fraction: float
    bubble_ratio: float
    step_time_s: float
    step_breakdown_s: dict[str, float]
    flops_per_step: int
    tflops_per_gpu: float
    mfu: float
    peak_flops_per_s: float
    device: str
    stage_kinds: tuple[StageKindSummary, ...]
    intra_stage_solver: dict
    search: SearchReport
    block_group: str
    partition: str = "dp"
    config: dict = field(default_factory=dict)
    compression: dict = field(default_factory=dict)
    boundary_compression: "BoundaryCompression | None" = None  # per stage boundary codec (`planner.boundary`)
    alternatives: tuple[ScheduleAlternative, ...] = ()  # the winner first, then each other schedule's best
    intra_stage_plan: Plan | None = field(default=None, repr=False, compare=False)
    # the simulation's seconds per priced second of a stage computing alone (`sharing.pipeline_cores`' scale:
    # ranks sharing a CPU's cores); 1.0 without core sharing (every GPU preset). Not in this JSON: the unified
    # Plan records it in model.search (`api._search_record`), where `show` reads it
    stage_scale: float = 1.0

    @property
    def pp(self) -> int:
        return self.mesh.size("pp")

    @property
    def dp(self) -> int:
        return self.mesh.size("dp")

    @property
    def tp(self) -> int:
        return self.mesh.size("tp")

    @property
    def memory_bytes(self) -> int:
        """Peak memory per device over all ranks."""
        return max(r.memory_bytes for r in self.ranks)

    def stage_layouts(self, index: int) -> dict:
        """The intra-stage ILP's `NodePlan` (layouts on the "tp" axis) of every node of stage `index`."""
        if self.intra_stage_plan is None:
            raise ValueError("this PipelinePlan was loaded without its intra-stage Plan; re-plan to get layouts")
        return {n: self.intra_stage_plan.nodes[n] for n in self.stages[index].nodes
                if n in self.intra_stage_plan.nodes}

    # --- JSON ---------------------------------------------------------------------------------------
    def to_dict(self, include_timing: bool = False) -> dict:
        search = asdict(self.search)
        if not include_timing:
            search["time_s"] = None
        d = {f: getattr(self, f) for f in (
            "schedule", "torch_schedule", "virtual_stages", "global_batch", "num_microbatches", "microbatch_size",
            "trace_batch", "bubble_fraction", "bubble_ratio", "step_time_s", "step_breakdown_s", "flops_per_step",
            "tflops_per_gpu", "mfu", "peak_flops_per_s", "device", "intra_stage_solver", "block_group", "partition",
            "config")}
        d.update(format_version=PIPELINE_FORMAT_VERSION, mesh=self.mesh.to_dict(),
                 stages=[asdict(s) for s in self.stages], ranks=[asdict(r) for r in self.ranks],
                 stage_kinds=[asdict(k) for k in self.stage_kinds], search=search,
                 alternatives=[asdict(a) for a in self.alternatives])
        if self.compression:
            d["compression"] = dict(self.compression)
        if self.boundary_compression is not None:
            d["boundary_compression"] = self.boundary_compression.to_dict()
        return _round(d)

    def to_json(self, include_timing: bool = False, indent: int | None = 1) -> str:
        """Deterministic JSON (module docstring)."""
        return json.dumps(self.to_dict(include_timing), sort_keys=True, indent=indent)

    # --- human ---------------------------------------------------------------------------------------
    def summary(self) -> str:
        """Text summary: mesh, schedule, step time and its parts, throughput, stages, ranks, search."""
        b = self.step_breakdown_s
        gb = 1e9
        lines = [
            f"PipelinePlan on mesh {self.mesh}: {self.schedule} ({self.torch_schedule}, v={self.virtual_stages}), "
            f"{self.num_microbatches} microbatches x {self.microbatch_size} samples (global batch {self.global_batch})",
            f"estimated step {self.step_time_s * 1e3:.1f} ms = pipeline {b['pipeline'] * 1e3:.1f} ms (bubble "
            f"{b['bubble'] * 1e3:.1f} ms, {self.bubble_fraction:.1%} of it) + dp grad sync {b['dp_grad_sync'] * 1e3:.1f}"
            f" ms + tied grad sync {b['tied_grad_sync'] * 1e3:.1f} ms",
            f"throughput {self.tflops_per_gpu:.1f} TFLOP/s per GPU = {self.mfu:.1%} MFU of {self.device} "
            f"({self.peak_flops_per_s / 1e12:.0f} TFLOP/s peak); {self.flops_per_step / 1e15:.1f} PFLOP per step",
            f"stages ({len(self.stages)}, unit {self.block_group}, {partition_text(self.partition)}):",
        ]
        for s in self.stages:
            lines.append(f"  {s.index:3d} rank {s.pp_rank:3d}: blocks {s.first_block:3d}-{s.last_block:3d}"
                         f"{' +pre' if s.includes_pre else ''}{' +post' if s.includes_post else ''}  "
                         f"{s.time_s * 1e3:8.2f} ms/microbatch  state {s.state_bytes / gb:6.2f} GB  "
                         f"act/mb {s.activation_bytes / gb:6.2f} GB  recompute {s.recompute}"
                         + ("  lean layout" if s.lean else ""))
        modes = {}
        for s in self.stages:
            modes[s.recompute] = modes.get(s.recompute, 0) + s.num_blocks
        lines.append("recomputation: " + ", ".join(f"{m} on {n} blocks" for m, n in sorted(modes.items())))
        lines += self.boundary_compression.lines() if self.boundary_compression is not None else []
        peak = max(self.ranks, key=lambda r: r.memory_bytes)
        lines.append(f"peak memory {peak.memory_bytes / gb:.2f} GB on pp rank {peak.pp_rank} "
                     f"({peak.inflight_microbatches:g} microbatches in flight)")
        if self.compression:
            lines.append(compression_line(self.compression))
        s = self.search
        lines.append(f"search: {s.candidates} candidates, {sum(s.excluded.values())} excluded, {s.pruned} pruned "
                     f"by bound, {s.evaluated} priced ({s.infeasible_memory} over memory), {s.ilp_solves} ILP solves"
                     + f", {s.simulated} simulated" + (f", {s.time_s:.1f} s" if s.time_s is not None else ""))
        if self.alternatives:
            lines.append("why this schedule (simulated step, bubble, peak memory, p2p bytes the busiest device sends):")
            lines += [f"  {a.line()}" for a in self.alternatives]
        return "\n".join(lines)
