"""nn.TransformerEncoder / TransformerDecoder / nn.Transformer given a mask without `is_causal=` (pytorch/examples'
word_language_model `TransformerModel`, nn.Transformer's own docs): torch's causal-mask detection reads the mask's
values as a Python bool, so every such model was refused with a TraceError (round 16, trial r16b; the same export
failure: pytorch/pytorch#134616). Traced with the mask applied as given; values and gradients equal eager's."""
import math

import pytest
import torch
from torch import nn

import parallelizer


class WordLM(nn.Module):
    """word_language_model/model.py's TransformerModel, sequence-first: encoder(src, mask=log(tril(ones)))."""

    def __init__(self, ntoken=20, ninp=16):
        super().__init__()
        layer = nn.TransformerEncoderLayer(ninp, 2, 32, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.emb, self.decoder, self.ninp = nn.Embedding(ntoken, ninp), nn.Linear(ninp, ntoken), ninp

    def forward(self, src):
        mask = torch.log(torch.tril(torch.ones(len(src), len(src), device=src.device)))
        out = self.encoder(self.emb(src) * math.sqrt(self.ninp), mask=mask)
        return torch.log_softmax(self.decoder(out), dim=-1)


class Seq2Seq(nn.Module):
    """nn.Transformer with a causal target mask and a non-causal (banded) source mask, no is_causal hints."""

    def __init__(self):
        super().__init__()
        self.net = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True)

    def forward(self, src, tgt):
        t, s = tgt.shape[1], src.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t)
        band = torch.zeros(s, s).masked_fill((torch.arange(s)[:, None] - torch.arange(s)).abs() > 2, float("-inf"))
        return self.net(src, tgt, src_mask=band, tgt_mask=causal).square().mean()


def _check(model, args):
    traced = parallelizer.trace(model, args)
    assert any("without is_causal=" in n for n in traced.notes), traced.notes
    program = traced.exported.module()
    got, expected = program(*args), model(*args)
    torch.testing.assert_close(got, expected)
    g_model = torch.autograd.grad(expected.sum(), list(model.parameters()))
    mirrored = dict(program.named_parameters())
    g_prog = torch.autograd.grad(program(*args).sum(), [mirrored[n] for n, _ in model.named_parameters()])
    for a, b in zip(g_prog, g_model):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", ["encoder_sequence_first", "transformer_banded_source"])
def test_a_mask_without_is_causal_traces_with_eager_values_and_gradients(case):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if case == "encoder_sequence_first":
        _check(WordLM(), (torch.randint(0, 20, (7, 3), generator=g),))
    else:
        _check(Seq2Seq(), (torch.randn(2, 6, 16, generator=g), torch.randn(2, 5, 16, generator=g)))


def test_a_given_hint_is_used_as_it_is_and_not_noted():
    torch.manual_seed(0)

    class Hinted(WordLM):
        def forward(self, src):
            mask = nn.Transformer.generate_square_subsequent_mask(len(src))
            return self.encoder(self.emb(src), mask=mask, is_causal=True).sum()

    traced = parallelizer.trace(Hinted(), (torch.randint(0, 20, (5, 2)),))
    assert not any("without is_causal=" in n for n in traced.notes), traced.notes
    from torch.nn.modules import transformer
    assert transformer._detect_is_causal_mask.__name__ == "_detect_is_causal_mask"  # put back after tracing
