"""A float32 model whose eager forward has no float64 kernel while its traced program has one (round 21, r21e).

transformers' MoE experts (`integrations.moe._grouped_mm`) call `torch.nn.functional.grouped_mm` eagerly on CPU,
which takes float32 / 16-bit matrices only ("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got
Double"), and `grouped_mm_fallback` (plain matmuls) while compiling or exporting (`is_torchdynamo_compiling`):
a float64 replay of DeepSeek-V4's pipeline plan ran the program and then raised in the eager reference, on every
rank. `EagerFloat32Only` has the same two paths: float64 raises eagerly, is a plain Linear under export.
"""
import torch
from torch import nn

from precision_models import CastBlock

KERNEL_ERROR = "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double"


class EagerFloat32Only(nn.Linear):
    """nn.Linear(16, 8) whose eager call raises for float64 inputs, as a float32-only kernel would; under
    torch.export / compile (`torch.compiler.is_compiling()`) it is the plain Linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 16) -> (B, 8)
        if x.dtype == torch.float64 and not torch.compiler.is_compiling():
            raise RuntimeError(KERNEL_ERROR)
        return super().forward(x)


class CastBlocksEagerHead(nn.Module):
    """Four `precision_models.CastBlock`s (float32 narrowing to float16 inside, so every rehearsal also replays
    the plan in float64) and an `EagerFloat32Only` head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CastBlock() for _ in range(4))
        self.head = EagerFloat32Only(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 16) -> (B, 8)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def cast_blocks_eager_head(seed: int = 0, batch: int = 8):
    torch.manual_seed(seed)
    return CastBlocksEagerHead().train(), (torch.randn(batch, 16, generator=torch.Generator().manual_seed(seed + 1)),)
