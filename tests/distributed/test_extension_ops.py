"""Custom ops other libraries register (`planner.rules.table.EXTENSIONS`), trained on gloo ranks against one
device. transformers 5 runs Mixtral's experts on CPU / float32 through `transformers::grouped_mm_fallback`
(rows of tokens sorted by expert times each expert's weight), an op that exists only once transformers' MoE
integration is imported: it had no row, so every expert matmul ran replicated (the four expert weights of a
2-layer Mixtral gathered on every rank under tp, a fallback note each). Its row (column parallel over the
output features, row parallel over the contracted features into a Partial, Partial in either operand) is
verified by the rule harness; here random ILP costs on tp=2 reach the column- and row-parallel options on whole
Mixtral models and 3 AdamW steps match one device."""
import pytest

from coverage_models import mixtral
from parallelizer.runtime.rehearsal import rehearse_many
from plan_cases import random_cost_plan

pytestmark = pytest.mark.distributed
SEEDS = (2, 7)  # random ILP costs; together they reach both sharded layouts of the experts (below)
SHARDED = {("S(1)", ("R", "S(2)", "R")): "column parallel over the output features",
           ("P", ("S(1)", "S(1)", "R")): "row parallel over the contracted features into a Partial"}
REPLICATED = ("R", ("R", "R", "R"))


@pytest.fixture(scope="module")
def reports():
    plans = {seed: random_cost_plan(mixtral, {"tp": 2}, {}, seed) for seed in SEEDS}
    got = rehearse_many([(mixtral, {}, plans[seed]) for seed in SEEDS], steps=3)
    return {seed: (plans[seed], report) for seed, report in zip(SEEDS, got)}


def _experts(plan):
    return [(n.output, n.inputs) for n in plan.nodes.values() if n.op == "transformers.grouped_mm_fallback.default"]


@pytest.mark.parametrize("seed", SEEDS)
def test_mixtral_experts_are_sharded_and_train_as_one_device(reports, seed):
    plan, report = reports[seed]
    assert not plan.fallbacks, plan.fallbacks
    experts = _experts(plan)
    assert len(experts) == 4 and set(experts) <= set(SHARDED) | {REPLICATED}, experts
    assert report.matches(), report


def test_the_seeds_reach_both_sharded_layouts_of_the_experts(reports):
    """The seeds' random costs (which move whenever the planner's strategy lists change: round 26 added batch-split
    copies of parameter-derived values) must together reach the column- and the row-parallel row."""
    reached = {e for plan, _ in reports.values() for e in _experts(plan)}
    assert set(SHARDED) <= reached, reached
