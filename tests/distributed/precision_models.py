"""bf16 models for test_precision (importable by name in spawned ranks)."""
from __future__ import annotations

import torch
from torch import nn

from parallelizer import zoo


def bf16_mlp(seed: int = 0):
    """The zoo MLP with parameters and inputs in bfloat16."""
    model, (x,) = zoo.mlp(batch=8, in_features=16, dim=32, hidden=64, out_features=4, seed=seed)
    return model.to(torch.bfloat16), (x.to(torch.bfloat16),)


class AutocastMLP(nn.Module):
    """fp32 parameters; Linear -> ReLU -> Linear inside torch.autocast("cpu", bfloat16); LayerNorm in fp32."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(16, 64), nn.Linear(64, 8), nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.down(torch.relu(self.up(x)))  # (B, 8) in bfloat16
        return self.norm(y.float())


def autocast_mlp(seed: int = 0):
    torch.manual_seed(seed)
    return AutocastMLP().train(), (torch.randn(8, 16, generator=torch.Generator().manual_seed(seed + 1)),)


class _LinearBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim, bias=False)  # a bias would be added in fp32 (the tracer splits it off)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class LinearStack(nn.Module):
    """fp32 blocks of bias-free Linear -> ReLU without a residual: under torch.autocast(bfloat16) every block's output,
    so every pipeline boundary value and its gradient, is bfloat16 (a GPT's residual sums are fp32)."""

    def __init__(self, dim: int = 32, blocks: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_LinearBlock(dim) for _ in range(blocks))
        self.head = nn.Linear(dim, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def linear_stack(batch: int = 8, dim: int = 32, blocks: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return LinearStack(dim, blocks).train(), (torch.randn(batch, dim, generator=torch.Generator().manual_seed(seed + 1)),)
