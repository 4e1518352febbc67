"""Rank body for test_gloo_dtypes: tensors of dtypes gloo's kernels lack, moved by a pipeline's full state dict
(importable by name)."""
from __future__ import annotations

import torch
from torch import nn

import parallelizer


class CodedStack(nn.Module):
    """Four Linear blocks whose input is shifted by buffers of dtypes gloo lacks (int16, uint16, float8), read in
    forward (so the first stage holds them): quantisation codes and scales as a quantised model keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.tensor([3, -2], dtype=torch.int16))
        self.register_buffer("codes", torch.tensor([7, 65000], dtype=torch.uint16))
        self.register_buffer("scale", torch.tensor([0.5, 2.0]).to(torch.float8_e4m3fn))
        self.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(4))

    def forward(self, x):
        x = x + self.shift.float() + self.codes.float() * 1e-5 + self.scale.float()
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


def coded_stack(batch: int = 4):
    torch.manual_seed(0)
    return CodedStack(), (torch.randn(batch, 2),)


def full_state_of_a_pipeline(rank: int, world_size: int, plan) -> dict:
    """`pm.full_state_dict()` of a pp=2 plan of `coded_stack` on every rank: {fqn: (dtype, equal to the model's
    tensor bitwise)} for the buffers, or ("error", text)."""
    model, (x,) = coded_stack(batch=8)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    pm = parallelizer.auto_parallelize(model, (x,), plan=plan)
    try:
        full = pm.full_state_dict()
    except Exception as e:  # noqa: BLE001 - the test reports what happened on each rank
        return {"error": f"{type(e).__name__}: {e}"}
    return {k: (str(full[k].dtype), torch.equal(full[k].view(torch.uint8), expected[k].view(torch.uint8)))
            for k in ("shift", "codes", "scale")}
