"""`ActionSchedule`: one pipeline step written as per-rank action lists, the input of `planner.simulate`.

Vocabulary: torch.distributed.pipelining's `_Action(stage_index, computation_type, microbatch_index)` with
computation types F (forward), B (full backward), I (backward for inputs), W (backward for weights);
`OVERLAP_F_B` entries stand for their `sub_actions` run in order. `None` (an idle slot in torch's tables)
and communication/bookkeeping entries (SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD, UNSHARD, RESHARD) carry
no compute and are dropped by `compute_actions`.

Stages and copies: the model is cut into `num_stages` = S model stages. A schedule may run `copies` > 1
pipelines through the same model (BitPipe: two, in opposite directions; Wu et al. 2024, arXiv 2410.19367).
Action stage index x = c * S + k is copy c of model stage k; copy c's microbatches flow
x = c*S + 0 -> c*S + 1 -> ... -> c*S + S-1 forward and back again in backward. Each microbatch
goes through exactly one copy. The gradients of the copies of model stage k (x = k, S + k, ...) are
summed between them (an all-reduce) once every copy's last backward of that stage is done.

Dependencies (what `planner.simulate` enforces): F(x, i) after F(x - 1, i) unless x is its copy's first
stage; I or B(x, i) after I or B(x + 1, i) unless x is its copy's last stage, and after F(x, i);
W(x, i) after I(x, i).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from torch.distributed.pipelining.schedules import _Action, _ComputationType

from ..errors import PipelineError

COMPUTE_TYPES = ("F", "B", "I", "W")


def compute_actions(actions) -> tuple[_Action, ...]:
    """The compute actions (F, B, I, W) of one rank's list in order: `OVERLAP_F_B` expanded into its
    sub-actions, `None` and communication/bookkeeping entries dropped."""
    out: list[_Action] = []
    for a in actions:
        if a is None:
            continue
        if a.computation_type == _ComputationType.OVERLAP_F_B:
            out.extend(compute_actions(a.sub_actions or ()))
        elif a.computation_type.value in COMPUTE_TYPES:
            out.append(a)
    return tuple(out)


@dataclass(frozen=True)
class ActionSchedule:
    """One step of a pipeline schedule as per-rank action lists (module docstring).

    Attributes:
        name: the schedule's CLI name ("gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe").
        actions: pp rank (0..p-1) -> that rank's compute actions in the order it runs them (`_Action`s with
            computation type F, B, I or W; build with `compute_actions` from a torch-style list).
        stage_to_rank: action stage index (0..copies*S - 1) -> pp rank.
        num_stages: S, the model stages (each copy runs all S).
        num_microbatches: m, microbatches per step (over all copies).
        copies: pipelines through the model (1; BitPipe 2); action stage c*S + k is copy c of model stage k.
    """

    name: str
    actions: dict[int, tuple[_Action, ...]]
    stage_to_rank: dict[int, int]
    num_stages: int
    num_microbatches: int
    copies: int = 1

    @property
    def num_ranks(self) -> int:
        """p, the pipeline ranks."""
        return len(self.actions)

    def model_stage(self, x: int) -> int:
        """Model stage (0..S-1) of action stage index x."""
        return x % self.num_stages

    def copy_of(self, x: int) -> int:
        """Copy (0..copies-1) of action stage index x."""
        return x // self.num_stages

    def validate(self) -> None:
        """Check the lists are one complete step.

        Raises:
            PipelineError: a rank runs an action of a stage placed on another rank; a stage index outside
                0..copies*S-1; a (stage, microbatch) whose F, or B / I / W, is missing or repeated; a
                microbatch that does not run every stage of exactly one copy; mixed B and I/W on a stage.
        """
        S, m, n = self.num_stages, self.num_microbatches, self.num_stages * self.copies
        where = f"schedule {self.name!r} (p={self.num_ranks}, m={m})"
        if set(self.stage_to_rank) != set(range(n)):
            raise PipelineError(f"{where}: stage_to_rank covers {sorted(self.stage_to_rank)}, need 0..{n - 1}")
        count: Counter = Counter()
        for r, acts in self.actions.items():
            for a in acts:
                kind = a.computation_type.value
                if kind not in COMPUTE_TYPES:
                    raise PipelineError(f"{where}: rank {r} lists {a!r}; keep only F/B/I/W (compute_actions)")
                if self.stage_to_rank.get(a.stage_index) != r:
                    raise PipelineError(f"{where}: rank {r} runs {a!r} but stage {a.stage_index} is on rank "
                                        f"{self.stage_to_rank.get(a.stage_index)}")
                if a.microbatch_index is None or not 0 <= a.microbatch_index < m:
                    raise PipelineError(f"{where}: {a!r} on rank {r} has microbatch outside 0..{m - 1}")
                count[(a.stage_index, kind, a.microbatch_index)] += 1
        for (x, kind, i), c in count.items():
            if c != 1:
                raise PipelineError(f"{where}: {x}{kind}{i} appears {c} times")
        expected = 0
        for i in range(m):
            runs = [c for c in range(self.copies) if (c * S, "F", i) in count]
            if len(runs) != 1:
                raise PipelineError(f"{where}: microbatch {i} starts in copies {runs}; need exactly one")
            for k in range(S):
                x = runs[0] * S + k
                has = {kind for kind in COMPUTE_TYPES if (x, kind, i) in count}
                if has not in ({"F", "B"}, {"F", "I", "W"}):
                    raise PipelineError(f"{where}: stage {x}, microbatch {i} has {sorted(has)}; need F and B, "
                                        "or F, I and W")
                expected += len(has)
        if expected != len(count):
            raise PipelineError(f"{where}: {len(count) - expected} actions run on a copy their microbatch does "
                                "not flow through")
