"""Language-model presets are traced with labels (issue 13 item 5): the loss is the graph's first output and
the cross-entropy keeps the logits (B*T*V fp32) and the targets (B*T int64) for backward, as counted by the
memory model (`cost_model.memory`)."""

import pytest
import torch

from cost_model._fx import node_values
from cost_model.memory import saved_activation_bytes, saved_tensor_owners
from parallelizer import presets, trace

B, T, V = 2, 16, 128
SMALL = {
    "gpt": dict(n_layer=1, n_embd=32, n_head=2, vocab_size=V, block_size=T),
    "gpt2": dict(n_layer=1, n_embd=32, n_head=2, vocab_size=V),
    "llama": dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                  num_key_value_heads=2, vocab_size=V),
}


@pytest.mark.parametrize("model", sorted(SMALL))
def test_lm_preset_traces_its_loss_and_the_logits_are_saved(model):
    recipe = presets.recipe(model, SMALL[model], batch=B, seq_len=T)
    tg = trace(*presets.build(recipe, "meta"))
    out = [n for n in tg.graph_module.graph.nodes if n.op == "output"][0]
    loss = out.args[0][0]
    assert loss.meta["val"].shape == () and loss.meta["val"].is_floating_point()
    ce = [n for n in tg.graph_module.graph.nodes if "cross_entropy" in str(n.target) or "nll_loss" in str(n.target)]
    assert len(ce) == 1, [str(n.target) for n in ce]
    resident = [ph for p in tg.parameters.values() for ph in p.placeholders]
    share = saved_tensor_owners(tg.graph_module, resident).get(ce[0].name)
    kept = saved_activation_bytes(ce[0].target, *node_values(ce[0]), share=share)
    # fp32 logits + int64 targets (the gpt preset: T tokens of targets) + nll_loss's 0-d fp32 total_weight, which
    # autograd keeps for backward too (round 23, r23e: measured with saved-tensor hooks)
    assert kept == B * T * V * 4 + B * T * 8 + 4


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_lm_presets_return_the_loss_alone_unless_asked_for_all(model):
    """A CLI plan of a language-model preset is a training plan: the preset returns its loss alone, so the plan
    neither gathers nor holds the logits (round 14: the Llama-3-8B preset on dp=8 x tp=8 "needs >= 141.1 GB",
    134.5 GB of it the returned logits; round 16, r16e). `--config returns=all` plans transformers' whole output;
    the parameters and their names are the model's either way."""
    import contextlib
    import io

    import parallelizer
    plans = {}
    for returns in ("loss", "all"):
        config = SMALL[model] if returns == "loss" else {**SMALL[model], "returns": "all"}
        built = presets.build(presets.recipe(model, config, batch=B, seq_len=T), "meta")
        tg = trace(*built)
        assert list(tg.input_names) == ["input_ids", "labels"], tg.input_names  # the model's own input names
        out = tg.graph_module.graph.output_node().args[0]
        assert [tuple(a.meta["val"].shape) for a in out] == ([()] if returns == "loss" else [(), (B, T, V)])
        with contextlib.redirect_stdout(io.StringIO()):
            plans[returns] = parallelizer.plan(tg, {"dp": 2}, precision="fp32")
        plans[returns + "_keys"] = sorted(built[0].state_dict())
    assert plans["loss_keys"] == plans["all_keys"]
    assert plans["loss"].cost.memory_bytes["outputs"] == 4  # the fp32 loss
    assert plans["all"].cost.memory_bytes["outputs"] == 4 + B * T * V * 4  # and the logits, whole on every rank
    with pytest.raises(presets.ModelBuildError, match="returns=.logits.: use one of"):
        presets.build(presets.recipe(model, {**SMALL[model], "returns": "logits"}, batch=B, seq_len=T), "meta")
