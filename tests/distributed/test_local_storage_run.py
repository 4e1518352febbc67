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
from parallelizer.planner.api import resolve_cluster
from parallelizer.planner.costs import Pricer
from parallelizer.planner.local_storage import local_saved_bytes, plan_choice
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.launch import spawn
from parallelizer.zoo import families

from local_storage_models import WHICH, member

pytestmark = pytest.mark.distributed

# case id: (builder, kwargs, tp, the global price differs from the held bytes)
CASES = {
    **{f"member-{w}": (member, {"which": w}, 2, True) for w in WHICH},
    "llama-tp2": (families.llama, {}, 2, True),
    "gpt2-tp2": (families.gpt2, {}, 2, False),
    "llama-tp4": (families.llama, {}, 4, True),
}


def _plan(fn, kwargs, tp):
    traced = parallelizer.trace(*fn(**kwargs))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"tp": tp}, axis_roles={"tp": "tp"}, precision="fp32", recompute="none")
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


@pytest.fixture(scope="module")
def runs():
    """{case: (plan, priced per node, global price, [held per node of each rank])}: one launch per world size."""
    planned = {case: _plan(fn, kw, tp) for case, (fn, kw, tp, _) in CASES.items()}
    out = {}
    for world in sorted({tp for *_, tp, _ in CASES.values()}):
        names = [c for c, (*_, tp, _) in CASES.items() if tp == world]
        cases = [(CASES[c][0], CASES[c][1], spec_from_plan(planned[c][1])) for c in names]
        per_rank = spawn(rank_held_saved_bytes, world, cases, timeout_s=400)
        for i, case in enumerate(names):
            traced, plan = planned[case]
            out[case] = (plan, *_priced(traced, plan), [{n: b for n, b in ranks[i].items() if b} for ranks in per_rank])
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_saved_bytes_priced_per_rank_as_the_rank_holds_them(runs, case):
    plan, priced, global_price, held = runs[case]
    for rank, on_rank in enumerate(held):
        assert priced == on_rank, (case, rank, {n: (priced.get(n), on_rank.get(n)) for n in set(priced) | set(on_rank)
                                                if priced.get(n) != on_rank.get(n)})
    assert plan.cost.memory_bytes["activations"] == sum(priced.values())
    assert (global_price != sum(priced.values())) == CASES[case][3], (case, global_price, sum(priced.values()))
