"""An assert or a branch on a tensor value inside an installed package's code (transformers' modeling files) gets
a remedy the user can apply: the package, function and line, and how to keep the check out of the traced run,
instead of "remove the assert" / "branch with torch.where" in code under site-packages (round 19, r19d: the
DEFAULT configs of ProphetNet, `assert torch.all(shifted_input_ids >= 0).item()` in `_shift_right`, and LED,
`if is_global_attn:` on `.any().item()`, were refused with remedies that edit transformers). Each remedy is
applied and the model then traces, its program's loss equal to the unchanged model's on one device."""
import sys
import textwrap
import types

import pytest
import torch

import parallelizer
from parallelizer.errors import TraceError

transformers = pytest.importorskip("transformers")

_LIB = '''\
import torch


class Seq2Seq(torch.nn.Module):
    """labels shifted in forward when no decoder_input_ids are given, with an assert on the values (ProphetNet)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.out = torch.nn.Linear(8, 16)

    def _shift_right(self, labels):
        shifted = labels.new_zeros(labels.shape)
        shifted[:, 1:] = labels[:, :-1]
        assert torch.all(shifted >= 0).item(), "negative ids"
        return shifted

    def forward(self, labels, decoder_input_ids=None):
        if decoder_input_ids is None:
            decoder_input_ids = self._shift_right(labels)
        logits = self.out(self.emb(decoder_input_ids))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


class Windowed(torch.nn.Module):
    """a branch on whether any position is global (LED / Longformer's `is_global_attn`)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def mix(self, h, mask):
        is_global = (mask > 1).flatten().any().item()
        if is_global:
            h = h + h.mean(1, keepdim=True)
        return h

    def forward(self, x, mask):
        return self.mix(self.fc(x), mask).square().mean()


class Dropping(torch.nn.Module):
    """LayerDrop as Wav2Vec2's encoder writes it (its DEFAULT config has layerdrop=0.1)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.layerdrop = 0.1

    def forward(self, x):
        skip_the_layer = False
        if self.training and self.layerdrop > 0.0:
            dropout_probability = torch.rand([])
            skip_the_layer = dropout_probability < self.layerdrop
        if not skip_the_layer:
            x = self.fc(x)
        return x.square().mean()


class Resized(torch.nn.Module):
    """a position table interpolated per sample to sizes summed from a mask (ViLT's `visual_embed`)."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(1, 4, 3, 3))

    def embed(self, mask):
        x_h, x_w = mask.sum(dim=1)[:, 0], mask.sum(dim=2)[:, 0]
        return torch.cat([torch.nn.functional.interpolate(self.pos, size=(h, w), mode="bilinear",
                                                          align_corners=True) for h, w in zip(x_h, x_w)])

    def forward(self, x, mask):
        return (x + self.embed(mask)).square().mean()
'''


@pytest.fixture
def fakelib(tmp_path, monkeypatch):
    """`fakelib.models` under a site-packages folder, as pip installs transformers."""
    root = tmp_path / "site-packages" / "fakelib"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "models.py").write_text(textwrap.dedent(_LIB))
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    yield __import__("fakelib.models", fromlist=["Seq2Seq"])
    for name in [m for m in sys.modules if m.startswith("fakelib")]:
        del sys.modules[name]


def test_an_assert_in_an_installed_label_shift_names_it_and_the_decoder_input_ids_that_skip_it(fakelib):
    torch.manual_seed(0)
    model = fakelib.Seq2Seq()
    labels = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(1))
    with pytest.raises(TraceError) as caught:
        parallelizer.trace(model, (labels,))
    text = str(caught.value)
    assert "installed package fakelib (not your code), in _shift_right() at models.py:15" in text
    assert "decoder_input_ids=model._shift_right(labels)" in text
    eager = model(labels)  # the right value: the unchanged model on one device
    traced = parallelizer.trace(model, (labels,), {"decoder_input_ids": model._shift_right(labels)})
    got = traced.exported.module()(labels, decoder_input_ids=model._shift_right(labels))
    torch.testing.assert_close(got, eager)


def test_a_branch_in_an_installed_method_names_it_and_the_method_replacement_traces(fakelib):
    torch.manual_seed(0)
    model = fakelib.Windowed()
    x, mask = torch.randn(2, 5, 8), torch.ones(2, 5)  # no global position: the branch is not taken
    with pytest.raises(TraceError) as caught:
        parallelizer.trace(model, (x, mask))
    text = str(caught.value)
    assert "installed package fakelib (not your code), in mix() at models.py:" in text
    assert "`if is_global:`" in text and "types.MethodType(fixed, module)" in text
    eager = model(x, mask)
    model.mix = types.MethodType(lambda self, h, m: h, model)  # the remedy: the branch taken from a known value
    got = parallelizer.trace(model, (x, mask)).exported.module()(x, mask)
    torch.testing.assert_close(got, eager)


def test_layerdrop_in_an_installed_package_keeps_its_config_switch_as_the_remedy(fakelib):
    """Wav2Vec2's DEFAULT config (layerdrop 0.1): the switch is the remedy, not replacing forward."""
    model = fakelib.Dropping()
    with pytest.raises(TraceError) as caught:
        parallelizer.trace(model, (torch.randn(2, 8),))
    text = str(caught.value)
    assert "config.layerdrop=0.0" in text and "types.MethodType" not in text
    model.layerdrop = 0.0  # the remedy applied: traces, and equals the model on one device
    x = torch.randn(2, 8)
    torch.testing.assert_close(parallelizer.trace(model, (x,)).exported.module()(x), model(x))


def test_own_code_keeps_the_plain_assert_remedy():
    class Own(torch.nn.Module):
        def forward(self, x):
            assert torch.all(x > -100).item(), "too small"
            return x.sum()

    with pytest.raises(TraceError) as caught:
        parallelizer.trace(Own(), (torch.randn(3, 4),))
    assert "installed package" not in str(caught.value)
    assert "remove the assert" in str(caught.value)


def _prophetnet():
    """transformers' ProphetNet with its DEFAULT structure (ngram 2, relative buckets) at width 16."""
    torch.manual_seed(0)
    cfg = transformers.ProphetNetConfig(vocab_size=64, hidden_size=16, encoder_ffn_dim=32, decoder_ffn_dim=32,
                                        num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=2,
                                        num_decoder_attention_heads=2, dropout=0.0, attention_dropout=0.0,
                                        activation_dropout=0.0)
    model = transformers.ProphetNetForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(1)
    return model, torch.randint(3, 64, (2, 8), generator=g), torch.randint(3, 64, (2, 5), generator=g)


def test_prophetnet_names_its_label_shift_and_traces_with_decoder_input_ids():
    model, ids, labels = _prophetnet()
    with pytest.raises(TraceError) as caught:
        parallelizer.trace(model, (), {"input_ids": ids, "labels": labels})
    text = str(caught.value)
    assert "installed package transformers (not your code), in _shift_right() at modeling_prophetnet.py:" in text
    assert "decoder_input_ids=model._shift_right(labels)" in text
    eager = model(input_ids=ids, labels=labels).loss
    kwargs = {"input_ids": ids, "labels": labels, "decoder_input_ids": model._shift_right(labels)}
    traced = parallelizer.trace(model, (), kwargs)
    got = traced.exported.module()(**kwargs)
    torch.testing.assert_close(got.loss if hasattr(got, "loss") else got[0], eager)


def test_a_size_read_by_torch_from_an_installed_method_names_that_method_and_its_replacement_traces(fakelib):
    """Round 20 (r20h): ViLT's DEFAULT config interpolates its position table to sizes summed from pixel_mask in
    `visual_embed`; torch's F.interpolate reads them as ints. The remedy was "change the module's configuration
    (e.g. BatchNorm's momentum=None ...)" of a line called "your line" (transformers'). Now: the package, method
    and line, and the method replacement, which traces to the eager value (all-ones mask: full sizes)."""
    torch.manual_seed(0)
    model = fakelib.Resized()
    x, mask = torch.randn(2, 4, 5, 6), torch.ones(2, 5, 6, dtype=torch.long)
    with pytest.raises(TraceError) as caught:
        parallelizer.trace(model, (x, mask))
    text = str(caught.value)
    assert "called from an installed package: the call is in the installed package fakelib (not your code), in " \
           "embed() at models.py:" in text, text
    assert "types.MethodType(fixed, module)" in text and "BatchNorm" not in text
    eager = model(x, mask)

    def fixed(self, mask):  # the sizes from the mask's shape (Python ints): every position valid
        B, H, W = mask.shape
        pos = torch.nn.functional.interpolate(self.pos, size=(H, W), mode="bilinear", align_corners=True)
        return pos.expand(B, -1, -1, -1)

    model.embed = types.MethodType(fixed, model)
    got = parallelizer.trace(model, (x, mask)).exported.module()(x, mask)
    torch.testing.assert_close(got, eager)
