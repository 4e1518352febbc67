"""A deep stack of square linear layers whose activations and weight gradients are of one size per layer (batch =
width), for the step-peak budget test (`test_peak_budget_run`): backward frees layer k's activations after it makes
layer k's weight gradient, so the step never holds both whole and its peak is well under the sum of kinds."""
from __future__ import annotations

import torch


class DeepLinear(torch.nn.Module):
    """x (B, d) -> n_layers x (Linear(d, d, bias=False), ReLU) -> (y * t).sum(), t (B, d) a buffer."""

    def __init__(self, d: int, n_layers: int, batch: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d, bias=False) for _ in range(n_layers))
        self.register_buffer("t", torch.randn(batch, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return (x * self.t).sum()


def deep_linear(d: int = 64, n_layers: int = 8, batch: int = 64) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """(model, (x,)) seeded: the same weights and input on every rank and in the planner."""
    torch.manual_seed(0)
    return DeepLinear(d, n_layers, batch), (torch.randn(batch, d),)


class WideOutput(torch.nn.Module):
    """x (B, d_in) -> y = Linear(d_in, d_out, bias=False)(x); returns ((y * t).sum(), y), t (d_out,) a buffer: a model
    returning a batch-sharded value much larger than its weights (a language model's logits beside its loss), which
    a data-parallel program gathers whole at its output node (`rewriter.apply._output`)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d_in, d_out, bias=False)
        self.register_buffer("t", torch.randn(d_out))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.proj(x)
        return (y * self.t).sum(), y


def wide_output(d_in: int = 8, d_out: int = 256, batch: int = 64) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """(model, (x,)) seeded, as `deep_linear`."""
    torch.manual_seed(0)
    return WideOutput(d_in, d_out), (torch.randn(batch, d_in),)
