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


class ConvBatchNorm(nn.Module):
    """A 1x1 conv then a training BatchNorm2d (or an InstanceNorm2d tracking running statistics), pooled per
    sample and channel (the output of the model, so that the batch stays sharded through the norm; round 12)."""

    def __init__(self, norm: str = "batch"):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.bn = nn.BatchNorm2d(3) if norm == "batch" else nn.InstanceNorm2d(3, affine=True, track_running_stats=True)

    def forward(self, x):
        return self.bn(self.conv(x)).float().mean((2, 3))  # (N, C)


def conv_batch_norm(dtype: str = "float32", hw: int = 17, batch: int = 8, norm: str = "batch", shift: float = 2.0,
                    seed: int = 0):
    """A `ConvBatchNorm` cast whole to `dtype`, inputs around `shift` (a mean far from 0, a count of batch * hw^2)."""
    torch.manual_seed(seed)
    x = torch.randn(batch, 2, hw, hw, generator=torch.Generator().manual_seed(1)).add(shift)
    return ConvBatchNorm(norm).to(getattr(torch, dtype)), (x.to(getattr(torch, dtype)),)


def batch_norm_precision_rank(rank: int, world_size: int, spec, kwargs: dict) -> dict:
    """One training forward of `conv_batch_norm(**kwargs)` on this rank under `spec` (its recipe, if any) and on
    one device (under the same torch.autocast): the whole output and the running buffers of both."""
    import copy

    import torch.distributed as dist

    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.runtime import create_groups
    from parallelizer.runtime.module import ParallelModule
    from parallelizer.runtime.precision import autocast
    from parallelizer.tracer.trace import trace

    model, (x,) = conv_batch_norm(**kwargs)
    eager = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
    out = pm(x)
    with autocast(spec.autocast):
        ref = eager(x)
    return {"out": out.detach(), "ref": ref.detach(),
            "buffers": {k: v.clone() for k, v in pm.named_buffers() if v.is_floating_point()},
            "ref_buffers": {k: v.clone() for k, v in eager.named_buffers() if v.is_floating_point()}}
