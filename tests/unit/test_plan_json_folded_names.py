"""A plan JSON of a model whose two repeated-block groups fold to names one of which prefixes the other (round 15,
r15d): transformers' Llama 4 with `interleave_moe_layer_step=2` has the group "model.layers.*" (its dense layers
0, 2) and the group "model.layers.*.feed_forward" (the MoE feed-forwards of layers 1, 3). The codec unfolded
every "model.layers.*.feed_forward..." key under the first group, so the plan the planner had just written did
not load (PlanValidationError "ref '~router.weight' resolves to nothing in member model.layers.1.feed_forward"),
on tp=2 as on pp=2 x tp=2."""
import contextlib
import io

import pytest
import torch
import transformers

import parallelizer
from parallelizer.planner import Plan


def _llama4():
    torch.manual_seed(0)
    cfg = transformers.Llama4TextConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, intermediate_size_mlp=32, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, num_hidden_layers=4, num_local_experts=2, num_experts_per_tok=1,
        interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0], attention_chunk_size=4, use_cache=False)
    ids = torch.randint(0, 64, (2, 6))
    return transformers.Llama4ForCausalLM(cfg), (ids,), {"labels": ids}


@pytest.mark.parametrize("mesh", [{"tp": 2}, {"pp": 2, "tp": 2}])
def test_a_plan_of_groups_whose_names_fold_alike_loads_back(mesh):
    model, args, kwargs = _llama4()
    traced = parallelizer.trace(model, args, example_kwargs=kwargs)
    names = [b.name for b in traced.blocks]
    assert "model.layers.*" in names and "model.layers.*.feed_forward" in names, names
    options = dict(schedule="gpipe", microbatches=1) if "pp" in mesh else {}
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, mesh, axis_roles={"tp": "tp"}, **options)
    loaded = Plan.from_json(plan.to_json())
    assert loaded.params == plan.params
    assert {n: p.strategy for n, p in loaded.nodes.items()} == {n: p.strategy for n, p in plan.nodes.items()}
