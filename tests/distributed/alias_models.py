"""Models whose forward reads a parameter through an op that returns the parameter itself or a view of it
without declaring it in its schema (`tracer.graph.UNDECLARED_ALIASES`); importable by spawned ranks.
Pattern of r18a's round of public reports (pytorch/pytorch#172790 kron / #172781 cross single-dim strategies
rebuilt beside einsum('ii->i'), torch.trace and diagonal of a weight)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AliasedWeights(nn.Module):
    """(5, 6, 16) -> Linear -> * (einsum('ii->i', W) + trace(W)) -> linear by einsum('ij->ji', V) and by
    V.type_as(h) / atleast_2d(V) -> Linear; every einsum / type_as / atleast_2d output is read after the op
    that reads the gathered weight directly for the last time."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.up, self.down = nn.Linear(16, 16), nn.Linear(16, 16)
        self.sq = nn.Parameter(torch.randn(16, 16) * 0.3)

    def forward(self, x):
        h = self.up(x)
        if self.which == "einsum_diag":
            d = torch.einsum("ii->i", self.sq)  # a diagonal view of the gathered weight
            return self.down(h * (d + torch.trace(self.sq)))
        if self.which == "einsum_transpose":
            s = self.sq.sum(0)  # the last direct reader of the weight comes first
            w = torch.einsum("ij->ji", self.sq)  # a transposed view
            return self.down(torch.tanh(h) @ w + s)
        if self.which == "type_as":
            m = self.sq.mean()
            w = self.sq.type_as(h)  # the weight itself (same dtype)
            return self.down(F.linear(h, w) + m)
        if self.which == "atleast_2d":
            n = self.sq.norm()
            w = torch.atleast_2d(self.sq)  # the weight itself
            return self.down(F.linear(h, w) * n)
        raise KeyError(self.which)


WHICH = ("einsum_diag", "einsum_transpose", "type_as", "atleast_2d")


def aliased_weights(which: str):
    torch.manual_seed(0)
    return AliasedWeights(which), (torch.randn(5, 6, 16, generator=torch.Generator().manual_seed(1)),)
