"""Rank body of `bench_runtime.run_pipeline`: our pipeline plan (`auto_parallelize` + `pm.step`) against the
same two stages written by hand with torch.distributed.pipelining, on 2 gloo ranks, timed step by step."""
from __future__ import annotations

import contextlib
import copy
import io

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining

import parallelizer
from benchmarks._runtime_workers import LR, _measure
from parallelizer import zoo


def _torch_stage(model: nn.Module, rank: int, depth: int) -> nn.Module:
    """Stage `rank` of 2 written by hand: proj + the first half of the blocks, or the second half + head."""
    half = depth // 2
    blocks = list(copy.deepcopy(model.blocks))
    if rank == 0:
        return nn.Sequential(copy.deepcopy(model.proj), *blocks[:half])
    return nn.Sequential(*blocks[half:], copy.deepcopy(model.head))


def pipeline_bench_rank(rank: int, world_size: int, sizes: dict, microbatches: int, warmup: int, iters: int,
                        rounds: int) -> dict:
    """Returns {"ours"|"torch": {"ms": [...], "median_ms", "loss1"}, "threads", "stages": our blocks per stage}.
    Both run Schedule1F1B over `microbatches` microbatches of the same global batch with an MSE loss and AdamW;
    torch with its defaults (`scale_grads=True`: the microbatch losses summed, gradients divided by m), ours
    with each microbatch loss weighted by its share of the batch (the same mean)."""
    torch.set_num_threads(1)
    model, (x,) = zoo.mlp(**sizes)
    y = torch.randn(x.shape[0], model.head.out_features, generator=torch.Generator().manual_seed(1))
    stage_module = _torch_stage(model, rank, sizes["depth"])
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        pm = parallelizer.auto_parallelize(model, (x,), mesh={"pp": world_size, "dp": 1}, microbatches=microbatches)
    micro = x.shape[0] // microbatches
    stage = pipelining.PipelineStage(stage_module, rank, world_size, torch.device("cpu"),
                                     input_args=(torch.empty(micro, x.shape[1] if rank == 0 else sizes["dim"]),))
    schedule = pipelining.Schedule1F1B(stage, microbatches, loss_fn=F.mse_loss)
    ours_opt = torch.optim.AdamW(pm.parameters(), lr=LR)
    torch_opt = torch.optim.AdamW(stage_module.parameters(), lr=LR)

    def ours() -> torch.Tensor:
        ours_opt.zero_grad(set_to_none=True)
        loss = pm.step(x, target=y, loss_fn=F.mse_loss)
        ours_opt.step()
        return loss

    def by_hand() -> torch.Tensor:
        torch_opt.zero_grad(set_to_none=True)
        losses: list = []
        schedule.step(*((x,) if rank == 0 else ()), target=y if rank == world_size - 1 else None, losses=losses)
        torch_opt.step()
        return torch.stack(losses).mean() if losses else torch.zeros(())

    out = _measure({"ours": ours, "torch": by_hand}, warmup, iters, rounds)
    for r in out.values():
        r["median_ms"] = sorted(r["ms"])[len(r["ms"]) // 2]
        r["loss1"] = float(r["loss1"])
    out["threads"] = torch.get_num_threads()
    out["stages"] = pm.plan.pipeline.blocks_per_stage
    dist.barrier()
    return out
