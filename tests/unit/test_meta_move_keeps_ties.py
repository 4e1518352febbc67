"""Remedies that move a model to `meta` keep tied weights tied (round 22, r22f).

`trace` refuses a model partly on meta (a legacy constructor such as `torch.Tensor(n, d)` ignores
`with torch.device("meta")`: XLNet, transformers' FastSpeech2-Conformer) and an example input on another device
than the model. Both remedies used to say `model.to('meta')` (or `to_empty(device='meta')`): torch makes one new
Parameter per owning module there, so an embedding tied to its head became two weights, the plan held both, and
it did not fit the model it was made for (PlanMismatchError). They now name `parallelizer.presets.to_meta(model)`,
which moves each tensor once; and the first says when the constructor is an installed package's, not the user's.
"""
import pytest
import torch
from torch import nn

import parallelizer
from parallelizer import TraceError, presets
from parallelizer.errors import PlanMismatchError


class TiedWithLegacyGain(nn.Module):
    """Embedding (32, 8) tied to the head, the shared weight made by a legacy constructor (it stays on CPU under
    `with torch.device("meta")`); `gain` (8,) follows the device context."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(32, 8), nn.Linear(8, 32, bias=False)
        self.emb.weight = self.head.weight = nn.Parameter(torch.Tensor(32, 8).normal_())
        self.gain = nn.Parameter(torch.ones(8))

    def forward(self, ids):  # ids (B, T) -> scalar loss
        return nn.functional.cross_entropy(self.head(self.emb(ids) * self.gain).flatten(0, 1), ids.flatten())


def _ids():
    return torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(0))


def _cpu_trace():
    torch.manual_seed(0)
    return parallelizer.trace(TiedWithLegacyGain(), (_ids(),))


def test_a_tied_model_partly_on_meta_names_the_tie_keeping_move_and_its_plan_fits_the_cpu_model():
    with torch.device("meta"):
        model = TiedWithLegacyGain()
    with pytest.raises(TraceError, match=r"partly on the meta device") as caught:
        parallelizer.trace(model, (_ids(),))
    assert "parallelizer.presets.to_meta(model)" in str(caught.value)
    assert "installed package" not in str(caught.value)  # the user's own module: no package named

    assert presets.to_meta(model) is model and model.head.weight is model.emb.weight
    plan = parallelizer.plan(parallelizer.trace(model, (_ids(),)), {"dp": 2})
    parallelizer.check_plan(plan, _cpu_trace(), {"dp": 2})  # raises if the plan does not fit the CPU model

    with torch.device("meta"):  # what the old remedy led to: two weights in the plan, one in the model
        untied = TiedWithLegacyGain()
    untied.to("meta")
    assert untied.head.weight is not untied.emb.weight
    with pytest.raises(PlanMismatchError):
        parallelizer.check_plan(parallelizer.plan(parallelizer.trace(untied, (_ids(),)), {"dp": 2}), _cpu_trace(),
                                {"dp": 2})


def test_an_input_on_meta_beside_a_cpu_tied_model_names_the_tie_keeping_move():
    torch.manual_seed(0)
    model = TiedWithLegacyGain()
    with pytest.raises(TraceError, match=r"another device than the model") as caught:
        parallelizer.trace(model, (_ids().to("meta"),))
    assert "parallelizer.presets.to_meta(model)" in str(caught.value)
    traced = parallelizer.trace(presets.to_meta(model), (_ids().to("meta"),))
    assert model.head.weight is model.emb.weight and set(traced.parameters) == set(_cpu_trace().parameters)
    untied = TiedWithLegacyGain().to("meta")  # the old remedy: the head's weight became a second parameter
    assert set(parallelizer.trace(untied, (_ids().to("meta"),)).parameters) != set(_cpu_trace().parameters)


def test_a_legacy_constructor_in_an_installed_package_is_named_as_the_packages():
    """transformers' FastSpeech2-Conformer makes `pos_bias_u` / `pos_bias_v` with `torch.Tensor(heads, dim)`: the
    message says the package's class made them (the user cannot change that constructor) before the move."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.FastSpeech2ConformerConfig(
        hidden_size=16, encoder_num_attention_heads=2, decoder_num_attention_heads=2, encoder_layers=1,
        decoder_layers=1, encoder_linear_units=16, decoder_linear_units=16, speech_decoder_postnet_layers=1,
        speech_decoder_postnet_units=8, duration_predictor_channels=8, energy_predictor_channels=8,
        pitch_predictor_channels=8, duration_predictor_layers=1, energy_predictor_layers=1, pitch_predictor_layers=1)
    with torch.device("meta"):
        model = transformers.FastSpeech2ConformerModel(cfg)
    with pytest.raises(TraceError, match=r"partly on the meta device") as caught:
        parallelizer.trace(model, (torch.randint(1, cfg.vocab_size, (2, 8)),))
    text = str(caught.value)
    assert "the installed package transformers (not your code: FastSpeech2ConformerAttention" \
        in text, text
    assert text.index("installed package transformers") < text.index("parallelizer.presets.to_meta(model)")
    presets.to_meta(model)
    assert {p.device.type for p in model.parameters()} == {"meta"}
