"""The pipeline section of a `Plan`: pp, schedule, microbatches, virtual stages per rank and the stages.

A plan with pipeline parallelism is made on a mesh with a "pp" axis, outermost: (pp, dp, tp). The intra-stage
ILP plans the mesh WITHOUT pp (`Plan.mesh`, e.g. (dp=2); every stage uses that one intra-stage plan), and
`Plan.pipeline` records the rest. Stage k holds `blocks_per_stage[k]` consecutive members of the first
repeated-block group (cut evenly; ops before the first block go to stage 0, after the last to the last
stage: `runtime.pipeline.cut_stages`) and runs on pipeline rank k % pp, i.e. on global ranks
(k % pp) * W ... (k % pp + 1) * W - 1 with W = the intra-stage mesh size (looped placement, as torch's
interleaved schedules expect). The traced graph is of ONE microbatch: global batch = microbatches x the
traced batch.

JSON (`Plan.to_dict()["pipeline"]`, present only in pipeline plans): {"pp", "schedule", "microbatches",
"virtual_stages", "mesh": the full mesh, "stages": [{"stage", "pp_rank", "blocks": [member, ...],
"first_node", "last_node", "ranks": [first, last]}]}.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.mesh import MeshSpec
from ..errors import PipelineError

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved_1f1b")
_INTERLEAVED = ("interleaved_1f1b",)
PP_AXIS = "pp"


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One pipeline stage: its index, the pipeline rank running it, its block members ("h.0", ...), the first
    and last graph node it computes, and its global ranks (first, last; inclusive)."""

    stage: int
    pp_rank: int
    blocks: tuple[str, ...]
    first_node: str
    last_node: str
    ranks: tuple[int, int]


@dataclass(frozen=True, slots=True)
class PipelineSection:
    """What `Plan.pipeline` holds (module docstring). `mesh` is the full mesh, pp axis first."""

    pp: int
    schedule: str
    microbatches: int
    virtual_stages: int
    mesh: MeshSpec
    stages: tuple[StagePlan, ...]

    @property
    def blocks_per_stage(self) -> tuple[int, ...]:
        return tuple(len(s.blocks) for s in self.stages)

    def to_dict(self) -> dict:
        return {"pp": self.pp, "schedule": self.schedule, "microbatches": self.microbatches,
                "virtual_stages": self.virtual_stages, "mesh": self.mesh.to_dict(),
                "stages": [{"stage": s.stage, "pp_rank": s.pp_rank, "blocks": list(s.blocks),
                            "first_node": s.first_node, "last_node": s.last_node, "ranks": list(s.ranks)}
                           for s in self.stages]}

    @classmethod
    def from_dict(cls, d: dict) -> "PipelineSection":
        stages = tuple(StagePlan(s["stage"], s["pp_rank"], tuple(s["blocks"]), s["first_node"], s["last_node"],
                                 tuple(s["ranks"])) for s in d["stages"])
        return cls(d["pp"], d["schedule"], d["microbatches"], d["virtual_stages"], MeshSpec.from_dict(d["mesh"]),
                   stages)

    def table(self) -> tuple[str, list[str], list[list[str]]]:
        """(title, header, rows): one row per stage (stage, pp rank, blocks, ranks, first-last node)."""
        rows = [[str(s.stage), str(s.pp_rank), _span(s.blocks), f"{s.ranks[0]}-{s.ranks[1]}",
                 f"{s.first_node} .. {s.last_node}"] for s in self.stages]
        title = (f"Pipeline stages (pp={self.pp}, schedule {self.schedule}, {self.microbatches} microbatches, "
                 f"{self.virtual_stages} stage(s) per pp rank, full mesh {self.mesh})")
        return title, ["stage", "pp rank", "blocks", "ranks", "nodes"], rows


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


def stage_counts(num_blocks: int, group: str, pp: int, schedule: str, microbatches: int,
                 virtual_stages: int | None) -> tuple[int, tuple[int, ...]]:
    """(virtual stages per rank, blocks per stage) for an even cut.

    Raises:
        PipelineError: an unknown schedule, microbatches < 1 or < pp, v that does not fit the schedule, or
            pp * v that does not divide the number of blocks (names a pp that would).
    """
    if schedule not in SCHEDULE_NAMES:
        raise PipelineError(f"schedule {schedule!r}: use one of {', '.join(SCHEDULE_NAMES)}")
    v = virtual_stages or (2 if schedule in _INTERLEAVED else 1)
    if (v > 1) != (schedule in _INTERLEAVED):
        raise PipelineError(f"virtual_stages={v} with schedule {schedule!r}: gpipe/1f1b run 1 stage per pp rank, "
                            "interleaved_1f1b runs >= 2")
    if not isinstance(microbatches, int) or microbatches < pp:
        raise PipelineError(f"microbatches={microbatches!r}: give an int >= pp={pp} (each pipeline rank needs a "
                            "microbatch in flight)")
    stages = pp * v
    if num_blocks % stages:
        fits = [d for d in range(1, num_blocks + 1) if num_blocks % (d * v) == 0]
        raise PipelineError(f"pp={pp} x {v} stage(s) per rank = {stages} stages do not divide the {num_blocks} "
                            f"blocks of {group}: stages are cut evenly at block boundaries. Remedy: pp in {fits}, "
                            "or a model with a multiple of pp blocks")
    return v, (num_blocks // stages,) * stages


def pipeline_section(mesh: MeshSpec, width: int, group_members: tuple[str, ...], stage_of: dict[str, int],
                     pp: int, schedule: str, microbatches: int, v: int,
                     blocks_per_stage: tuple[int, ...]) -> PipelineSection:
    """The section of a cut: `stage_of` maps compute nodes (graph order) to stages (`cut_stages`);
    `width` is the intra-stage mesh size."""
    nodes: dict[int, list[str]] = {}
    for name, k in stage_of.items():
        nodes.setdefault(k, []).append(name)
    stages, start = [], 0
    for k, count in enumerate(blocks_per_stage):
        p = k % pp
        stages.append(StagePlan(k, p, tuple(group_members[start:start + count]), nodes[k][0], nodes[k][-1],
                                (p * width, (p + 1) * width - 1)))
        start += count
    return PipelineSection(pp, schedule, microbatches, v, mesh, tuple(stages))
