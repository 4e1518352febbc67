"""The pipeline section of a `Plan`: pp, schedule, microbatches, virtual stages per rank, the stages and the
search's estimate.

A plan with pipeline parallelism has a mesh ("pp", "dp", "tp") with "pp" outermost (size-1 dp/tp axes left
out). The intra-stage ILP plans the mesh WITHOUT pp (`Plan.mesh`, e.g. (dp=2)) once per distinct stage
(`planner.stage_layouts`): `StagePlan.layout` numbers the solve a stage uses (stages of the same structure
share one), and `Plan.pipeline` records the rest. Stage k holds `blocks_per_stage[k]` consecutive
members of the first repeated-block group (the cuts the search chose, possibly uneven; ops before the first
block go to stage 0, after the last to the last stage: `runtime.pipeline.cut_stages`) and runs on pipeline
rank q = k % pp, i.e. on global ranks q * W ... (q + 1) * W - 1 with W = the intra-stage mesh size
(looped placement, as torch's interleaved schedules expect; zbv places stages in a V). The traced graph is of ONE microbatch: global
batch = microbatches x the traced batch.

Schedules on the user's path (`SCHEDULE_NAMES`) are those `runtime.pipeline` runs and the search
(`planner.search`, priced by `planner.simulate`) prices: gpipe, 1f1b, interleaved_1f1b (looped: stage k
on pp rank k % pp), zbv (torch's ScheduleZBVZeroBubble) and dualpipev (torch's ScheduleDualPipeV), both
with stages in a V (stage k and 2pp-1-k on one rank, `planner.schedules.rank_of_stage`, which the
runtime follows), and bitpipe (`runtime.bitpipe`; a stage's `pp_rank` is its down copy's V rank, the up
copy runs on pp - 1 - that). A stage's `pp_rank` is that placement.

`PipelineEstimate` holds what the search (`planner.search.plan_pipeline`) priced for the chosen candidate:
step time = pipeline (m microbatches plus the bubble on the bottleneck rank) + dp gradient all-reduce + tied
embedding gradient exchange, per-stage seconds per microbatch, and per pipeline rank its memory by kind.

JSON (`Plan.to_dict()["pipeline"]`, present only in pipeline plans): {"pp", "schedule", "microbatches",
"virtual_stages", "mesh": the full mesh, "stages": [{"stage", "pp_rank", "blocks": [member, ...],
"first_node", "last_node", "ranks": [first, last], "layout"}], "estimate": {...} (`PipelineEstimate.to_dict`),
"compression": {...} (`planner.boundary.BoundaryCompression.to_dict`; absent when no boundary is compressed)}
("layout" is absent in format-3 plans: one intra-stage plan for every stage, layout 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.mesh import MeshSpec
from ..errors import PipelineError
from .boundary import BoundaryCompression, sig10 as _sig10
from .schedules import SCHEDULES, get_schedule, invalid_reason, rank_of_stage

SCHEDULE_NAMES = tuple(SCHEDULES)  # as the CLI spells them; runtime.pipeline (and runtime.bitpipe) runs each
PP_AXIS = "pp"
MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "outputs", "total")


def step_reads(outputs: list[tuple[str, tuple[int, ...], torch.dtype]]) -> tuple[str, ...]:
    """Of the model's outputs (name, global shape, dtype; in output order), the names a pipeline step reads when
    no loss_fn is given: the first alone when it is a 0-d floating value (the model's own loss), else all. The last
    stage of a pipeline returns these (`runtime.pipeline.step_returns`)."""
    if outputs and outputs[0][1] == () and outputs[0][2].is_floating_point:
        return (outputs[0][0],)
    return tuple(name for name, _, _ in outputs)



PARTITION_WORDS = {"dp": "stage boundaries balanced by dynamic programming over the blocks (memory-aware)",
                   "uniform": "stage boundaries uniform (equal blocks per stage)"}
"""What a plan's `partition` ("dp" | "uniform", the JSON value kept for plan files) means in text: where the
pipeline cuts between stages. "dp" names the dynamic program (`planner.partition`), not the data-parallel mesh
axis beside it; data parallelism is not a cut (r21g finding 8: "microbatch 1 per replica, dp cut")."""


def partition_text(partition: str) -> str:
    """`PARTITION_WORDS[partition]`; an unknown value (a hand-edited plan) as it is, named."""
    return PARTITION_WORDS.get(partition, f"stage boundaries {partition!r}")


@dataclass(frozen=True, slots=True)
class PipelineEstimate:
    """The search's price of the chosen pipeline (module docstring). Seconds per optimizer step unless said.

    Attributes:
        step_s: pipeline_s + dp_grad_sync_s + tied_grad_sync_s.
        pipeline_s: the simulated compute makespan (`planner.simulate`); bubble_s the busiest rank's idle part.
        dp_grad_sync_s: the exposed part of the ranks' dp gradient all-reduces (each stage's started during its last
            backward, `planner.simulate`).
        tied_grad_sync_s: the tied-parameter gradient exchange between first and last pipeline rank.
        microbatch_size: samples per microbatch per data-parallel replica; global_batch: samples per step.
        partition: where the pipeline cuts between stages: "dp" (the dynamic program's balanced, memory-aware
            stage boundaries; not the mesh axis) or "uniform" (the even boundaries won); text: `partition_text`.
        stage_s: per stage, seconds per microbatch (forward + backward, its tp collectives and sends).
        rank_memory_bytes: per pipeline rank, bytes per device by kind (`MEMORY_KINDS`; activations = the
            in-flight microbatches the schedule keeps, `schedules.inflight_microbatches`).
    """

    step_s: float
    pipeline_s: float
    bubble_s: float
    dp_grad_sync_s: float
    tied_grad_sync_s: float
    microbatch_size: int
    global_batch: int
    partition: str
    stage_s: tuple[float, ...]
    rank_memory_bytes: tuple[dict, ...] = field(default=())

    def __post_init__(self) -> None:  # stored as written (10 significant digits), so a loaded plan compares equal
        for f in ("step_s", "pipeline_s", "bubble_s", "dp_grad_sync_s", "tied_grad_sync_s"):
            object.__setattr__(self, f, _sig10(getattr(self, f)))
        object.__setattr__(self, "stage_s", tuple(_sig10(x) for x in self.stage_s))

    @property
    def peak_memory_bytes(self) -> dict:
        """The memory by kind of the pipeline rank with the largest total."""
        return max(self.rank_memory_bytes, key=lambda m: m["total"])

    def to_dict(self) -> dict:
        return {"step_s": self.step_s, "pipeline_s": self.pipeline_s, "bubble_s": self.bubble_s,
                "dp_grad_sync_s": self.dp_grad_sync_s, "tied_grad_sync_s": self.tied_grad_sync_s,
                "microbatch_size": self.microbatch_size, "global_batch": self.global_batch,
                "partition": self.partition, "stage_s": list(self.stage_s),
                "rank_memory_bytes": [dict(m) for m in self.rank_memory_bytes]}

    @classmethod
    def from_dict(cls, d: dict) -> "PipelineEstimate":
        return cls(d["step_s"], d["pipeline_s"], d["bubble_s"], d["dp_grad_sync_s"], d["tied_grad_sync_s"],
                   d["microbatch_size"], d["global_batch"], d["partition"], tuple(d["stage_s"]),
                   tuple(dict(m) for m in d["rank_memory_bytes"]))

    def lines(self) -> list[str]:
        """Human summary: step time and its parts, then per pipeline rank its memory by kind (GB)."""
        ms = lambda s: f"{s * 1e3:.3f} ms"  # noqa: E731
        out = [f"estimated step {ms(self.step_s)} = pipeline {ms(self.pipeline_s)} (bubble {ms(self.bubble_s)}) "
               f"+ dp grad sync {ms(self.dp_grad_sync_s)} + tied grad sync {ms(self.tied_grad_sync_s)}; "
               f"{self.global_batch} samples per step, microbatch {self.microbatch_size} per replica, "
               f"{partition_text(self.partition)}"]
        for r, mem in enumerate(self.rank_memory_bytes):
            out.append(f"  pp rank {r} memory per device: "
                       + ", ".join(f"{k} {mem[k] / 1e9:.2f} GB" for k in MEMORY_KINDS if k in mem))
        return out


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One pipeline stage: its index, the pipeline rank running it, its block members ("h.0", ...), the first
    and last graph node it computes, its global ranks (first, last; inclusive), and the number of the distinct
    intra-stage solve its nodes' strategies come from (`planner.stage_layouts`)."""

    stage: int
    pp_rank: int
    blocks: tuple[str, ...]
    first_node: str
    last_node: str
    ranks: tuple[int, int]
    layout: int = 0


@dataclass(frozen=True, slots=True)
class PipelineSection:
    """What `Plan.pipeline` holds (module docstring). `mesh` is the full mesh, pp axis first."""

    pp: int
    schedule: str
    microbatches: int
    virtual_stages: int
    mesh: MeshSpec
    stages: tuple[StagePlan, ...]
    estimate: PipelineEstimate | None = None  # the search's price (None in plans made before it was recorded)
    compression: BoundaryCompression | None = None  # per stage boundary codec (`planner.boundary`); None: none

    @property
    def blocks_per_stage(self) -> tuple[int, ...]:
        return tuple(len(s.blocks) for s in self.stages)

    def to_dict(self) -> dict:
        return {"pp": self.pp, "schedule": self.schedule, "microbatches": self.microbatches,
                "virtual_stages": self.virtual_stages, "mesh": self.mesh.to_dict(),
                "stages": [{"stage": s.stage, "pp_rank": s.pp_rank, "blocks": list(s.blocks),
                            "first_node": s.first_node, "last_node": s.last_node, "ranks": list(s.ranks),
                            "layout": s.layout}
                           for s in self.stages],
                **({"estimate": self.estimate.to_dict()} if self.estimate is not None else {}),
                **({"compression": self.compression.to_dict()} if self.compression is not None else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "PipelineSection":
        stages = tuple(StagePlan(s["stage"], s["pp_rank"], tuple(s["blocks"]), s["first_node"], s["last_node"],
                                 tuple(s["ranks"]), s.get("layout", 0)) for s in d["stages"])
        estimate = PipelineEstimate.from_dict(d["estimate"]) if "estimate" in d else None
        compression = BoundaryCompression.from_dict(d["compression"]) if "compression" in d else None
        section = cls(d["pp"], d["schedule"], d["microbatches"], d["virtual_stages"], MeshSpec.from_dict(d["mesh"]),
                      stages, estimate, compression)
        check_section(section)  # a saved plan may have been edited by hand (a reviewer's schedule, cut or count)
        return section

    def table(self) -> tuple[str, list[str], list[list[str]]]:
        """(title, header, rows): one row per stage (stage, pp rank, blocks, ranks, its intra-stage layout (the
        number of its solve; "L1 = stage 1" names the first stage solved with it), first-last node, and with an
        estimate its milliseconds per microbatch)."""
        timed = self.estimate is not None
        first = {}
        for s in self.stages:
            first.setdefault(s.layout, s.stage)
        rows = [[str(s.stage), str(s.pp_rank), _span(s.blocks), f"{s.ranks[0]}-{s.ranks[1]}",
                 f"L{s.layout}" + (f" = stage {first[s.layout]}" if first[s.layout] != s.stage else ""),
                 f"{s.first_node} .. {s.last_node}"]
                + ([f"{self.estimate.stage_s[s.stage] * 1e3:.3f}"] if timed else []) for s in self.stages]
        title = (f"Pipeline stages (pp={self.pp}, schedule {self.schedule}, {self.microbatches} microbatches, "
                 f"{self.virtual_stages} stage(s) per pp rank, full mesh {self.mesh})")
        header = ["stage", "pp rank", "blocks", "ranks", "layout", "nodes"] + (["ms/microbatch"] if timed else [])
        return title, header, rows


def check_section(section: PipelineSection) -> None:
    """Raise PipelineError naming every field of `section` that the runtime cannot run as written: the
    schedule's stages per pp rank (`virtual_stages`, pp x v stages), a stage without blocks or listing a block
    twice, a stage's `pp_rank` / `ranks` other than the schedule's placement (`rank_of_stage`; the runtime
    places stages by the schedule, so an edited rank would be ignored, silently), microbatch counts the
    schedule cannot run (`invalid_reason`: 1f1b needs >= pp, ...) and a count that no longer makes the estimate's
    global batch (the traced graph is one microbatch: an edited count silently ran another batch, e.g. 16 samples
    for a plan made and priced for 8). Checked when a plan is loaded, so a
    reviewer's edit is refused before any rank starts (before: torch's ValueError, or an empty stage's
    "optimizer got an empty parameter list", in every rank after the launch)."""
    pp, name, m = section.pp, section.schedule, section.microbatches
    try:
        v = get_schedule(name).virtual_stages
    except ValueError as exc:
        raise PipelineError(f"pipeline.schedule: {exc}") from None
    problems = []
    if section.mesh.shape[0] != pp:
        problems.append(f"pp {pp}: the pipeline mesh {section.mesh} has {section.mesh.shape[0]} pp ranks")
    if section.virtual_stages != v:
        problems.append(f"virtual_stages {section.virtual_stages}: {name} runs {v} stage(s) per pp rank")
    if len(section.stages) != pp * v:
        problems.append(f"stages: {len(section.stages)} listed; {name} on pp={pp} runs pp x {v} = {pp * v}")
    width = section.mesh.world_size // section.mesh.shape[0]
    seen: set[str] = set()
    for k, st in enumerate(section.stages):
        if st.stage != k:
            problems.append(f"stages/{k}/stage: {st.stage}, must be {k} (stages in order)")
        if not st.blocks:
            problems.append(f"stages/{k}/blocks: empty; every stage holds at least one block")
        if seen & set(st.blocks) or len(set(st.blocks)) != len(st.blocks):
            problems.append(f"stages/{k}/blocks: {list(st.blocks)} lists a block another entry lists too")
        seen |= set(st.blocks)
        if len(section.stages) == pp * v:
            q = rank_of_stage(name, k, pp)
            if st.pp_rank != q or tuple(st.ranks) != (q * width, (q + 1) * width - 1):
                problems.append(f"stages/{k}: pp_rank {st.pp_rank}, ranks {list(st.ranks)}; {name} places stage {k} "
                                f"on pp rank {q}, ranks [{q * width}, {(q + 1) * width - 1}]")
    why = invalid_reason(name, pp, m, len(seen))
    if why is not None:
        problems.append(f"schedule {name}, microbatches {m}, pp {pp}: {why}")
    est = section.estimate
    dp = dict(zip(section.mesh.axis_names, section.mesh.shape)).get("dp", 1)
    if est is not None and est.global_batch != est.microbatch_size * dp * m:
        problems.append(f"microbatches {m}: the plan was made for a global batch of {est.global_batch} in microbatches "
                        f"of {est.microbatch_size} per replica (dp={dp}); {m} of them would be a batch of "
                        f"{est.microbatch_size * dp * m} with another memory and step estimate (the graph is traced at "
                        "one microbatch, so another count for the same batch needs another trace)")
    if problems:
        raise PipelineError("the plan's pipeline section cannot run as written (edited by hand?):\n  "
                            + "\n  ".join(problems) + "\nRemedy: re-plan with `parallelizer plan --mesh ... --schedule "
                            "NAME --microbatches M` (it derives stages, placement and layouts), or correct the fields "
                            "named")


def _span(blocks: tuple[str, ...]) -> str:
    if not blocks:
        return "-"
    return blocks[0] if len(blocks) == 1 else f"{blocks[0]} .. {blocks[-1]} ({len(blocks)})"


def split_mesh(mesh: MeshSpec) -> tuple[int, MeshSpec]:
    """(pp, intra-stage mesh) of a mesh whose first axis is "pp"; a mesh of pp alone gives (dp=1).

    Raises:
        PipelineError: "pp" is not the first (outermost) axis.
    """
    if mesh.axis_names[0] != PP_AXIS:
        raise PipelineError(f"mesh {mesh}: the pipeline axis 'pp' must be the first (outermost) axis, so that a "
                            f"stage group holds consecutive ranks; write e.g. pp=2,dp=2")
    rest = MeshSpec(mesh.axis_names[1:], mesh.shape[1:]) if mesh.ndim > 1 else MeshSpec(("dp",), (1,))
    return mesh.shape[0], rest


def check_schedules(names) -> tuple[str, ...]:
    """The schedule names a user-path plan may use, validated.

    Raises:
        PipelineError: an unknown name (the message lists the known ones).
    """
    names = (names,) if isinstance(names, str) else tuple(names)
    for name in names:
        if name not in SCHEDULE_NAMES:
            raise PipelineError(f"schedule {name!r}: use one of {', '.join(SCHEDULE_NAMES)}")
    if not names:
        raise PipelineError(f"schedules=(): give at least one of {', '.join(SCHEDULE_NAMES)}")
    return names


def pipeline_section(mesh: MeshSpec, width: int, group_members: tuple[str, ...], stage_of: dict[str, int],
                     pp: int, schedule: str, microbatches: int, v: int,
                     blocks_per_stage: tuple[int, ...], estimate: PipelineEstimate | None = None,
                     compression: BoundaryCompression | None = None,
                     layouts: tuple[int, ...] | None = None) -> PipelineSection:
    """The section of a cut: `stage_of` maps compute nodes (graph order) to stages (`cut_stages`);
    `width` is the intra-stage mesh size; `layouts[k]`: the intra-stage solve stage k uses (default all 0)."""
    nodes: dict[int, list[str]] = {}
    for name, k in stage_of.items():
        nodes.setdefault(k, []).append(name)
    stages, start = [], 0
    for k, count in enumerate(blocks_per_stage):
        p = rank_of_stage(schedule, k, pp)
        stages.append(StagePlan(k, p, tuple(group_members[start:start + count]), nodes[k][0], nodes[k][-1],
                                (p * width, (p + 1) * width - 1), layouts[k] if layouts else 0))
        start += count
    return PipelineSection(pp, schedule, microbatches, v, mesh, tuple(stages), estimate, compression)
