"""Activation recomputation as a planner decision (`planner/recompute.py`, `problem.py`, `ilp.py`,
`segments.py`, `partition.py`, `search.py`): pricing against closed forms (Korthikanti et al. 2022), the
ILP's choice under budgets between the modes' needs, forced regions, the pipeline search."""
import pytest
import torch

import parallelizer
from parallelizer import zoo
from parallelizer.config import PlanConfig
from parallelizer.core import MeshSpec
from parallelizer.errors import InfeasiblePlanError
from parallelizer.planner import plan
from parallelizer.planner.api import build, recompute_prices
from parallelizer.planner.ilp import solve
from parallelizer.planner.partition import ChainCosts, partition_chain
from parallelizer.planner.recompute import attention_core, forced_regions, region_recompute, regions, shared_inputs
from parallelizer.planner.problem import layout_of, min_memory_bytes
from parallelizer.planner.search import plan_pipeline

B, T, C, A, L = 2, 64, 64, 4, 3  # batch, sequence, hidden, heads, layers
MESH = MeshSpec(("dp",), (2,))
CLUSTER = "h100:1x2"  # a GPU preset: bf16; the model traced in bf16: 2 bytes per activation element (an fp32
# model planned in bf16 is priced in the dtypes autocast runs since round 25, `planner.autocast_dtypes`)
DDP = {"dp": "ddp"}  # parameters replicated: only recomputation can lower activation memory


@pytest.fixture(scope="module")
def gpt2():
    """transformers GPT-2 (eager attention: matmul, softmax, dropout, matmul), on meta."""
    m, inp = zoo.gpt2(n_layer=L, n_embd=C, n_head=A, vocab_size=128, n_positions=T, batch=B, seq_len=T,
                      device="meta")
    return parallelizer.trace(m.to(torch.bfloat16), inp)


def _none_plan(tg, **kw):
    return plan(tg, MESH, cluster=CLUSTER, axis_roles=DDP, **kw)


@pytest.fixture(scope="module")
def plans(gpt2):
    """The plans with recomputation "auto" (ample memory), "selective" and "full" forced."""
    return {mode: _none_plan(gpt2, recompute=mode) for mode in ("auto", "selective", "full")}


@pytest.fixture(scope="module")
def solved(gpt2):
    """(problem, pricer, strategies) of the plan without recomputation."""
    config = PlanConfig(axis_roles=DDP)
    problem, pricer = build(gpt2, MESH, cluster=CLUSTER, config=config)
    choice = solve(problem, config).choice
    return problem, pricer, {n: layout_of(problem, n, choice) for n in problem.spaces}


def _saved_and_fwd(tg, solved, region):
    """Sum of saved bytes and forward seconds of a region's ops at the none plan's strategies."""
    problem, pricer, strat = solved
    costs = [pricer.node_cost(tg, tg.nodes[n], problem.spaces[n], strat[n]) for n in regions(tg)[region]
             if problem.spaces[n].kind == "op"]
    return sum(c.saved_bytes for c in costs), sum(c.fwd_s for c in costs)


def test_attention_core_and_pricing_closed_forms(gpt2, solved):
    region = "transformer.h.1"
    nodes = regions(gpt2)[region]
    core = attention_core(gpt2, nodes)
    assert [gpt2.nodes[n].op_name.split(".")[1] for n in core] == ["matmul", "mul", "add", "softmax", "to",
                                                                  "dropout", "matmul"]
    problem, pricer, strat = solved
    saved, fwd = _saved_and_fwd(gpt2, solved, region)
    prices = recompute_prices(gpt2, problem, pricer, strat, {region: "selective"})[region]
    # Korthikanti et al. 2022, Sec. 4.1: softmax output 2as^2b, dropout mask as^2b, dropout output 2as^2b bytes
    # (bf16): the 5as^2b of the attention core that selective recomputation drops; Q, K, V stay (per
    # data-parallel rank: b = B / 2). With p = 0 (zoo's GPT-2 trains without dropout) there is no mask and the
    # dropout output is the softmax output, one storage counted once: 2as^2b
    b = B // 2
    p_drop = gpt2.nodes[core[5]].node.args[1]
    assert prices.saved_delta_bytes == -(5 if p_drop > 0 else 2) * A * T * T * b
    assert 0 < prices.extra_fwd_s < fwd
    full = recompute_prices(gpt2, problem, pricer, strat, {region: "full"})[region]
    rr = region_recompute(gpt2, region, nodes, "full", shared_inputs(gpt2))
    assert [gpt2.nodes[n].op_name for n, _ in rr.kept_inputs] == ["aten.layer_norm.default"]  # the block input
    assert full.saved_delta_bytes == 2 * b * T * C - saved  # Chen et al. 2016: keep only the block input
    assert full.extra_fwd_s == pytest.approx(fwd, rel=1e-12)  # the block's whole forward runs again


def test_forced_modes_in_plan(gpt2, solved, plans):
    base, full = plans["auto"], plans["full"]
    saved, fwd = _saved_and_fwd(gpt2, solved, "transformer.h.0")
    assert full.recompute == {f"transformer.h.{i}": "full" for i in range(L)}
    assert full.cost.memory_bytes["activations"] == base.cost.memory_bytes["activations"] + L * (2 * (B // 2) * T * C - saved)
    assert full.cost.compute_s == pytest.approx(base.cost.compute_s + L * fwd, rel=1e-9)
    assert full.to_dict()["recompute"] == full.recompute
    assert full.config["recompute"] == "full"


def test_auto_picks_none_when_memory_is_ample(gpt2, plans):
    auto, none = plans["auto"], _none_plan(gpt2, recompute="none")
    assert auto.recompute == {} and "recompute" not in auto.to_dict()
    assert "recompute" not in auto.config  # "auto" is the default: plan JSON as before the option
    assert auto.nodes == none.nodes and auto.cost == none.cost


def test_auto_recomputes_when_the_budget_needs_it(gpt2, solved, plans):
    """Budgets on the step's peak (round 26, r26d: the budget binds on `memory_bytes["peak"]`, not the sum of kinds),
    set from the peaks of the forced-mode plans, each priced by its own walk of the step: just under the plan without
    recomputation's peak needs some recomputation; between selective-everywhere's and full-everywhere's peaks needs
    at least one block in full; recompute='none' there is a typed error naming the option; half of full's is
    infeasible even with recomputation. The sum's per-block recomputation deltas keep their closed form."""
    base, sel, full = plans["auto"], plans["selective"], plans["full"]
    m0, m_sel, m_full = (p.cost.memory_bytes["total"] for p in (base, sel, full))
    p0, p_sel, p_full = (p.cost.memory_bytes["peak"] for p in (base, sel, full))
    assert m_full < m_sel < m0 and p_full < p_sel < p0
    d_sel, d_full = (m_sel - m0) // L, (m_full - m0) // L  # per block (each block alike)
    lean = min_memory_bytes(solved[0])
    some = _none_plan(gpt2, memory_budget_bytes=p0 - 1)  # the layout cannot change (ddp): recomputation must
    p = _none_plan(gpt2, memory_budget_bytes=(p_sel + p_full) // 2)  # selective everywhere is not enough
    modes = list(p.recompute.values())
    n_sel, n_full = modes.count("selective"), modes.count("full")
    assert some.recompute and n_full >= 1 and n_sel + n_full <= L
    for q in (some, p):
        modes = list(q.recompute.values())
        n_s, n_f = modes.count("selective"), modes.count("full")
        total = q.cost.memory_bytes["total"]
        assert lean + n_s * d_sel + n_f * d_full <= total <= m0 + n_s * d_sel + n_f * d_full
        assert q.cost.memory_bytes["peak"] <= q.config["memory_budget_bytes"]
        assert q.cost.compute_s > base.cost.compute_s
    with pytest.raises(InfeasiblePlanError, match="recompute='none'.*--recompute"):
        _none_plan(gpt2, memory_budget_bytes=p0 - 1, recompute="none")
    with pytest.raises(InfeasiblePlanError, match="even with activation recomputation"):
        _none_plan(gpt2, memory_budget_bytes=p_full // 2)


def test_user_checkpoint_regions_are_forced(gpt2, monkeypatch):
    def user(regions):  # what the tracer reports (`TracedGraph.user_recompute`, a property of its nodes)
        monkeypatch.setattr(type(gpt2), "user_recompute", property(lambda self: regions))
    user({"transformer.h.1": "full"})
    assert _none_plan(gpt2, recompute="none").recompute == {"transformer.h.1": "full"}
    user({"transformer.h.2.mlp": "full"})  # inside a block: the block is recomputed
    assert forced_regions(gpt2) == {"transformer.h.2": "full"}
    user({"transformer.h.2@checkpoint0": "full"})  # part of a block's own module
    assert forced_regions(gpt2) == {"transformer.h.2": "full"}
    user({"transformer.h": "full"})  # holds the blocks
    assert forced_regions(gpt2) == {f"transformer.h.{i}": "full" for i in range(L)}
    user({"lm_head": "full"})  # outside every block: not a planner region, emitted as the user asked
    assert forced_regions(gpt2) == {}
    assert parallelizer.plan(gpt2, MESH, cluster=CLUSTER, axis_roles=DDP).recompute == {"lm_head": "full"}


def test_config_validates_recompute():
    with pytest.raises(ValueError, match="PlanConfig.recompute='some'"):
        PlanConfig(recompute="some")


def test_partition_takes_the_cheapest_mode_that_fits():
    # two blocks; mode 1 is slower but needs half the activations
    chain = ChainCosts((1.0, 1.0), (0.0, 0.0), (4.0, 4.0), modes=("none", "full"),
                       mode_block_s=((1.0, 1.0), (1.5, 1.5)), mode_block_act_bytes=((4.0, 4.0), (2.0, 2.0)))
    assert partition_chain(chain, 2, (2.0, 1.0), 4.0).modes == (1, 0)  # stage 0 holds 2 microbatches
    part = partition_chain(chain, 2, (1.0, 1.0), 4.0)
    assert part.modes == (0, 0) and part.max_stage_s == 1.0
    assert partition_chain(chain, 1, (1.0,), 4.0).modes == (1,)
    assert partition_chain(chain, 1, (1.0,), 3.0) is None


def test_pipeline_search_recomputes_when_the_budget_forces_it(gpt2):
    kw = dict(global_batch=16, pp=3, tp=1, schedules=("1f1b",), num_microbatches=8, progress=False)
    free = plan_pipeline(gpt2, "a100:1x6", memory_budget_bytes=10 ** 12, **kw)
    assert [s.recompute for s in free.stages] == ["none"] * 3
    assert free.config["memory_reserve_bytes"] == 0  # an explicit budget: no default reserve (as plan())
    budget = int(free.memory_bytes * 0.9)
    tight = plan_pipeline(gpt2, "a100:1x6", memory_budget_bytes=budget, **kw)
    assert tight.memory_bytes <= budget
    assert tight.stages[0].recompute != "none"  # the first stage holds the most microbatches in flight
    assert tight.step_time_s > free.step_time_s
    with pytest.raises(InfeasiblePlanError, match="after a reserve of"):  # the reserve is kept out, as in plan()
        plan_pipeline(gpt2, "a100:1x6", memory_budget_bytes=budget, memory_reserve_bytes=budget // 2, **kw)


def test_summary_and_cli_flag(plans, tmp_path):
    from parallelizer import cli
    from parallelizer.planner import Plan
    text = plans["selective"].summary()
    assert "recomputation: selective on 3 blocks (transformer.h.0, transformer.h.1, transformer.h.2)" in text
    assert "recomputation: none" in plans["auto"].summary()
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "gpt", "--config", "n_layer=2,n_embd=32,n_head=2,vocab_size=64,block_size=16",
                     "--global-batch", "4", "--no-progress", "--mesh", "dp=2", "--recompute", "full",
                     "-o", str(out)]) == 0
    assert Plan.load(out).recompute == {"h.0": "full", "h.1": "full"}


def test_explain_prices_the_plans_recomputation(gpt2, plans):
    """r21g finding 3: `explain` priced every alternative without the plan's recomputation, so on a plan that
    recomputes its chosen row was not the plan (objective lower, memory over the budget). Now the chosen row is
    the solver's objective and the plan's memory total, and an alternative carries the same regions' price."""
    # a budget between the peaks without and with full recomputation (round 26: the budget binds on the peak)
    p0, p_full = plans["auto"].cost.memory_bytes["peak"], plans["full"].cost.memory_bytes["peak"]
    p = _none_plan(gpt2, memory_budget_bytes=(p0 + p_full) // 2)
    assert p.recompute  # the budget needs recomputation
    node = next(n for n, q in p.nodes.items() if q.op == "aten.mm.default")
    e = parallelizer.explain(gpt2, p, node, cluster=CLUSTER)
    row = next(a for a in e.alternatives if a[0] == e.chosen)
    assert e.chosen_s == pytest.approx(p.solver.objective_s, rel=1e-12)
    assert e.chosen_s == pytest.approx(p.cost.total_s, rel=1e-12)
    assert row[2] == p.cost.memory_bytes["total"] and row[3]  # fits: it is the plan
    assert "[over memory budget]" not in str(e).splitlines()[1]
