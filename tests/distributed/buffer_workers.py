"""Models whose forward updates buffers, and the rank body of test_pipeline_buffers (importable by name)."""
from __future__ import annotations

import contextlib
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F

from parallelizer.runtime.pipeline_rehearsal import _rank_main

VOCAB, WIDTH = 64, 16


class EmaBlock(nn.Module):
    """A residual MLP whose forward updates an EMA of its input (fed into its output when `feed`) and a counter
    under no_grad, as BatchNorm's running statistics or a user's statistics are."""

    def __init__(self, d: int, feed: bool) -> None:
        super().__init__()
        self.fc, self.feed = nn.Linear(d, d), feed
        self.register_buffer("ema", torch.zeros(d))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.ema.mul_(0.9).add_(0.1 * x.detach().mean((0, 1)))
            self.count.add_(1)
        out = x + torch.tanh(self.fc(x))
        return out + self.ema if self.feed else out


class EmaModel(nn.Module):
    """Embedding (B, T) -> (B, T, d), 4 EmaBlocks, head -> cross-entropy over (B * T) tokens."""

    def __init__(self, feed: bool, shared: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([EmaBlock(WIDTH, feed) for _ in range(4)])
        self.head = nn.Linear(WIDTH, VOCAB)
        self.shared = shared  # the last block's EMA also read after the first block (a buffer of two stages)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if self.shared and i == 0:
                x = x + self.blocks[3].ema  # read (stage 0) before block 3 updates it (the last stage)
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def ema_model(batch: int = 8, seq_len: int = 8, feed: bool = True, shared: bool = False):
    """Seeded builder: (model, (ids (batch, seq_len), labels (batch, seq_len)))."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, seq_len), generator=g)
    return EmaModel(feed, shared), (ids, torch.randint(0, VOCAB, (batch, seq_len), generator=g))


def rank_cases(rank: int, world_size: int, cases: list, steps: int) -> list[dict]:
    """`pipeline_rehearsal._rank_main` per (model_kwargs, spec, pipeline dict, guarded) case in one launch;
    guarded=False switches BitPipe's refusal of forward-mutated buffers off (to show what it prevents)."""
    out = []
    for model_kwargs, spec, pipe, guarded in cases:
        off = mock.patch("parallelizer.runtime.bitpipe.buffer_copies_reason", return_value=None)
        with contextlib.nullcontext() if guarded else off:
            out.append(_rank_main(rank, world_size, ema_model, model_kwargs, spec, pipe, steps, 1e-3, 1e-3))
    return out


class ShadowBlock(nn.Module):
    """A block that writes a frozen shadow Linear in forward as an EMA of its own trained weight (a per-block
    momentum teacher) and adds the shadow's output: a PARAMETER updated in forward and then read by `mm`,
    which saves it for the backward of the block's input."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc, self.shadow = nn.Linear(d, d), nn.Linear(d, d)
        self.shadow.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.shadow.weight.mul_(0.9).add_(self.fc.weight.detach() * 0.1)
        return x + torch.tanh(self.fc(x)) + 0.1 * self.shadow(x)


class ShadowModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ShadowBlock() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def shadow_model(batch: int = 8):
    torch.manual_seed(0)
    return ShadowModel(), (torch.randn(batch, 16, generator=torch.Generator().manual_seed(1)),)


def rank_shadow(rank: int, world_size: int, cases: list, steps: int) -> list[dict]:
    """`pipeline_rehearsal._rank_main` of `shadow_model` per (model_kwargs, spec, pipeline dict) case."""
    return [_rank_main(rank, world_size, shadow_model, kw, spec, pipe, steps, 1e-3, 1e-3) for kw, spec, pipe in cases]
