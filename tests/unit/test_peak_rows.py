"""The ILP's memory rows equal the replayed step peak of the plan they price (round 27, r27d; `planner.peak_rows`,
`planner.memory_ilp`, RESULTS.md "Round 27 (r27d)").

Class: what a rank holds at a moment of the step and depends on a parameter's stored layout AND its uses' layouts
(a pair of strategies), which the rows of round 26 left to the replay of each pick (`memory_fit`'s exclusions: a
budgeted solve took 4-8 rounds). Members: DDP's kept gradient buckets (every backward moment and the end of backward),
FSDP's regathered full weight and its unsharded gradient (from the backward of its use's readers), the AdamW step's
temporaries (the optimizer step), a composite op's inner gradients (cross-entropy's backward). On main the largest row
at a pick is under its replayed peak (`peak.step_peak`) by those bytes; here it equals it, on chains of linear layers
with ddp / fsdp / tp / a free 2x2 mesh, for the solver's pick and for other feasible choices, and the end-of-backward
and optimizer-step rows equal their closed forms. Budgeted solves return within the budget in one or two solves.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import random

import pytest
import torch

import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.core.mesh import MeshSpec
from parallelizer.planner import memory_fit
from parallelizer.planner.api import build
from parallelizer.planner.ilp import Solution, objective_s, solve
from parallelizer.planner.local_storage import local_saved_bytes
from parallelizer.planner.memory_fit import _add_row, _learn, node_excess, replayed_peak, solve_fitting
from parallelizer.planner.problem import layout_of, rows_bytes

F32 = 4  # bytes per float32 element
ROLES = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"}),
         "free2x2": ({"dp": 2, "tp": 2}, {})}


class Chain(torch.nn.Module):
    """x (B, d) -> n linear layers (d x d, no bias) with a ReLU between -> cross-entropy against fixed labels."""

    def __init__(self, n: int, d: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d, bias=False) for _ in range(n))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for k, layer in enumerate(self.layers):
            x = layer(x if k == 0 else torch.relu(x))
        return torch.nn.functional.cross_entropy(x, labels)


_TRACED: dict = {}


def _traced(n: int, b: int, d: int):
    if (n, b, d) not in _TRACED:
        torch.manual_seed(0)
        _TRACED[(n, b, d)] = parallelizer.trace(Chain(n, d), (torch.randn(b, d), torch.randint(0, d, (b,))))
    return _TRACED[(n, b, d)]


def _problem(traced, case: str):
    """The problem with its rows built (a 1 B budget makes them bind), then the budget lifted for the solver."""
    mesh, roles = ROLES[case]
    config = PlanConfig(precision="fp32", recompute="none", axis_roles=roles, memory_budget_bytes=1,
                        memory_reserve_bytes=0)
    problem, pricer = build(traced, MeshSpec.of(mesh), config=config)
    assert problem.cut_rows
    return dataclasses.replace(problem, budget_bytes=10**15, cut_rows=list(problem.cut_rows)), pricer, config


def _replay(traced, problem, pricer, choice):
    sol = Solution(tuple(choice), 0.0, "given", True, None, 0.0, 0, 0, 0, "none")
    spans: list = []
    held = local_saved_bytes(traced, {n: layout_of(problem, n, sol.choice) for n in problem.spaces}, problem.spaces,
                             pricer, spans)
    return sol, held, replayed_peak(traced, problem, pricer, sol, held, spans)


def _choices(problem, config, count: int, seed: int = 0):
    """The solver's pick and up to `count` other choices of finite cost (random one-hot choices, seeded)."""
    with contextlib.redirect_stdout(io.StringIO()):
        out = [solve(problem, config).choice]
    rng, sizes = random.Random(seed), problem.sizes()
    for _ in range(400 * count):
        if len(out) > count:
            break
        choice = tuple(rng.randrange(n) for n in sizes)
        if choice not in out and math.isfinite(objective_s(problem, choice)):
            out.append(choice)
    return out


@pytest.mark.parametrize("case", list(ROLES))
@pytest.mark.parametrize("n, b, d", [(2, 64, 32), (3, 8, 64)])
def test_the_largest_row_at_a_choice_is_its_replayed_step_peak(case, n, b, d):
    """Activation-heavy (B=64, d=32) and weight-heavy (B=8, d=64) chains: for the solver's pick and random feasible
    choices, the row at the moment the replay peaks at (added as `memory_fit` adds it) makes the largest row equal
    the replayed step peak (main: under it by the DDP bucket / regathered copy / AdamW temporaries)."""
    traced = _traced(n, b, d)
    problem, pricer, config = _problem(traced, case)
    checked = 0
    for choice in _choices(problem, config, 4):
        sol, held, peak = _replay(traced, problem, pricer, choice)
        # the saved bytes replayed on local storages (a storage charged to its first saver): corrections placed at
        # their nodes' positions, as `memory_fit` learns them
        _learn(traced, problem, choice, node_excess(traced, problem, pricer, choice, held))
        _add_row(traced, problem, pricer, peak)
        if peak.at.startswith("forward"):
            continue  # the forward's moments have no row (module docstring of `peak_rows`)
        assert rows_bytes(problem, choice) == peak.peak_bytes, (case, choice, peak)
        checked += 1
    assert checked >= 2, case


def _row(problem, label: str):
    return next(r for r in problem.cut_rows if r.label == label)


@pytest.mark.parametrize("case, state_per_param, kept_per_param", [("ddp", 16, 4), ("fsdp", 8, 0), ("tp", 8, 0)])
def test_end_of_backward_and_optimizer_rows_closed_form(case, state_per_param, kept_per_param):
    """P = n d^2 parameters in fp32 with AdamW (16 B each: param, grad, two moments): at the end of backward a rank
    holds its state (ddp: whole, 16 P; fsdp / tp: half, 8 P) plus, under ddp, the flattened bucket beside the kept one
    (4 P more); at the optimizer step its state plus the single-tensor AdamW's temporaries, 2 of the last parameter's
    local size plus the one before it (`peak.adamw_temporary_bytes`)."""
    n, b, d = 3, 8, 64
    traced = _traced(n, b, d)
    problem, pricer, config = _problem(traced, case)
    with contextlib.redirect_stdout(io.StringIO()):
        choice = solve(problem, config).choice
    params = n * d * d
    local = d * d // (1 if case == "ddp" else 2)
    assert _row(problem, "end of backward").bytes_at(choice) == state_per_param * params + kept_per_param * params
    step = max(r.bytes_at(choice) for r in problem.cut_rows if r.label.startswith("optimizer step"))
    assert step == state_per_param * params + F32 * 3 * local


def _budgeted(case: str, budget_of):
    n, b, d = 3, 8, 64
    traced = _traced(n, b, d)
    mesh, roles = ROLES[case]
    opts = dict(precision="fp32", recompute="none", axis_roles=roles, memory_reserve_bytes=0)
    with contextlib.redirect_stdout(io.StringIO()):
        free = parallelizer.plan(traced, mesh, **opts)
        lean = parallelizer.plan(traced, mesh, lean=True, **opts)
        budget = budget_of(free.cost.memory_bytes["peak"], lean.cost.memory_bytes["peak"])
        config = PlanConfig(memory_budget_bytes=budget, **opts)
        problem, pricer = build(traced, MeshSpec.of(mesh), config=config)
        return traced, budget, problem, pricer, config


@pytest.mark.parametrize("where", ["lean", "between"])
def test_a_budgeted_solve_fits_in_one_solve(where):
    """The free 2x2 mesh (the free pick peaks at 245,764 B, the memory-lean layout at 124,420 B) with the budget at the
    lean layout's peak or halfway: the plan returned fits by its replayed peak, after ONE solve and no exclusion (main:
    2 and 3 solves, the pick's shortfall put on its stored layouts)."""
    traced, budget, problem, pricer, config = _budgeted(
        "free2x2", lambda free, lean: lean if where == "lean" else (free + lean) // 2)
    with contextlib.redirect_stdout(io.StringIO()):
        fitted, sol, held, peak = solve_fitting(traced, problem, pricer, config)
    assert peak.peak_bytes <= budget
    assert fitted.stats["fit_rounds"] == 1 and not fitted.exclusions, fitted.stats
    assert rows_bytes(fitted, sol.choice) == peak.peak_bytes  # the rows held it exactly (the optimizer step here)


def test_a_pick_the_solver_lets_over_by_its_tolerance_is_not_repeated(monkeypatch):
    """ddp with the budget 1 B under the only layout's peak (247,812 B): the rows are in GB, HiGHS's feasibility
    tolerance (~100 B there) lets the pick through; the loop keeps a margin (`TOLERANCE_MARGIN_BYTES`) instead of
    re-solving the same pick until `MAX_FIT_ROUNDS` (main: 8 solves), and the typed error says it is 1 B over."""
    traced, budget, problem, pricer, config = _budgeted("ddp", lambda free, lean: free - 1)
    calls = []
    monkeypatch.setattr(memory_fit, "solve", lambda *a, **k: calls.append(1) or solve(*a, **k))
    with pytest.raises(parallelizer.InfeasiblePlanError, match=" 1 B over"), contextlib.redirect_stdout(io.StringIO()):
        solve_fitting(traced, problem, pricer, config)
    assert len(calls) <= 3, len(calls)


def test_explain_prints_the_row_that_binds():
    """`explain` on a budgeted plan prices each alternative by the largest row (round 26 printed the sum of kinds, which
    is not a moment of the step) and names its moment: at the lean layout's budget on the free 2x2 mesh the chosen
    row is the plan's replayed peak, at the optimizer step."""
    traced, budget, *_ = _budgeted("free2x2", lambda free, lean: lean)
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(traced, ROLES["free2x2"][0], precision="fp32", recompute="none", memory_reserve_bytes=0,
                              memory_budget_bytes=budget)
    node = next(n for n, q in p.nodes.items() if q.op == "aten.linear.default")
    e = parallelizer.explain(traced, p, node)
    row = next(a for a in e.alternatives if a[0] == e.chosen)
    assert row[4] == p.cost.memory_bytes["peak"] and row[3] and row[5].startswith("optimizer step"), row
    assert f"(largest row: {row[5]})" in str(e)
