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
SEEDS = {2: ("S(1)", ("R", "S(2)", "R")), 7: ("P", ("S(1)", "S(1)", "R"))}  # seed: the experts' layout it gives


@pytest.fixture(scope="module")
def reports():
    plans = {seed: random_cost_plan(mixtral, {"tp": 2}, {}, seed) for seed in SEEDS}
    got = rehearse_many([(mixtral, {}, plans[seed]) for seed in SEEDS], steps=3)
    return {seed: (plans[seed], report) for seed, report in zip(SEEDS, got)}


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_mixtral_experts_are_sharded_and_train_as_one_device(reports, seed):
    plan, report = reports[seed]
    assert not plan.fallbacks, plan.fallbacks
    experts = [(n.output, n.inputs) for n in plan.nodes.values() if n.op == "transformers.grouped_mm_fallback.default"]
    assert len(experts) == 4 and all(e == SEEDS[seed] for e in experts), experts
    assert report.matches(), report
