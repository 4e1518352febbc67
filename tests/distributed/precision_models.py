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



def _skew(model: nn.Module) -> float:
    """1 in an exported program (every sharded program computes the exported function), 1 + `model.skew` in an
    eager call (the one-device reference): a deliberate error of `skew` relative in the sharded program, known in
    advance (the tracer warns that eager and exported differ)."""
    return 1.0 if torch.compiler.is_exporting() else 1.0 + model.skew


class HalfSideBranch(nn.Module):
    """An fp32 model whose main path (fc1 -> ReLU -> fc2, outputs `main`) never meets its float16 side branch
    (a gate `sigmoid(gate(x).half())`, as a quantiser or router would, outputs `side`), and whose loss (the
    first, scalar output) adds a float16 auxiliary term 0.01 * mean(side) to the float32 mean of squares of
    `main` (an MoE's load-balancing term computed in 16 bits). Judged per tensor (`runtime.reach`): `main`,
    fc1's and fc2's gradients at float32; the loss, `side` and the gate's gradient at float16."""

    def __init__(self, skew: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.fc2, self.gate = nn.Linear(16, 32), nn.Linear(32, 8), nn.Linear(16, 8)
        self.skew = skew

    def forward(self, x: torch.Tensor):
        main = self.fc2(torch.relu(self.fc1(x))) * _skew(self)  # (B, 8) float32
        side = torch.sigmoid(self.gate(x).half())  # (B, 8) float16
        loss = main.pow(2).mean() + 0.01 * side.float().mean()
        return loss, main, side.float()


def half_side_branch(seed: int = 0, skew: float = 0.0):
    torch.manual_seed(seed)
    return HalfSideBranch(skew).train(), (torch.randn(8, 16, generator=torch.Generator().manual_seed(seed + 1)),)


class HalfGate(nn.Module):
    """An fp32 MLP whose output is multiplied by a float16 gate of its input (`h * sigmoid(gate(x).half())`):
    the gate's rounding reaches the output and, through the product's backward, every gradient, so everything
    is judged at float16 (`runtime.reach`), as the whole-graph rule did."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.gate = nn.Linear(16, 32), nn.Linear(32, 8), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * torch.sigmoid(self.gate(x).half()).float()


def half_gate(seed: int = 0):
    torch.manual_seed(seed)
    return HalfGate().train(), (torch.randn(8, 16, generator=torch.Generator().manual_seed(seed + 1)),)


class CastRoundTrip(nn.Module):
    """r17a's pattern: a row-parallel matmul's result cast to float16 and back (`.half().float()`), then a
    bfloat16 round trip of the next layer's; every value and gradient after the casts carries their rounding,
    so the per-tensor bound is 16-bit for all of them and the float64 replay (`runtime.replay64`) judges the
    program (`rehearsal._rank_cases`)."""

    def __init__(self, skew: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 16), nn.Linear(16, 8)
        self.skew = skew

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (self.fc2(torch.relu(self.fc1(x))) * _skew(self)).half().float()  # (B, 16)
        return self.fc3(h).to(torch.bfloat16).to(torch.float32)  # (B, 8)


def cast_round_trip(seed: int = 0, skew: float = 0.0):
    torch.manual_seed(seed)
    return CastRoundTrip(skew).train(), (torch.randn(8, 16, generator=torch.Generator().manual_seed(seed + 1)),)


class CastBlock(nn.Module):
    """A residual MLP block whose update is cast to float16 and back (`.half().float()`, r17a's round trip) after
    a deliberate `skew` (`_skew`): what the cast reaches is judged at float16's bound."""

    def __init__(self, skew: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)
        self.skew = skew

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 16) -> (B, 16)
        return x + (self.fc2(torch.relu(self.fc1(x))) * _skew(self)).half().float()


class CastBlocks(nn.Module):
    """Four `CastBlock`s and a float32 head: a float32 model narrowing inside, cut into pipeline stages by its
    blocks (`runtime.pipeline_rehearsal.replay_pipeline` judges it by its float64 replay)."""

    def __init__(self, skew: float = 0.0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CastBlock(skew) for _ in range(4))
        self.head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 16) -> (B, 8)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def cast_blocks(seed: int = 0, skew: float = 0.0, batch: int = 8):
    torch.manual_seed(seed)
    return CastBlocks(skew).train(), (torch.randn(batch, 16, generator=torch.Generator().manual_seed(seed + 1)),)
