"""A model whose gradients come in two dtypes (its first parameter bf16, the others float32) and the rank body of
tests/distributed/test_mixed_dtype_clipping.py (importable by spawned ranks). Found by trial r15a (round 15,
public reports on optimizer-side numerics): the global gradient norm took the FIRST gradient's dtype, where
torch's `get_total_norm` promotes over all of them (bf16 and float32 -> float32)."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import parallelizer


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.lin(h))


class BfloatGate(nn.Module):
    """(B, 8) -> cross-entropy over 5 classes: a bf16 gate (2 values, registered first) scales a float32 input
    Linear, then 4 residual blocks (a pp=2 pipeline puts the gate on stage 0 only) and a float32 head."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.tensor([0.7, -0.3], dtype=torch.bfloat16))
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Residual() for _ in range(4)])
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) * self.gate.float().sum()
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h), y)


def bfloat_gate(batch: int = 8):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return BfloatGate(), (torch.randn(batch, 8, generator=g) * 3, torch.randint(0, 5, (batch,), generator=g))


def clipped_sgd(rank: int, world_size: int, mesh: dict, options: dict) -> dict:
    """3 SGD steps (lr 0.5), gradients clipped by torch's `clip_grad_norm_(..., 0.1)`, on `auto_parallelize(model,
    mesh=mesh, **options)` and on the eager model: the totals each returned (value, dtype) per step and the
    largest difference of the full parameters after the steps."""
    model, inputs = bfloat_gate()
    reference = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, inputs, mesh=mesh, grad_bucket_bytes=0, **options)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (pm, reference)]
    norms = []
    for _ in range(3):
        if "pp" in mesh:
            pm.step(*inputs)
        else:
            pm(*inputs).backward()
        reference(*inputs).backward()
        totals = [torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1) for m in (pm, reference)]
        norms.append([(t.item(), str(t.dtype)) for t in totals])
        for opt in opts:
            opt.step()
            opt.zero_grad()
    full, eager = pm.full_state_dict(), reference.state_dict()
    return {"norms": norms, "params": max((full[k].double() - eager[k].double()).abs().max().item() for k in eager)}
