"""Recomputation traded for a faster layout (issue 13, round 16): under recompute="auto" the ILP on a fixed mesh
chooses recomputation jointly with the layout by time (`ilp.solve`), and recomputation is priced with the forward
collectives it runs again (`recompute.RegionRecompute.rerun_edges`, `RegionPrice.rerun_comm_s`), the same in the
ILP's linear forms, a fixed plan's cost (`api.recompute_prices`, `to_plan`) and `estimate_step_time`.
Every expected figure is computed independently: the closed form of one all-reduce, `estimate_step_time` of the
alternatives."""
import dataclasses

import pytest
import torch

import parallelizer
from cost_model.communication import collective_time_s
from cost_model.topology import MeshTopology, get_cluster
from parallelizer import zoo
from parallelizer.config import PlanConfig
from parallelizer.core import MeshSpec
from parallelizer.planner import plan
from parallelizer.planner.api import build, recompute_prices
from parallelizer.planner.ilp import recompute_cost, solve
from parallelizer.planner.problem import layout_of
from parallelizer.planner.steptime import estimate_step_time

B, T, C = 4, 32, 64  # batch, sequence, width of the tensor-parallel MLP blocks
TP2 = MeshSpec(("tp",), (2,))
CLUSTER = "h100:1x2"  # bf16: 2 bytes per activation element
DP8 = MeshSpec(("dp",), (8,))


class _Block(nn_module := torch.nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.up, self.down = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x):  # (B, T, C)
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class _Net(nn_module):
    def __init__(self, c: int, n: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(c) for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


@pytest.fixture(scope="module")
def mlp_tp():
    """Two MLP blocks (the smallest repeated block) on meta."""
    with torch.device("meta"):
        m = _Net(C, 2)
    return parallelizer.trace(m, (torch.empty(B, T, C, device="meta"),))


def test_full_recomputation_reruns_the_blocks_all_reduce(mlp_tp):
    """Megatron's MLP on tp=2 (column-parallel up, row-parallel down, Partial -> all-reduce before the bias add):
    recomputing a block "full" runs its forward all-reduce again. The ILP's linear form, the fixed-plan price,
    the plan's cost breakdown and `estimate_step_time` all add exactly one all-reduce of the block's output
    (B x T x C bf16 elements, summed in float32: 4 B each, `core.redistribute.sum_itemsize`, round 24) per block:
    the closed form of `collective_time_s`."""
    config = PlanConfig(axis_roles=(("tp", "tp"),))
    problem, pricer = build(mlp_tp, TP2, cluster=CLUSTER, config=config)
    choice = solve(problem, dataclasses.replace(config, recompute="none")).choice
    strat = {n: layout_of(problem, n, choice) for n in problem.spaces}
    assert [str(strat[n].output) for n in ("linear_default", "linear_default_1")] == ["S(2)", "P"]  # Megatron
    topo = MeshTopology(get_cluster(CLUSTER), (2,), ("tp",))
    all_reduce_s = collective_time_s("all_reduce", B * T * C * 4, topo, ("tp",)) + topo.cluster.device.collective_sync_s
    rp = recompute_prices(mlp_tp, problem, pricer, strat, {"blocks.0": "full"})["blocks.0"]
    assert rp.rerun_comm_s == pytest.approx(all_reduce_s, rel=1e-12)
    assert rp.extra_s == pytest.approx(rp.extra_fwd_s + all_reduce_s, rel=1e-12)
    # the ILP's linear form of one instance at the same choice (the class of both blocks)
    assert len(problem.recompute_classes) == 1  # both blocks, priced at the first one's terms
    assert recompute_cost(problem, choice, {0: {"full": 1}})[0] == pytest.approx(rp.extra_s, rel=1e-9)
    # estimate_step_time of the same layouts with both blocks recomputed: compute + one all-reduce per block
    none = plan(mlp_tp, TP2, cluster=CLUSTER, axis_roles={"tp": "tp"}, recompute="none")
    assert {n: none.nodes[n].output for n in ("linear_default", "linear_default_1")} == \
        {"linear_default": "S(2)", "linear_default_1": "P"}
    both = dataclasses.replace(none, recompute={"blocks.0": "full", "blocks.1": "full"})
    st = estimate_step_time(mlp_tp, both, cluster=CLUSTER)
    rps = recompute_prices(mlp_tp, problem, pricer, strat, {"blocks.0": "full", "blocks.1": "full"}).values()
    assert st.recompute_s == pytest.approx(sum(p.extra_s for p in rps), rel=1e-9)
    assert st.recompute_s - sum(p.extra_fwd_s for p in rps) == pytest.approx(2 * all_reduce_s, rel=1e-9)
    # the plan the planner makes with "full" forced: its cost (what `show` prints) is the ILP's objective
    full = plan(mlp_tp, TP2, cluster=CLUSTER, axis_roles={"tp": "tp"}, recompute="full")
    assert full.cost.total_s == pytest.approx(full.solver.objective_s, rel=1e-9)


@pytest.fixture(scope="module")
def mlp_dp():
    m, inp = zoo.mlp(depth=2, batch=16384, dim=256, hidden=1024, in_features=256, out_features=256, device="meta")
    return parallelizer.trace(m, inp)


def test_auto_trades_recomputation_for_a_faster_layout(mlp_dp):
    """dp=8, a budget where the replicated state (DDP, the time-optimal layout) does not fit without
    recomputation: before round 16 "auto" kept FSDP (recomputation only when nothing fits); now it takes DDP with
    the blocks recomputed, which `estimate_step_time` prices faster than the FSDP plan, within the budget."""
    ddp = plan(mlp_dp, DP8)
    # the budget binds on the step's peak (round 26, r26d): halfway between the DDP plan's peak and the peak of the
    # same layout with every region recomputed in full (each priced by its own walk of the step)
    full = plan(mlp_dp, DP8, axis_roles={"dp": "ddp"}, recompute="full")
    budget = (ddp.cost.memory_bytes["peak"] + full.cost.memory_bytes["peak"]) // 2
    assert ddp.cost.memory_bytes["peak"] > budget  # the fastest layout does not fit without recomputation
    lean = plan(mlp_dp, DP8, memory_budget_bytes=budget, recompute="none")
    auto = plan(mlp_dp, DP8, memory_budget_bytes=budget)
    assert any(p.stored.startswith("S(") for p in lean.params.values())  # sharded without recomputation
    assert {p.stored for p in auto.params.values()} == {"R"} and set(auto.recompute.values()) == {"full"}
    assert auto.cost.memory_bytes["peak"] <= budget and lean.cost.memory_bytes["peak"] <= budget
    t_lean, t_auto = (estimate_step_time(mlp_dp, p).total_s for p in (lean, auto))
    assert t_auto < t_lean * 0.9  # 332 us against 381 us on the default H100 node (r26d, under load: same figures)
    # the layout alone, without recomputation, is DDP's: too large
    assert {n.output for n in dataclasses.replace(auto, recompute={}).nodes.values()} == \
        {n.output for n in ddp.nodes.values()}


def test_auto_keeps_the_plan_where_recomputation_does_not_pay(mlp_tp):
    """A budget that binds (the time-optimal layout does not fit) where recomputing a block costs more than
    the leaner layout: "auto" solves the joint ILP too and keeps the plan without recomputation, the same
    layouts and cost as recompute="none"."""
    kw = dict(cluster=CLUSTER, memory_reserve_bytes=0)
    free = plan(mlp_tp, MeshSpec(("dp",), (2,)), recompute="none", **kw)
    budget = free.cost.memory_bytes["total"] - 1
    none = plan(mlp_tp, MeshSpec(("dp",), (2,)), recompute="none", memory_budget_bytes=budget, **kw)
    auto = plan(mlp_tp, MeshSpec(("dp",), (2,)), memory_budget_bytes=budget, **kw)
    assert auto.recompute == {} and auto.nodes == none.nodes and auto.params == none.params
    assert auto.cost == none.cost
    full = plan(mlp_tp, MeshSpec(("dp",), (2,)), recompute="full", memory_budget_bytes=budget, **kw)
    assert estimate_step_time(mlp_tp, full, cluster=CLUSTER).total_s > \
        estimate_step_time(mlp_tp, none, cluster=CLUSTER).total_s  # recomputation would be slower here


def test_pipeline_segment_prices_include_the_rerun_collectives(mlp_tp):
    """The pipeline search's recomputation price of a block (`SegmentPrices.rc_extra_lin`, what a stage adds to
    its backward) is the same `price_region` with the re-run collectives: at the segment ILP's Megatron layout on
    tp=2, "full" adds the block's forward compute plus one all-reduce (closed form); "selective" (no attention core)
    adds nothing. So a stage's (time-optimal layout, recomputation) pair is priced honestly against the lean
    layout without recomputation (`candidates._Context._evaluate_layouts`)."""
    from parallelizer.planner.segments import price_segments, segment_graph

    config = PlanConfig(axis_roles=(("tp", "tp"),))
    segs = segment_graph(mlp_tp)
    pr = price_segments(mlp_tp, segs, 2, get_cluster("h100:1x2"), config)
    problem, pricer = build(mlp_tp, TP2, cluster=CLUSTER, config=config)
    strat = {n: layout_of(problem, n, solve(problem, config).choice) for n in problem.spaces}
    topo = MeshTopology(get_cluster(CLUSTER), (2,), ("tp",))
    all_reduce_s = collective_time_s("all_reduce", B * T * C * 4, topo, ("tp",)) + topo.cluster.device.collective_sync_s
    rp = recompute_prices(mlp_tp, problem, pricer, strat, {"blocks.0": "full"})["blocks.0"]
    assert rp.rerun_comm_s == pytest.approx(all_reduce_s, rel=1e-12)
    # segment 1 = blocks.0; blocks.1 (same strategies) takes the same price (`segments._recompute_prices`)
    assert list(pr.rc_extra_lin["full"][1:3]) == pytest.approx([rp.extra_fwd_s + all_reduce_s] * 2, rel=1e-9)
    assert list(pr.rc_extra_lin["selective"]) == [0.0] * len(pr.rc_extra_lin["selective"])
