"""The planner prices frozen parameters without gradients or optimizer state, and its notes say what ran
replicated and why."""
import contextlib
import dataclasses
import io

import torch
from torch import nn

import parallelizer
from parallelizer.planner import Plan


class Frozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(32, 32, bias=False)
        self.frozen.weight.requires_grad_(False)
        self.train_me = nn.Linear(32, 32, bias=False)

    def forward(self, x):
        return self.train_me(self.frozen(x))


def _plan(model, inputs, mesh, **options):
    traced = parallelizer.trace(model, inputs)
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(traced, mesh, **options)


def test_frozen_parameters_have_no_gradient_sync_or_optimizer_state():
    plan = _plan(Frozen(), (torch.randn(8, 32),), {"dp": 2}, axis_roles={"dp": "ddp"})
    synced = {e.src for e in plan.edges for s in e.steps if s.kind == "grad_all_reduce"}
    assert synced == {"p_train_me_weight"}  # not the frozen weight
    n = 32 * 32  # elements of one (replicated) weight; bf16 on H100: 2 + 4 + 12 B per trained element
    assert plan.cost.memory_bytes["params"] == 2 * (2 * n)  # both bf16 weights
    # only the trained one has an fp32 main gradient and fp32 main weight + AdamW m, v
    assert plan.cost.memory_bytes["grads"] == 4 * n and plan.cost.memory_bytes["optimizer"] == 12 * n


class Pooled(nn.Module):
    """Picks one position per row by global index (CLIP text's pooling): no strategy keeps the rows sharded."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x, idx):
        h = self.l(x)                                   # (B, T, C)
        return h[torch.arange(h.shape[0]), idx]         # (B, C)


def test_a_gather_the_ddp_role_cannot_avoid_is_planned_and_noted():
    plan = _plan(Pooled(), (torch.randn(6, 5, 8), torch.randint(0, 5, (6,))), {"dp": 2}, axis_roles={"dp": "ddp"})
    (note,) = [n for n in plan.notes() if "gather or re-shard their input over dp" in n]
    assert "aten.index.Tensor" in note


def test_a_plan_the_solver_did_not_prove_optimal_says_so_and_how_to_fix_it():
    plan = _plan(Frozen(), (torch.randn(8, 32),), {"dp": 2}, axis_roles={"dp": "ddp"})
    assert plan.solver.optimal and not any("not proven optimal" in n for n in plan.notes())
    cut = dataclasses.replace(plan, solver=dataclasses.replace(plan.solver, status="feasible", optimal=False,
                                                               gap=0.0043, time_s=61.5))
    note = [n for n in cut.notes() if n.startswith("not proven optimal")]
    assert len(note) == 1 and "stopped at its time limit after 62 s" in note[0] and "0.43% from" in note[0]
    assert "--time-limit" in note[0] and "NOTE: not proven optimal" in cut.summary()
    loaded = Plan.from_json(cut.to_json()).notes()  # derived on load, not stored (wall-clock times are not written)
    assert [n for n in loaded if n.startswith("not proven optimal")] == [note[0].replace(" after 62 s", "")]
