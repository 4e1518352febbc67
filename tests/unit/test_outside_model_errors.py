"""Errors and detection met by models from outside the zoo: stateless repeated modules (Dropout) are not
blocks, one shared-weight block called N times (ALBERT) on a pipeline mesh, a forced gradient codec on a plan
without gradient sync, and a failed launch naming each rank's exception."""
import pytest
import torch

import parallelizer
from parallelizer.errors import PipelineError
from parallelizer.planner.compression import compression_line
from parallelizer.runtime.launch import _failure_message
from parallelizer.tracer.trace import trace


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Stack(torch.nn.Module):
    """Two stacks (as T5's encoder and decoder), each with its own dropout around its layers."""

    def __init__(self) -> None:
        super().__init__()
        self.enc_drop, self.dec_drop = torch.nn.Dropout(0.1), torch.nn.Dropout(0.1)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(4))

    def forward(self, x):  # each dropout applied twice, as T5Stack's (after the embedding and at the end)
        for drop, layers in ((self.enc_drop, self.layers[:2]), (self.dec_drop, self.layers[2:])):
            x = drop(x)
            for layer in layers:
                x = layer(x)
            x = drop(x)
        return x.sum()


class Albert(torch.nn.Module):
    """One layer (`Layer()` by default) called `calls` times with shared weights."""

    def __init__(self, layer: torch.nn.Module | None = None, calls: int = 3) -> None:
        super().__init__()
        self.shared, self.calls = layer if layer is not None else Layer(), calls

    def forward(self, x):
        for _ in range(self.calls):
            x = self.shared(x)
        return x.pow(2).mean()


def test_dropout_modules_are_not_a_block_group():
    traced = trace(Stack().train(), (torch.randn(2, 8),))
    assert [b.name for b in traced.blocks] == ["layers.*"]


def test_shared_weight_block_on_pp_names_the_block_and_calls():
    traced = trace(Albert(), (torch.randn(4, 8),))
    with pytest.raises(PipelineError, match=r"one block \(shared\.fc\) called 3 times with shared weights.*Remedy: a "
                                            r"mesh without 'pp'"):
        parallelizer.plan(traced, {"pp": 2})


class TwoLinearLayer(torch.nn.Module):
    """ALBERT's shared layer has several sibling Linears (query, key, value, dense) and two LayerNorms."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.n1, self.n2 = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.n2(x + self.k(self.n1(torch.relu(self.q(x)))))


def test_sibling_modules_of_a_shared_layer_called_in_turn_are_not_blocks():
    """The shared layer's q and k (and n1, n2) are each called 4 times, alternately: their calls interleave,
    so they are no run of blocks to cut a pipeline at. Before, they were taken for a group of 2 blocks and a
    pp=2 plan failed with a raw KeyError inside `runtime.pipeline.stage_graph` (transformers' ALBERT did)."""
    traced = trace(Albert(TwoLinearLayer(), calls=4), (torch.randn(4, 8),))
    assert not traced.blocks, traced.blocks
    with pytest.raises(PipelineError, match=r"called 4 times with shared weights"):
        parallelizer.plan(traced, {"pp": 2})


def test_forced_codec_without_gradient_sync_says_there_is_nothing_to_compress():
    line = compression_line({"option": "bf16", "chosen": "none", "step_s": 1e-3})
    assert "this plan has none" in line and "no codec beats" not in line
    assert "no codec beats" in compression_line({"option": "auto", "chosen": "none", "step_s": 1e-3})


def test_failed_launch_names_each_ranks_exception():
    text = _failure_message(print, 2, 10.0, {0: "Traceback (most recent call last):\n  File x\nRuntimeError: input "
                                                "tensor has to be contiguous\n",
                                             1: "Traceback:\n  File y\nRuntimeError: Connection closed by peer\n"}, False)
    assert text.splitlines()[0].endswith("failed on rank 0: RuntimeError: input tensor has to be contiguous "
                                         "(ranks with failures: [0, 1])")
    assert "  rank 1: RuntimeError: Connection closed by peer" in text


def test_layers_that_differ_but_share_a_repeated_part_on_pp_say_which_layers_differ():
    """Llama 4 with a layer without rotary embeddings (no_rope_layers) among rope layers: only the layers'
    feed_forward parts repeat, the decoder layers themselves differ. The PipelineError named only an
    encoder-decoder such as T5 as the cause; it now names the layers that differ and this kind of cause
    (found trying Llama 4 and DeepSeek-V3 with a dense first layer on pp=2 x dp=2)."""
    import transformers as tf
    cfg = tf.Llama4TextConfig(hidden_size=32, intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=64,
                              num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=1,
                              no_rope_layers=[1, 0], moe_layers=[0, 1], attention_chunk_size=4)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    traced = trace(tf.Llama4ForCausalLM(cfg), (ids,), {"labels": ids})
    with pytest.raises(PipelineError, match=r"(?s)only the model\.layers\.\*\.\w+ parts repeat, and no run of the "
                                            r"numbered layers model\.layers\.\* holds every member of the first "
                                            r"repeated group.*Remedy: a mesh without 'pp'"):
        parallelizer.plan(traced, {"pp": 2, "dp": 1}, global_batch=4)
