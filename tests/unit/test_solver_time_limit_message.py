"""A solve stopped by its time limit with no plan says so, not "the memory budget binds" (round 20, r20h).

mT5's DEFAULT config (172M parameters) on dp=2 x tp=2 under load stopped at its 60 s limit (140 s wall) and
was refused with "the binding constraint is the memory budget 71.0 GB (the leanest plan needs 787.4 MB) ...
Remedies for a binding memory budget: raise it, more devices, activation recomputation": memory could not bind.
When even the heaviest placement of every group fits the budget and every group keeps a placement its
neighbours accept, only the time limit can have stopped it: the error now says that and names that remedy.
Fails on main 82b0369 (the memory sentence).
"""
import pytest
import torch

import parallelizer
from parallelizer.errors import InfeasiblePlanError


def _stack():
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)]
    return parallelizer.trace(torch.nn.Sequential(*layers), (torch.randn(8, 16, 64),))


def test_a_time_limit_stop_names_the_time_limit_and_raising_it_plans():
    traced = _stack()
    with pytest.raises(InfeasiblePlanError) as info:
        parallelizer.plan(traced, {"dp": 2, "tp": 2}, cluster="h100:1x4", time_limit_s=1e-6)
    message = str(info.value)
    assert "stopped at its time limit before finding any plan" in message, message
    assert "Not memory: even the heaviest placements need" in message and "Remedy: raise time_limit_s" in message
    assert "binding memory budget" not in message and "binding constraint is the memory" not in message
    plan = parallelizer.plan(traced, {"dp": 2, "tp": 2}, cluster="h100:1x4", time_limit_s=60)  # the remedy
    assert plan.mesh.world_size == 4


def test_a_budget_the_heaviest_placements_exceed_keeps_the_memory_remedies():
    """A budget between the leanest and the heaviest plan: memory may bind, so its remedies stay (a guard)."""
    traced = _stack()
    with pytest.raises(InfeasiblePlanError) as info:
        parallelizer.plan(traced, {"dp": 2, "tp": 2}, cluster="h100:1x4", time_limit_s=1e-6,
                          memory_budget_bytes=1_200_000)
    assert "Not memory" not in str(info.value), str(info.value)
