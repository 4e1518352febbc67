"""nn.TransformerEncoder's nested-tensor fast path (eval, key padding mask, no_grad: 0 at padded positions) is a
path only eager calls take; `pm.eval()`'s program returned the layers' values there, 3.1 apart from the model's
own eval output, silently (round 23, r23f). Now noted and warned with remedies, and the masked remedy agrees."""
import warnings

import pytest
import torch
import torch.nn as nn

import parallelizer
from parallelizer.tracer.fast_path import NOTE


class _Encoder(nn.Module):
    def __init__(self, norm_first: bool = False, masked: bool = False):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.masked = masked

    def forward(self, ids, pad):  # ids (B, T), pad (B, T) True at padding
        h = self.enc(self.emb(ids), src_key_padding_mask=pad)  # (B, T, 8)
        return h.masked_fill(pad.unsqueeze(-1), 0.0) if self.masked else h


def _inputs():
    ids = torch.randint(0, 20, (3, 6), generator=torch.Generator().manual_seed(0))
    pad = torch.arange(6)[None, :] >= torch.tensor([6, 3, 4])[:, None]
    return ids, pad


def _eval_outputs(masked: bool):
    torch.manual_seed(0)
    model = _Encoder(masked=masked)
    ids, pad = _inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = parallelizer.auto_parallelize(model, (ids, pad))
        pm.eval()
        with torch.no_grad():
            out = pm(ids, pad)
    model.eval()
    with torch.no_grad():
        expected = model(ids, pad)
    return out, expected, pad, [str(w.message) for w in caught if "enable_nested_tensor" in str(w.message)]


def test_the_eval_program_of_an_encoder_with_a_padding_mask_is_warned_where_it_differs_from_the_fast_path():
    out, expected, pad, warned = _eval_outputs(masked=False)
    assert expected[pad].abs().max() == 0  # torch's fast path: 0 at padded positions
    torch.testing.assert_close(out[~pad], expected[~pad])  # kept positions agree
    assert out[pad].abs().max() > 0.1  # the program's one path: the layers' values (hence the warning)
    assert warned and "enc" in warned[0] and "masked_fill" in warned[0]


def test_the_masked_remedy_makes_the_eval_program_equal_to_the_models_own_output():
    out, expected, _, _ = _eval_outputs(masked=True)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("case", ["training", "norm_first", "no_padding_mask"])
def test_calls_the_fast_path_cannot_take_are_not_noted(case):
    torch.manual_seed(0)
    model = _Encoder(norm_first=case == "norm_first")
    ids, pad = _inputs()
    if case != "training":
        model.eval()
    args = (ids, torch.zeros_like(pad)) if case == "no_padding_mask" else (ids, pad)
    if case == "no_padding_mask":
        model.forward = lambda ids, pad: model.enc(model.emb(ids))
    traced = parallelizer.trace(model, args)
    assert not any(NOTE.split("{")[0] in n for n in traced.notes)


class _Seq2Seq(nn.Module):
    def __init__(self, memory_mask: bool):
        super().__init__()
        self.t = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)
        self.memory_mask = memory_mask

    def forward(self, src, tgt, pad):  # (B, S, 8), (B, T, 8), (B, S)
        return self.t(src, tgt, src_key_padding_mask=pad, memory_key_padding_mask=pad if self.memory_mask else None)


@pytest.mark.parametrize("memory_mask", [False, True])
def test_nn_transformers_decoder_reads_the_padded_memory_unless_it_is_masked(memory_mask):
    """Without memory_key_padding_mask every decoder output reads the padded memory (0.26 apart from the model's
    own eval output under no_grad): warned, naming the remedy that is then shown to agree."""
    torch.manual_seed(0)
    model = _Seq2Seq(memory_mask).eval()
    src, tgt = torch.randn(3, 6, 8), torch.randn(3, 4, 8)
    pad = torch.arange(6)[None, :] >= torch.tensor([6, 3, 4])[:, None]
    with torch.no_grad():
        expected = model(src, tgt, pad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = parallelizer.auto_parallelize(model, (src, tgt, pad))
        with torch.no_grad():
            out = pm(src, tgt, pad)
    warned = [str(w.message) for w in caught if "enable_nested_tensor" in str(w.message)]
    assert warned and "t.encoder" in warned[0] and "memory_key_padding_mask=pad" in warned[0]
    if memory_mask:
        torch.testing.assert_close(out, expected)
    else:
        assert (out - expected).abs().max() > 0.05
