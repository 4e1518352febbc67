"""The ILP's memory row agrees with the replay of the plan it picks (round 25, r25d; `planner.memory_fit`, RESULTS.md
"Round 25 (r25d)").

Class: the row prices saved bytes on the GLOBAL graph's storages per strategy, the plan's memory is replayed on the
ranks' LOCAL storages (`local_storage`: view or copy by local strides, a redistributed input its own storage), and
the two differ where several nodes' strategies decide a storage. Members (one module each, `local_storage_models`, and
the Llama family: repeat_kv, a redistributed input at tp=4) on tp=2, tp=4, fsdp x tp 2x2 and a free 2x2 mesh: the
uncorrected row at the pick differs from the replay (the case reaches its member) and the row the solver constrained
(corrections learnt, `Problem.memory_cuts`) equals the replay and the Plan's total. Budgets: the old pick over the
budget by its replay (main reported it as the plan), a faster plan the row rejected though it fits by its replay,
and the typed error when nothing fits. What a gloo rank holds per node: tests/distributed/test_local_storage_run.py.
"""
import contextlib
import io
import os
import sys

import pytest

import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.core.mesh import MeshSpec
from parallelizer.errors import InfeasiblePlanError
from parallelizer.planner.api import build, plan, to_plan
from parallelizer.planner.ilp import memory_bytes, solve
from parallelizer.planner.memory_fit import recompute_delta, solve_fitting
from parallelizer.zoo import families

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "distributed"))
from local_storage_models import member  # noqa: E402

FSDP_TP = ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})
TP2, TP4 = ({"tp": 2}, {"tp": "tp"}), ({"tp": 4}, {"tp": "tp"})
# case: (model, (mesh, axis roles)); each one's uncorrected row at the pick differs from the replay (measured r25d)
MEMBERS = {
    "repeat_kv-tp2": ("repeat_kv", TP2), "repeat_kv-fsdp_tp": ("repeat_kv", FSDP_TP),
    "contiguous-tp4": ("contiguous", TP4), "contiguous-free2x2": ("contiguous", ({"dp": 2, "tp": 2}, {})),
    "flatten-fsdp_tp": ("flatten", FSDP_TP), "merge_heads-tp2": ("merge_heads", TP2),
    "chunk-fsdp_tp": ("chunk", FSDP_TP),
    "llama-tp4": ("llama", TP4), "llama-fsdp_tp": ("llama", FSDP_TP),
}
_TRACED: dict = {}


def _traced(which: str):
    if which not in _TRACED:
        _TRACED[which] = parallelizer.trace(*(families.llama() if which == "llama" else member(which)))
    return _TRACED[which]


def _config(roles: dict, budget: int | None = None) -> PlanConfig:
    return PlanConfig(precision="fp32", recompute="none", axis_roles=roles, memory_budget_bytes=budget)


def _old_pick(traced, mesh: dict, config: PlanConfig):
    """What main did: the ILP's pick under the row alone, then its Plan (activations replayed by `to_plan`)."""
    problem, pricer = build(traced, MeshSpec.of(mesh), config=config)
    with contextlib.redirect_stdout(io.StringIO()):
        sol = solve(problem, config)
    return problem, sol, to_plan(traced, problem, pricer, sol, config)


@pytest.mark.parametrize("case", list(MEMBERS))
def test_the_row_the_solver_fitted_equals_the_replayed_plan(case):
    which, (mesh, roles) = MEMBERS[case]
    traced, config = _traced(which), _config(roles)
    problem, pricer = build(traced, MeshSpec.of(mesh), config=config)
    with contextlib.redirect_stdout(io.StringIO()):
        fitted, sol, held, _ = solve_fitting(traced, problem, pricer, config)
    replayed = to_plan(traced, fitted, pricer, sol, config, held).cost.memory_bytes["total"]
    assert memory_bytes(problem, sol.choice) != replayed, (case, "reaches no member")  # the row before
    assert memory_bytes(fitted, sol.choice) + recompute_delta(fitted, sol) == replayed, case


@pytest.mark.parametrize("which, mesh_roles", [("contiguous", TP2), ("llama", TP4)])
def test_a_plan_over_the_budget_by_its_replay_is_not_reported(which, mesh_roles):
    """Since round 26 (r26d) the budget binds on the replayed step peak (`memory_bytes["peak"]`). A budget 1 B under
    the peak of the plan picked without one: that pick is not returned; the plan returned fits by its own replayed
    peak and is no faster (the pick was the fastest)."""
    mesh, roles = mesh_roles
    traced = _traced(which)
    with contextlib.redirect_stdout(io.StringIO()):
        free = plan(traced, mesh, config=_config(roles))
        budget = free.cost.memory_bytes["peak"] - 1
        new = plan(traced, mesh, config=_config(roles, budget))
    assert new.cost.memory_bytes["peak"] <= budget
    assert new.solver.objective_s >= free.solver.objective_s


def test_a_plan_whose_peak_fits_is_found_though_its_sum_is_over():
    """Llama tp=2 with the budget at the peak of its fastest plan (r25d: 506,664 B was its replayed sum): the fastest
    plan is returned, as without a budget, whatever its sum of kinds (the rows bound the step's moments)."""
    traced = _traced("llama")
    with contextlib.redirect_stdout(io.StringIO()):
        free = plan(traced, {"tp": 2}, config=_config({"tp": "tp"}))
        budget = free.cost.memory_bytes["peak"]
        new = plan(traced, {"tp": 2}, config=_config({"tp": "tp"}, budget))
    assert new.cost.memory_bytes["peak"] <= budget
    assert new.solver.objective_s == pytest.approx(free.solver.objective_s, rel=1e-9)


def test_no_plan_fitting_by_its_replay_is_a_typed_error_naming_the_node():
    """Every strategy fixed to the contiguous member's free pick (row 3,140 B, replayed sum 4,164 B) at a budget 1 B
    under its replayed peak: InfeasiblePlanError says where and by how much it peaks, names the matmul that keeps
    the copy, its excess and the mesh."""
    traced = _traced("contiguous")
    with contextlib.redirect_stdout(io.StringIO()):
        free = plan(traced, {"tp": 2}, config=_config({"tp": "tp"}))
    fixed = {n: p.strategy for n, p in free.nodes.items() if p.output is not None}
    peak = free.cost.memory_bytes["peak"]
    with pytest.raises(InfeasiblePlanError) as err, contextlib.redirect_stdout(io.StringIO()):
        plan(traced, {"tp": 2}, config=_config({"tp": "tp"}, peak - 1), fixed=fixed)
    assert free.cost.memory_bytes["total"] == 4164
    for part in ("aten.matmul", "+1,024 B per rank", "(tp=2)", "peaks at", f"{peak:,} B", "1 B over", "Remedies"):
        assert part in str(err.value), (part, str(err.value))
