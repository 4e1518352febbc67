"""Rank bodies for test_narrow_pipeline_sums: a float16 / bfloat16 model (`model.half()`, no autocast) pipelined,
its gradient sums over microbatches, dp replicas, tied copies and BitPipe's twin copies against one device."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from parallelizer.core.mesh import MeshSpec
from parallelizer.rewriter.baselines import batch_parallel_spec
from parallelizer.runtime.pipeline import build, cut_stages
from parallelizer.tracer.trace import trace

MICROBATCHES = 4
BIG = {torch.float16: 2048.0, torch.bfloat16: 256.0}
"""A value whose sum with 1 rounds back to it in the dtype (float16's spacing at 2048 is 2, bfloat16's at 256 is 2)."""
STAGES = {"gpipe": 2, "1f1b": 2, "interleaved_1f1b": 4, "zbv": 4, "dualpipev": 4, "bitpipe": 4}
"""Stages a pp=2 plan of each schedule cuts (`runtime.pipeline.build`)."""


class Scale(nn.Module):
    """x -> x * w, w a learned scalar: its gradient is the sum over rows of x times the gradient reaching it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1) -> (B, 1)
        return x * self.w


class Scales(nn.Module):
    """Four Scale blocks; `tied`: the last block's scalar is the first one's (as a tied embedding, two stages
    hold a copy)."""

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Scale() for _ in range(4)])
        if tied:
            self.blocks[3].w = self.blocks[0].w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def mean_loss(output, target=None) -> torch.Tensor:
    """The mean of the last stage's output (`target` unused; the schedules pass one)."""
    return (output[0] if isinstance(output, tuple) else output).mean()


def cancelling_batch(dtype: torch.dtype, dp: int) -> torch.Tensor:
    """(MICROBATCHES x dp, 1) rows, microbatch-major: replica 0's microbatches hold m dp (BIG, 1, 1, -BIG), the
    other replicas 0. Every scalar's weighted gradient of microbatch j is then BIG, 1, 1, -BIG on replica 0
    (the mean over the batch weighs each row 1 / (m dp)): exact in `dtype`, their sum 2 exact in float32, while
    the running sum in `dtype` rounds BIG + 1 back to BIG and ends at 0. The batch loss is the same sum."""
    per = (BIG[dtype], 1.0, 1.0, -BIG[dtype])
    rows = [per[j] * MICROBATCHES * dp if d == 0 else 0.0 for j in range(MICROBATCHES) for d in range(dp)]
    return torch.tensor(rows, dtype=dtype).reshape(-1, 1)


def pipelined_sums(rank: int, world_size: int, cases: list[tuple[str, str, bool]]) -> list[dict]:
    """Per (dtype, schedule, tied) case on pp=2 x dp=world_size/2 (DDP replicas): one step's gradients and batch
    loss on this rank, beside one device's (eager `dtype` model on the whole batch) and the float64 value."""
    dp = world_size // 2
    out = []
    for dtype_name, schedule, tied in cases:
        dtype = getattr(torch, dtype_name)
        x = cancelling_batch(dtype, dp)
        model = Scales(tied).to(dtype)
        eager, exact = copy.deepcopy(model), copy.deepcopy(model).double()
        traced = trace(model, (x[:dp],))
        spec = batch_parallel_spec(traced, MeshSpec(("dp",), (dp,)))
        run = build(traced, spec, cut_stages(traced, STAGES[schedule]), model, pp=2, schedule=schedule,
                    microbatches=MICROBATCHES, loss_fn=mean_loss)
        loss = run.step(x, target=torch.zeros(x.shape[0], dtype=dtype))
        eager_loss = mean_loss(eager(x))
        eager_loss.backward()
        exact_loss = mean_loss(exact(x.double()))
        exact_loss.backward()
        want = dict(eager.named_parameters(remove_duplicate=False))
        wide = dict(exact.named_parameters(remove_duplicate=False))
        grads = {name: (p.grad, want[name].grad, wide[name].grad)
                 for stage in run.stages for name, p in stage.named_parameters()}
        out.append({"case": (dtype_name, schedule, tied), "grads": grads,
                    "loss": None if loss is None else (loss, eager_loss.detach(), exact_loss.detach())})
        dist.barrier()
    return out
