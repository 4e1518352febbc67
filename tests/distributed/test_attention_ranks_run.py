"""scaled_dot_product_attention on (B, L, E) and (B, G, H, L, E) (round 16, r16a). The rule offered a shard of
dim 1 at every rank: on a 3-D call that is L (and S for k, v), so a plan could attend over each rank's own keys,
21x off one device's outputs in the rule harness (tests/rules/ samples now cover 3-D, masked 3-D and 5-D
calls), silently. Now only the leading dims (all but L/S and E) shard; plans with random ILP costs, which reach
every option, train 3 AdamW steps as one device."""
import pytest
import torch

from parallelizer.core.layout import Shard
from parallelizer.planner.rules import linalg
from parallelizer.planner.rules.base import OpView
from parallelizer.runtime.rehearsal import rehearse_many
from attention_rank_models import attention_ranks
from plan_cases import random_cost_plan

pytestmark = pytest.mark.distributed
CASES = {"tp_seed0": ({"tp": 2}, 0), "tp_seed2": ({"tp": 2}, 2), "dp_seed5": ({"dp": 2}, 5),
         "2x2": ({"dp": 2, "tp": 2}, 6)}


def _view(*shapes):
    aten = torch.ops.aten
    out = shapes[0][:-1] + (shapes[2][-1],)
    return OpView(aten.scaled_dot_product_attention.default, (), {}, shapes, (out,), (torch.float32,) * len(shapes),
                  (torch.float32,))


@pytest.mark.parametrize("shapes", [((3, 5, 4), (3, 6, 4), (3, 6, 4)), ((3, 5, 4), (3, 6, 4), (3, 6, 4), (5, 6)),
                                    ((2, 3, 2, 5, 4),) * 3, ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 4))])
def test_attention_shards_only_its_leading_dims(shapes):
    nd = len(shapes[0])
    sharded = {o.output.dim for o in linalg.sdpa(_view(*shapes)) if isinstance(o.output, Shard)}
    assert sharded and all(d < nd - 2 for d in sharded), sharded


@pytest.fixture(scope="module")
def reports():
    plans = {name: random_cost_plan(attention_ranks, mesh, {}, seed) for name, (mesh, seed) in CASES.items()}
    by_world = {}
    for name, plan in plans.items():
        by_world.setdefault(plan.mesh.world_size, []).append(name)
    out = {}
    for names in by_world.values():
        for name, report in zip(names, rehearse_many([(attention_ranks, {}, plans[n]) for n in names], steps=3)):
            out[name] = (plans[name], report)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_at_other_ranks_trains_as_one_device(reports, name):
    plan, report = reports[name]
    assert report.matches(), report
