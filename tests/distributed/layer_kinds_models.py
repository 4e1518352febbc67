"""Models whose layers are not all identical (round 15, r15d), importable by spawned ranks. Each builder takes the
GLOBAL batch and returns (model, args); seeded, so every rank builds the same weights.

- `HybridLM`: a ModuleList whose layers alternate two kinds (a token mixer, then a two-linear feed-forward), as
  x-transformers' attention / feed-forward entries, Jamba / Bamba's Mamba and attention layers, or Qwen3-MoE's
  dense and MoE layers (`decoder_sparse_step=2`): a period-2 group, cut between any two layers.
- `DiTLike`: identical blocks, but the head calls the first block's conditioning embedding again (diffusers'
  DiT / PixArt head uses `transformer_blocks[0].norm1.emb`): that submodule's weights are read by the first and
  the last stage, held by both as a tied weight.
- `PixArtLike`: identical blocks after a caption projection of two Linear(d, d) (diffusers' PixArt
  `caption_projection` / Wan's `time_embedder` at small widths): the two Linears are a repeated group of their own,
  ahead of the blocks, and the pipeline cuts between the blocks (round 17, r17b).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH = 64, 16


class Mixer(nn.Module):
    """A token mixer: causal cumulative mean over the sequence of a projection (a linear-attention stand-in)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.inp, self.out = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x):  # (B, T, d)
        h = torch.tanh(self.inp(self.norm(x)))
        steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]
        return x + self.out(h.cumsum(1) / steps)


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(3 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class HybridLM(nn.Module):
    """Embedding -> `kinds` layers (m: Mixer, f: FeedForward) -> norm -> head -> mean cross-entropy."""

    def __init__(self, kinds: str = "mfmf") -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Mixer() if k == "m" else FeedForward() for k in kinds)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids, labels):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), labels.flatten())


def _ids(batch: int, seq_len: int):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (batch, seq_len), generator=g)
    labels = ids.clone()
    labels[::3, : seq_len // 2] = -100
    return ids, labels


def hybrid_lm(batch: int = 8, seq_len: int = 6, kinds: str = "mfmf"):
    """(HybridLM(kinds), (ids (batch, seq_len), labels with -100 in every third row's first half))."""
    torch.manual_seed(0)
    return HybridLM(kinds), _ids(batch, seq_len)


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, 2 * WIDTH)

    def forward(self, c):
        return self.lin(F.silu(c))


class _AdaNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = _Embed()

    def forward(self, x, c):  # x (B, T, d), c (B, d)
        shift, scale = self.emb(c).chunk(2, -1)
        return F.layer_norm(x, (WIDTH,)) * (1 + scale[:, None]) + shift[:, None]


class _DiTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = _AdaNorm()
        self.ff = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x, c):
        return x + self.ff(self.norm1(x, c))


class DiTLike(nn.Module):
    """Patches (B, T, 8) and a time (B, 1) -> 4 blocks conditioned on the time -> a head conditioned by the
    first block's embedding -> MSE against a target."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.proj_in, self.t_emb = nn.Linear(8, WIDTH), nn.Linear(1, WIDTH)
        self.transformer_blocks = nn.ModuleList(_DiTBlock() for _ in range(depth))
        self.proj_out = nn.Linear(WIDTH, 8)

    def forward(self, x, t, target):
        c = self.t_emb(t)
        h = self.proj_in(x)
        for block in self.transformer_blocks:
            h = block(h, c)
        shift, scale = self.transformer_blocks[0].norm1.emb(c).chunk(2, -1)
        h = F.layer_norm(h, (WIDTH,)) * (1 + scale[:, None]) + shift[:, None]
        return F.mse_loss(self.proj_out(h), target)


def dit_like(batch: int = 8, seq_len: int = 6):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    return DiTLike(), (torch.randn(batch, seq_len, 8, generator=g), torch.rand(batch, 1, generator=g),
                       torch.randn(batch, seq_len, 8, generator=g))


class _CaptionProjection(nn.Module):
    """diffusers' PixArtAlphaTextProjection: linear_1, GELU(tanh), linear_2, here of equal shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, c):
        return self.linear_2(F.gelu(self.linear_1(c), approximate="tanh"))


class _CrossBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.q, self.kv = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 2 * WIDTH)
        self.ff = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x, cap):  # x (B, T, d), cap (B, L, d): cross-attention to the caption, then a feed-forward
        k, v = self.kv(cap).chunk(2, -1)
        x = x + F.scaled_dot_product_attention(self.q(self.norm(x)), k, v)
        return x + self.ff(x)


class PixArtLike(nn.Module):
    """Patches (B, T, 8) and caption features (B, L, d) -> caption projection -> 4 blocks attending to the caption
    -> MSE against a target."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.proj_in = nn.Linear(8, WIDTH)
        self.caption_projection = _CaptionProjection()
        self.transformer_blocks = nn.ModuleList(_CrossBlock() for _ in range(depth))
        self.proj_out = nn.Linear(WIDTH, 8)

    def forward(self, x, caption, target):
        cap = self.caption_projection(caption)
        h = self.proj_in(x)
        for block in self.transformer_blocks:
            h = block(h, cap)
        return F.mse_loss(self.proj_out(h), target)


def pixart_like(batch: int = 8, seq_len: int = 6, caption_len: int = 3):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    return PixArtLike(), (torch.randn(batch, seq_len, 8, generator=g),
                          torch.randn(batch, caption_len, WIDTH, generator=g),
                          torch.randn(batch, seq_len, 8, generator=g))
