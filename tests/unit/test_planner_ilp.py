"""Planner unit tests: clustered == unclustered objective, closed-form DP objective, determinism, JSON,
infeasibility message, explain, fallbacks."""
import pytest
import torch

import parallelizer
from cost_model.communication import collective_time_s
from cost_model.memory import training_state_bytes
from cost_model.topology import MeshTopology, dgx_h100
from parallelizer import zoo
from parallelizer.config import PlanConfig
from parallelizer.core import MeshSpec
from parallelizer.errors import InfeasiblePlanError
from parallelizer.planner import Plan, build, explain, plan
from parallelizer.planner.costs import Pricer

DP8 = MeshSpec(("dp",), (8,))


@pytest.fixture(scope="module")
def big_batch_mlp():
    """Activations >> weights, so data parallelism wins."""
    m, inp = zoo.mlp(depth=2, batch=16384, dim=256, hidden=1024, in_features=256, out_features=256, device="meta")
    return parallelizer.trace(m, inp)


@pytest.fixture(scope="module")
def small_gpt():
    m, inp = zoo.gpt(n_layer=2, n_embd=256, n_head=4, block_size=128, vocab_size=512, batch=8, with_targets=True,
                     device="meta")
    return parallelizer.trace(m, inp)


def test_clustered_objective_equals_unclustered(small_gpt):
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    clustered = plan(small_gpt, mesh)
    flat = plan(small_gpt, mesh, cluster_blocks=False)
    assert clustered.solver.num_groups < flat.solver.num_groups
    assert clustered.solver.optimal and flat.solver.optimal
    assert clustered.solver.objective_s == pytest.approx(flat.solver.objective_s, rel=1e-9)


def test_pure_dp_objective_is_closed_form(big_batch_mlp):
    """DDP on a 1-D mesh: sum of local compute + each parameter's share of its gradient bucket's all-reduce
    (n bytes of a 25 MiB bucket B: t(B) * n / B, the runtime's buckets) + the gather of the (batch-sharded)
    output to a replicated output. bf16 (the H100 default): the fp32-traced output is gathered in bf16
    (2 B/element), gradients are reduced as fp32 main gradients (4 B/element)."""
    p = plan(big_batch_mlp, DP8)
    assert p.config["precision"] == "bf16"
    topo = MeshTopology(dgx_h100(1), (8,), ("dp",))
    pricer = Pricer(topo, DP8, PlanConfig(), big_batch_mlp)
    bucket = 25 * 2**20
    grad_sync = sum(collective_time_s("all_reduce", bucket, topo, ("dp",)) * prm.numel * 4 / bucket
                    for prm in big_batch_mlp.parameters.values())
    out = next(n for n in big_batch_mlp.nodes.values() if n.op == "output")
    out_bytes = big_batch_mlp.nodes[out.node.args[0][0].name].nbytes // 2  # fp32 traced, priced as bf16
    gather = collective_time_s("all_gather", out_bytes, topo, ("dp",))
    compute = 0.0
    problem, _ = build(big_batch_mlp, DP8, config=PlanConfig())
    for name, space in problem.spaces.items():
        if space.kind == "op":
            s = next(s for s in space.strategies if str(s.output) == p.nodes[name].output
                     and tuple(map(str, s.inputs)) == p.nodes[name].inputs)
            compute += pricer.node_cost(big_batch_mlp, big_batch_mlp.nodes[name], space, s).total_s
    assert p.cost.comm_s["all_reduce"] == pytest.approx(grad_sync, rel=1e-9)
    assert p.solver.objective_s == pytest.approx(compute + grad_sync + gather, rel=1e-9)
    assert p.cost.total_s == pytest.approx(p.solver.objective_s, rel=1e-9)


def test_plan_json_is_deterministic_and_round_trips(small_gpt):
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    a, b = plan(small_gpt, mesh), plan(small_gpt, mesh)
    assert a.to_json() == b.to_json()
    again = Plan.from_json(a.to_json())
    assert again.to_json() == a.to_json() and again.mesh == mesh
    assert "time_s" in a.to_json() and a.solver.time_s is not None  # kept on the object, nulled in JSON


def test_infeasible_names_binding_constraint_and_remedies(big_batch_mlp):
    import re

    from parallelizer.config import PlanConfig
    from parallelizer.errors import format_bytes
    from parallelizer.planner.api import build
    from parallelizer.planner.problem import min_memory_bytes
    problem, _ = build(big_batch_mlp, DP8, config=PlanConfig(memory_budget_bytes=1000, recompute="none"))
    need = format_bytes(min_memory_bytes(problem))  # the least memory any plan needs, in units that fit it
    with pytest.raises(InfeasiblePlanError, match=re.escape(f"memory: needs >= {need} per device, budget 1.0 kB")) as err:
        plan(big_batch_mlp, DP8, memory_budget_bytes=1000, recompute="none")
    assert "more devices" in str(err.value) and "gradient accumulation" in str(err.value)
    assert "activation recomputation (recompute='auto'" in str(err.value)


def test_explain_and_fallbacks(small_gpt):
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    p = plan(small_gpt, mesh)
    first_linear = next(n for n, node in p.nodes.items() if node.op == "aten.linear.default")
    ex = explain(small_gpt, p, first_linear)
    assert ex.alternatives[0][1] <= ex.chosen_s + 1e-12  # nothing beats the optimum with the rest fixed
    assert "chosen" in str(ex)
    assert p.fallbacks == ()  # every op of the in-repo GPT has a rule
    assert "Plan on mesh (dp=2, tp=4)" in p.summary()


def test_explain_prints_alternatives_excluded_by_forced_roles_as_excluded(big_batch_mlp):
    """Under `axis_roles={"dp": "ddp"}` the alternatives that would not be DDP cost math.inf; they used to print
    as "inf ms (+inf ms)" with no reason."""
    p = plan(big_batch_mlp, DP8, axis_roles={"dp": "ddp"})
    first_linear = next(n for n, node in p.nodes.items() if node.op == "aten.linear.default")
    ex = explain(big_batch_mlp, p, first_linear)
    excluded = [a for a in ex.alternatives if a[1] == float("inf")]
    assert excluded and ex.chosen_s < float("inf")
    text = str(ex)
    finite = len(ex.alternatives) - len(excluded)
    assert "inf ms" not in text and text.count("excluded (a forced axis role") == min(len(excluded), 8 - finite) > 0


@pytest.mark.parametrize("precision, per_param", [("bf16", (2, 4, 12)), ("fp32", (4, 4, 8))])
def test_training_state_budget_helper_matches_cost_model(big_batch_mlp, precision, per_param):
    p = plan(big_batch_mlp, DP8, precision=precision)
    n = big_batch_mlp.num_parameters
    state = training_state_bytes(n, precision)
    mem = p.cost.memory_bytes
    assert (mem["params"], mem["grads"], mem["optimizer"]) == tuple(b * n for b in per_param)  # DDP: replicated
    assert mem["params"] + mem["grads"] + mem["optimizer"] == state.total_bytes


def test_unreachable_strategy_is_never_chosen():
    """The head bias (10,) cannot be sharded 4 ways, so it is stored R only, and add(P, P) cannot take it
    (R -> P is impossible). Before the fix, PuLP reset the upper bound 0 of that binary and the solver
    picked the impossible strategy; assembling the plan then raised ImpossibleRedistributionError."""
    import contextlib
    import io

    import parallelizer
    from parallelizer import zoo
    traced = parallelizer.trace(*zoo.mlp(in_features=32, dim=1024, hidden=4096, depth=2, batch=64, device="meta"))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"dp": 4})
    head_add = [e for e in plan.edges if e.src == "p_head_bias"]
    assert head_add and all(e.dst_layout != "P" for e in head_add)


def _one_group_problem(lin, mem, counts=None):
    import numpy as np

    from parallelizer.planner.problem import Problem
    return Problem(DP8, {}, {"n": 0}, [["n"]], [("node", "n")], [np.array(lin)], [np.array(mem, dtype=float)], {},
                   0, 10**12, lin_counts=[np.array(counts or [0] * len(lin), dtype=float)])


@pytest.mark.parametrize("order", [0, 1])
def test_ties_break_toward_less_memory_then_fewer_collectives(order):
    """Two strategies with the same estimated time: the one holding less memory is chosen, in either order;
    equal time and memory: the one launching fewer collectives."""
    from parallelizer.planner.ilp import solve
    mem = [2e9, 1e9] if order == 0 else [1e9, 2e9]
    assert solve(_one_group_problem([1e-3, 1e-3], mem), PlanConfig()).choice == (1 - order,)
    counts = [3, 1] if order == 0 else [1, 3]
    assert solve(_one_group_problem([1e-3, 1e-3], [1e9, 1e9], counts), PlanConfig()).choice == (1 - order,)


def test_tie_break_never_overturns_a_strictly_faster_choice():
    """The tie-break term lies in [0, TIE_RESOLUTION_US]: a strategy faster by more than that wins even when it
    holds 1000x the memory and launches more collectives."""
    from parallelizer.planner.ilp import TIE_RESOLUTION_US, solve, tie_break_weights
    faster = 1e-3 - 2 * TIE_RESOLUTION_US * 1e-6  # seconds
    problem = _one_group_problem([1e-3, faster], [1e9, 1e12], [0, 50])
    w_mem, w_coll = tie_break_weights(problem)
    assert w_mem * 1e12 + w_coll * 50 <= TIE_RESOLUTION_US
    assert solve(problem, PlanConfig()).choice == (1,)


def test_precision_and_reserve_are_recorded_and_round_trip(big_batch_mlp):
    p = plan(big_batch_mlp, DP8)  # H100: bf16 and the default reserve (the budget is the device memory)
    assert (p.config["precision"], p.config["memory_budget_bytes"], p.config["memory_reserve_bytes"]) == \
        ("bf16", 80_000_000_000, 9_000_000_000)
    assert p.cost.memory_bytes["reserve"] == 9_000_000_000
    again = Plan.from_json(p.to_json())
    assert again.config["precision"] == "bf16" and again.cost.memory_bytes == p.cost.memory_bytes
    assert "precision  bf16" in __import__("parallelizer.plan_io", fromlist=["plan_text"]).plan_text(again)
    explicit = plan(big_batch_mlp, DP8, memory_budget_bytes=10**9, precision="fp32")
    assert (explicit.config["precision"], explicit.config["memory_reserve_bytes"]) == ("fp32", 0)
    reserved = plan(big_batch_mlp, DP8, memory_reserve_bytes=5 * 10**9)
    assert reserved.cost.memory_bytes["reserve"] == 5 * 10**9


def test_reserve_shrinks_what_the_plan_may_hold(big_batch_mlp):
    """The planner fits the plan's step peak in budget - reserve (round 26: the peak, `planner.peak`, not the sum of
    kinds): a reserve that leaves less than the replicated (DDP) plan's peak forces another plan, and one that
    leaves nothing is a typed error."""
    ddp = plan(big_batch_mlp, DP8, memory_budget_bytes=10**10, memory_reserve_bytes=0)
    peak = ddp.cost.memory_bytes["peak"]
    tight = plan(big_batch_mlp, DP8, memory_budget_bytes=10**10, memory_reserve_bytes=10**10 - peak + 10**6)
    assert tight.cost.memory_bytes["peak"] <= peak - 10**6
    assert (tight.nodes, tight.recompute) != (ddp.nodes, ddp.recompute)  # sharded or recomputed
    with pytest.raises(InfeasiblePlanError, match="reserve"):
        plan(big_batch_mlp, DP8, memory_budget_bytes=10**9, memory_reserve_bytes=10**9)


def test_cpu_device_defaults_to_fp32_and_refuses_bf16(big_batch_mlp):
    import dataclasses

    import torch

    from cost_model.hardware import H100_SXM
    from cost_model.topology import Cluster, Link
    from parallelizer.errors import PrecisionError
    cpu = dataclasses.replace(H100_SXM, name="cpu", kind="cpu", peak_flops_per_s={torch.float32: 1e11})
    link = Link("gloo", 1e-5, 1e9)
    cluster = Cluster(cpu, num_nodes=1, devices_per_node=8, intra_node_link=link, inter_node_link=link)
    p = plan(big_batch_mlp, DP8, cluster=cluster)
    assert (p.config["precision"], p.config["memory_reserve_bytes"]) == ("fp32", 0)
    with pytest.raises(PrecisionError, match="no bf16 peak"):
        plan(big_batch_mlp, DP8, cluster=cluster, precision="bf16")


class _Float64Gram(torch.nn.Module):
    """An fp32 model with one float64 matmul (a Gram matrix computed in double)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x).double()
        return (h @ h.transpose(0, 1)).float().sum()


def test_an_op_in_a_dtype_the_device_does_not_price_is_a_precision_error_naming_it():
    """A float64 matmul on the default GPU preset (no float64 peak): a typed PrecisionError naming the node,
    its dtype and the remedy. Before, cost_model's plain ValueError escaped parallelizer.plan (round 9: DepthPro
    as float64, or any model with a double-precision matmul)."""
    import torch

    from parallelizer.errors import PrecisionError

    traced = parallelizer.trace(_Float64Gram(), (torch.randn(4, 8),))
    with pytest.raises(PrecisionError, match=r"node matmul \(aten\.matmul\.default\) computes in float64") as err:
        parallelizer.plan(traced, {"dp": 2})
    assert "Remedy" in str(err.value) and "float32" in str(err.value)
