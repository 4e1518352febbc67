"""Saved-for-backward bytes priced per rank = bytes the emitted program holds on each gloo rank, op by op (round 24,
r24d; `planner.local_storage`, RESULTS.md "Round 24 (r24d)").

Class: a view op (reshape / flatten / contiguous / a reshape after chunk / matmul's fold) is a view or a copy by the
LOCAL shapes and strides of a rank's shard, and a redistributed input is a storage of its own; the price took storages
from the GLOBAL graph. One module per member (`local_storage_models`: one head per rank), the Llama family (GQA:
repeat_kv with one local KV head at tp=2; KV heads split below one per rank at tp=4) and the GPT-2 family at tp=2.
Each case: the plan's activations (`Plan.cost.memory_bytes`, `planner.local_storage.local_saved_bytes`) equal, per
node and in sum, what each rank's program keeps (`benchmarks.saved_by_node.rank_held_saved_bytes`: saved-tensor hooks,
each storage charged once, whole, to its first saver). For the members, the per-strategy price of the global storages
(`Pricer.node_cost`, the ILP's row, and the plan's figure before this round) differs from the held bytes, so each
case does reach its member. All the member and Llama cases failed before (plan activations = the global price).
Round 25 (r25d, `planner.memory_fit`): each case also asserts that the ILP's memory row at its pick (with the
corrections learnt from the replay) equals the plan's total, so row = replay = what each rank holds; a case on an fsdp x
tp 2x2 mesh (4 ranks), and one at a budget where main's pick held more than it (contiguous member, 4,164 B > 3,140 B).
"""
from __future__ import annotations

import contextlib
import functools
import io

import pytest

import parallelizer
from benchmarks.saved_by_node import rank_held_saved_bytes
from cost_model.topology import MeshTopology
from parallelizer.config import PlanConfig
from parallelizer.core.mesh import MeshSpec
from parallelizer.planner.api import build, resolve_cluster
from parallelizer.planner.costs import Pricer
from parallelizer.planner.ilp import memory_bytes
from parallelizer.planner.local_storage import local_saved_bytes, plan_choice
from parallelizer.planner.memory_fit import recompute_delta, solve_fitting
from parallelizer.planner.problem import layout_of
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.launch import spawn
from parallelizer.zoo import families

from local_storage_models import WHICH, member

pytestmark = pytest.mark.distributed

TP = {"tp": "tp"}
FSDP_TP = ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})
# case id: (builder, kwargs, mesh, axis roles, memory budget (None: the device's), the global price differs from held)
CASES = {
    **{f"member-{w}": (member, {"which": w}, {"tp": 2}, TP, None, True) for w in WHICH},
    "llama-tp2": (families.llama, {}, {"tp": 2}, TP, None, True),
    "gpt2-tp2": (families.gpt2, {}, {"tp": 2}, TP, None, False),
    "llama-tp4": (families.llama, {}, {"tp": 4}, TP, None, True),
    # round 25 (r25d): fsdp x tp on 2x2, and a budget the row alone broke (main's pick held 4,164 B > 3,140 B). The
    # Llama family on fsdp x tp is left out: there the replay itself differs from rank 0 (SDPA 8,448 vs 6,400 B per
    # layer, linear_6 4,096 vs 0, the loss 16,644 vs 16,648; RESULTS.md Round 25 (r25d), left)
    "member-chunk-fsdp_tp": (member, {"which": "chunk"}, *FSDP_TP, None, True),
    "member-contiguous-budget": (member, {"which": "contiguous"}, {"tp": 2}, TP, 3140, False),
}


def _config(roles, budget) -> PlanConfig:
    return PlanConfig(precision="fp32", recompute="none", axis_roles=roles, memory_budget_bytes=budget)


def _plan(fn, kwargs, mesh, roles, budget):
    traced = parallelizer.trace(*fn(**kwargs))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, mesh, config=_config(roles, budget))
    return traced, plan


def _priced(traced, plan) -> tuple[dict[str, int], int]:
    """({node: bytes priced on the rank's local storages}, the per-strategy price of the global storages)."""
    mesh = plan.mesh
    pricer = Pricer(MeshTopology(resolve_cluster(None, mesh.world_size)[0], mesh.shape, mesh.axis_names), mesh,
                    PlanConfig(precision="fp32"), traced)
    strategy_of, spaces = plan_choice(traced, plan.nodes, pricer.backward_nodes(traced))
    local = local_saved_bytes(traced, strategy_of, spaces, pricer)
    global_price = sum(pricer.node_cost(traced, traced.nodes[n], spaces[n], strategy_of[n]).saved_bytes
                       for n in spaces)
    return {n: b for n, b in local.items() if b}, global_price


def _ilp_row(traced, plan, mesh, roles, budget) -> int:
    """The memory row the solver fitted to the budget at its pick (with the corrections `memory_fit` learnt), after
    checking that the pick is the plan's."""
    config = _config(roles, budget)
    problem, pricer = build(traced, MeshSpec.of(mesh), config=config)
    with contextlib.redirect_stdout(io.StringIO()):
        fitted, sol, _, _ = solve_fitting(traced, problem, pricer, config)
    for name in fitted.spaces:
        s = layout_of(fitted, name, sol.choice)
        assert (tuple(str(L) for L in s.inputs), None if s.output is None else str(s.output)) == \
            (plan.nodes[name].inputs, plan.nodes[name].output), name
    return memory_bytes(fitted, sol.choice) + int(recompute_delta(fitted, sol))


@pytest.fixture(scope="module")
def runs():
    """{case: (plan, priced per node, global price, ILP row, [held per node of each rank])}: one launch per world
    size."""
    planned = {case: _plan(fn, kw, mesh, roles, budget) for case, (fn, kw, mesh, roles, budget, _) in CASES.items()}
    worlds = {case: MeshSpec.of(c[2]).world_size for case, c in CASES.items()}
    out = {}
    for world in sorted(set(worlds.values())):
        names = [c for c in CASES if worlds[c] == world]
        cases = [(CASES[c][0], CASES[c][1], spec_from_plan(planned[c][1])) for c in names]
        per_rank = spawn(rank_held_saved_bytes, world, cases, timeout_s=400)
        for i, case in enumerate(names):
            traced, plan = planned[case]
            row = _ilp_row(traced, plan, *CASES[case][2:5])
            out[case] = (plan, *_priced(traced, plan), row,
                         [{n: b for n, b in ranks[i].items() if b} for ranks in per_rank])
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_saved_bytes_priced_per_rank_as_the_rank_holds_them(runs, case):
    plan, priced, global_price, row, held = runs[case]
    for rank, on_rank in enumerate(held):
        assert priced == on_rank, (case, rank, {n: (priced.get(n), on_rank.get(n)) for n in set(priced) | set(on_rank)
                                                if priced.get(n) != on_rank.get(n)})
    assert plan.cost.memory_bytes["activations"] == sum(priced.values())
    assert (global_price != sum(priced.values())) == CASES[case][5], (case, global_price, sum(priced.values()))
    # round 25 (r25d): the ILP's memory row at its pick = the replayed plan = what each rank holds (above), in budget
    assert row == plan.cost.memory_bytes["total"], (case, row, plan.cost.memory_bytes)
    budget = CASES[case][4]
    assert budget is None or plan.cost.memory_bytes["total"] <= budget, (case, plan.cost.memory_bytes)
