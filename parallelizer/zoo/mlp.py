"""A small multi-layer perceptron with identical residual feed-forward blocks."""
from __future__ import annotations

import torch
from torch import nn


class FeedForward(nn.Module):
    """x + W2 gelu(W1 x): (B, dim) -> (B, dim); W1 is (hidden, dim), W2 is (dim, hidden)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class MLP(nn.Module):
    """(B, in_features) -> (B, out_features): input projection, `depth` FeedForward blocks, output head."""

    def __init__(self, in_features: int = 32, dim: int = 64, hidden: int = 256, depth: int = 2,
                 out_features: int = 10) -> None:
        super().__init__()
        if min(in_features, dim, hidden, depth, out_features) < 1:
            raise ValueError(f"MLP sizes must be >= 1, got in_features={in_features}, dim={dim}, "
                             f"hidden={hidden}, depth={depth}, out_features={out_features}")
        self.proj = nn.Linear(in_features, dim)
        self.blocks = nn.ModuleList(FeedForward(dim, hidden) for _ in range(depth))
        self.head = nn.Linear(dim, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)  # (B, dim)
        for block in self.blocks:
            h = block(h)
        return self.head(h)  # (B, out_features)


def mlp(batch: int = 8, device: str | torch.device = "cpu", seed: int = 0, **sizes) -> tuple[nn.Module, tuple]:
    """An `MLP(**sizes)` with seeded random weights and an example input of shape (batch, in_features)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = MLP(**sizes)
        x = torch.randn(batch, model.proj.in_features)
    return model, (x,)
