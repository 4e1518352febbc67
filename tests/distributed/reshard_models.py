"""Models whose FSDP-gathered weights are read in backward in several ways, for `test_reshard_after_backward_run.py`
(importable by name in spawned ranks): a weight read by two ops of one block, a layer norm applied twice, an
embedding tied to the output head (read by the lookup and by the head's matmul), and an embedding feeding two
weight-heavy linear layers (the memory case)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TwiceUsedBlock(nn.Module):
    """x (B, T, d) -> x + ln(fc(tanh(fc(ln(x))))): `fc` and `ln` each read twice in one block."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.ln(x))
        return x + self.ln(self.fc(torch.tanh(h)))


class TiedTwiceUsedLM(nn.Module):
    """ids (B, T) -> wte (V, d) -> `n` TwiceUsedBlocks -> logits = h @ wte.T (tied) -> cross-entropy with labels."""

    def __init__(self, vocab: int, d: int, n: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(TwiceUsedBlock(d) for _ in range(n))

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.wte(ids)
        for block in self.blocks:
            h = block(h)
        logits = F.linear(h, self.wte.weight)  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def tied_twice_used_lm(batch: int = 8, seq_len: int = 8, vocab: int = 64, d: int = 32, n: int = 2):
    """(TiedTwiceUsedLM seeded, (ids (batch, seq_len),), {"labels": (batch, seq_len)})."""
    torch.manual_seed(0)
    model = TiedTwiceUsedLM(vocab, d, n)
    ids = torch.randint(0, vocab, (batch, seq_len))
    return model, (ids,), {"labels": torch.randint(0, vocab, (batch, seq_len))}


class EmbeddedTwoLinear(nn.Module):
    """ids (B,) -> embedding (V, d) -> l1 (d x d) -> l2 (d x d) -> y; returns ((y * t).sum(), y), t (B, d) a buffer;
    no biases. The embedding's output requires grad, so each linear keeps its weight for its input's gradient; a
    caller holding y holds the autograd graph through backward (as one holding a model's logits)."""

    def __init__(self, batch: int, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.l1 = nn.Linear(d, d, bias=False)
        self.l2 = nn.Linear(d, d, bias=False)
        self.register_buffer("t", torch.randn(batch, d))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.l2(self.l1(self.emb(ids)))
        return (y * self.t).sum(), y  # the loss and the output, as a model returning its logits beside its loss


def embedded_two_linear(batch: int = 4, vocab: int = 8, d: int = 256):
    """(EmbeddedTwoLinear seeded, (ids (batch,),))."""
    torch.manual_seed(0)
    return EmbeddedTwoLinear(batch, vocab, d), (torch.randint(0, vocab, (batch,)),)
