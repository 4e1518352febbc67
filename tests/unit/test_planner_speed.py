"""Round 26 (r26a): planning faster without changing a plan. Each speed-up is checked against the slow form it
replaces: PuLP's own HiGHS model (`highs_bulk.BulkHiGHS`), PuLP's operators (`ilp._at_least`), the collector's state
(`heap.frozen_heap`), and the garbage each form leaves (`Pricer.steps`' cached errors, `cost_model._fx.tensors_in`)."""
import contextlib
import gc
import io

import pulp
import pytest
import torch
from torch.utils._pytree import tree_flatten

import parallelizer
from cost_model._fx import tensors_in
from cost_model.topology import MeshTopology, dgx_h100
from parallelizer import zoo
from parallelizer.config import PlanConfig
from parallelizer.core import Layout, MeshSpec
from parallelizer.core.redistribute import ImpossibleRedistributionError
from parallelizer.planner.costs import Pricer
from parallelizer.planner.heap import frozen_heap
from parallelizer.planner.highs_bulk import BulkHiGHS
from parallelizer.planner.ilp import _at_least

def _small_problem() -> pulp.LpProblem:
    """Every kind of column and row PuLP hands HiGHS: integers with upper bounds 1 and 0, continuous and free
    columns, a column only in a row, a zero coefficient, rows of each sense with constants, an empty objective term."""
    prob = pulp.LpProblem("bulk", pulp.LpMinimize)
    x = [prob.add_variable(f"x_{i}", 0, 1 if i != 2 else 0, cat=pulp.LpInteger) for i in range(4)]
    e = prob.add_variable("e_0", 0, 1)
    free = prob.add_variable("f", None, None)
    only_row = prob.add_variable("z_row", 0, 5)
    prob += pulp.LpAffineExpression([(x[0], 3.5), (x[1], 1.25), (x[3], 2.0), (e, 0.5), (free, 1e-9)])
    prob += pulp.LpAffineExpression([(v, 1) for v in x]) == 1, "onehot"
    prob += pulp.LpAffineExpression([(e, 1), (x[0], -1), (x[1], 0)]) == 0, "link"
    prob += free - x[3] >= -2, "free_ge"
    prob += pulp.LpAffineExpression([(only_row, 1.0), (x[1], 2.0)]) <= 4.5, "le"
    return prob


def _model_text(prob: pulp.LpProblem, solver, path) -> str:
    solver.createAndConfigureSolver(prob)
    solver.buildSolverModel(prob)
    prob.solverModel.writeModel(str(path))
    return path.read_text()


def test_bulk_highs_passes_pulps_model_and_reads_the_same_solution(tmp_path):
    prob = _small_problem()
    with contextlib.redirect_stdout(io.StringIO()):
        reference = _model_text(prob, pulp.HiGHS(msg=False), tmp_path / "pulp.mps")
        bulk = _model_text(prob, BulkHiGHS(msg=False), tmp_path / "bulk.mps")
    assert bulk == reference
    solved = {}
    for name, solver in (("pulp", pulp.HiGHS(msg=False, threads=1)), ("bulk", BulkHiGHS(msg=False, threads=1))):
        prob = _small_problem()
        prob.solve(solver)
        solved[name] = (prob.status, prob.sol_status, {v.name: v.varValue for v in prob.variables()})
    assert solved["bulk"] == solved["pulp"]
    assert solved["bulk"][2]["x_1"] == 1.0  # the cheapest one-hot choice (1.25 + 2 z, z >= 0)


def test_bulk_highs_model_of_a_2x2_plan_is_pulps(monkeypatch, tmp_path):
    """The planner's ILP of an MLP on dp=2 x tp=2 (pair and memory rows): the model HiGHS is given is the one PuLP's
    interface builds."""
    traced = parallelizer.trace(*zoo.mlp(depth=2, batch=64, dim=32, hidden=64, in_features=32, device="meta"))
    seen = []
    solve_model = BulkHiGHS.callSolver

    def compare(self, lp):
        reference = _model_text(lp, pulp.HiGHS(msg=False), tmp_path / "pulp.mps")
        bulk = _model_text(lp, self, tmp_path / "bulk.mps")
        seen.append((bulk == reference, lp.numVariables(), lp.numConstraints()))
        return solve_model(self, lp)

    monkeypatch.setattr(BulkHiGHS, "callSolver", compare)
    with contextlib.redirect_stdout(io.StringIO()):
        parallelizer.plan(traced, {"dp": 2, "tp": 2})
    assert seen and all(same for same, _, _ in seen), seen
    assert seen[0][1] > 100 and seen[0][2] > 50  # a model with pair variables and rows, not a trivial one


@pytest.mark.parametrize("kind", ["variable", "list", "one"])
def test_at_least_is_the_row_pulps_operators_build(kind):
    """`_at_least(y, ind)` == `y - ind >= 0` term for term (order, coefficients), constant (value and type) and
    sense; a list stands for PuLP's lpSum of its variables."""
    prob = pulp.LpProblem("rows", pulp.LpMinimize)
    y = prob.add_variable("y", 0, 1)
    vs = [prob.add_variable(f"v_{i}", 0, 1) for i in range(3)]
    ind = {"variable": vs[0], "list": vs, "one": 1}[kind]
    ours = _at_least(y, ind)
    theirs = y - (pulp.lpSum(ind) if kind == "list" else ind) >= 0
    as_data = lambda c: ([(v.name, c2) for v, c2 in c.items()], c.constant, type(c.constant), c.sense)  # noqa: E731
    assert as_data(ours) == as_data(theirs)
    assert (ours.getLb(), ours.getUb()) == (theirs.getLb(), theirs.getUb())


def test_frozen_heap_freezes_only_for_its_block_and_never_undoes_a_callers_freeze():
    if not gc.isenabled() or gc.get_freeze_count():
        pytest.skip("the collector is off or something is frozen in this process")
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        cycle = []
        cycle.append(cycle)  # garbage made inside is still collected
        del cycle
        assert gc.collect(0) >= 1  # (the youngest generation: where the cycle is; cheap)
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        held = gc.get_freeze_count()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() == held  # the caller's freeze stays
    finally:
        gc.unfreeze()


def test_cached_impossible_redistribution_holds_no_traceback():
    """An impossible layout change is cached without the frames it was raised in (they would live as long as the
    Pricer, in a cycle: round 26 measured 5.6k per 2x2 Llama plan), and is raised again, with its message."""
    mesh = MeshSpec(("dp", "tp"), (2, 4))  # the 8 devices of one node
    pricer = Pricer(MeshTopology(dgx_h100(1), mesh.shape, mesh.axis_names), mesh, PlanConfig())
    src, dst = Layout.parse("RR"), Layout.parse("PR")
    for _ in range(2):
        with pytest.raises(ImpossibleRedistributionError, match="no collective makes a Partial"):
            pricer.steps(src, dst, (4, 6), torch.float32, (), True)
    (cached,) = [v for v in pricer._steps.values() if isinstance(v, ImpossibleRedistributionError)]
    assert cached.__traceback__ is None


def test_tensors_in_is_flatten_order_and_leaves_no_garbage_cycle():
    t, u = torch.zeros(2), torch.ones(3)
    tree = ((t, [u, {"b": 2, "a": t}]), {"k": u, "n": None})
    assert tensors_in(tree) == [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]
    gc.collect(0)
    gc.disable()  # what the calls make stays in the youngest generation, which collect(0) searches
    try:
        for _ in range(50):
            tensors_in(tree)
        assert gc.collect(0) == 0
    finally:
        gc.enable()
