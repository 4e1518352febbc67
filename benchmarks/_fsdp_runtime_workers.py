"""Rank body of `bench_runtime.run_fsdp`: our ZeRO-3 plan (`axis_roles={"dp": "fsdp"}`) against torch's FSDP2
(`torch.distributed.fsdp.fully_shard`) on the same model, on 2 gloo ranks, timed step by step."""
from __future__ import annotations

import copy
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F

from benchmarks._runtime_workers import LR, _measure, _median_ms, _train_step, planned_spec, setup_rank
from parallelizer.rewriter.spec import all_axis_groups
from parallelizer.runtime.launch import create_groups
from parallelizer.runtime.module import ParallelModule


def fsdp_bench_rank(rank: int, world_size: int, sizes: dict, warmup: int, iters: int, rounds: int) -> dict:
    """One rank. Ours: the planner's plan for {"dp": world_size} with the role "fsdp" (parameters stored
    sharded, all-gathered in forward, freed after forward and gathered again in backward, gradients
    reduce-scattered), fed the full batch (it slices its half itself). Torch: `fully_shard` on every Linear,
    then on the root (`reshard_after_forward=True`, the default), fed this rank's half of the batch. Both
    from the same seeded weights, MSE loss, AdamW (lr `LR`).

    Returns {"ours"|"torch": {"ms": [per-step ms], "median_ms", "loss1": the full batch's first-step loss},
    "ref_loss1": the single-device model's, "parameters": the model's count, "collectives": our program's
    (each all_gather's backward is a reduce-scatter; the backward re-gathers are not counted), "parts":
    {part: median ms of 5} for both sides' step pieces measured apart, "threads"}."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    pristine, x, y, ref_loss1, traced = setup_rank(sizes)

    spec = planned_spec(traced, {"dp": world_size}, {"dp": "fsdp"})
    create_groups(all_axis_groups(spec.mesh))
    ours = ParallelModule(traced, spec, rank, copy.deepcopy(pristine))

    fsdp = copy.deepcopy(pristine)
    mesh = init_device_mesh("cpu", (world_size,))
    for module in fsdp.modules():
        if isinstance(module, torch.nn.Linear):
            fully_shard(module, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    half = x.shape[0] // world_size
    xl, yl = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]

    opts = {"ours": torch.optim.AdamW(ours.parameters(), lr=LR), "torch": torch.optim.AdamW(fsdp.parameters(), lr=LR)}
    out = _measure({"ours": _train_step(ours, opts["ours"], x, y),
                    "torch": _train_step(fsdp, opts["torch"], xl, yl)}, warmup, iters, rounds)
    local = out["torch"]["loss1"]  # this rank's half-batch mean: average over ranks for the full batch's
    dist.all_reduce(local)
    out["torch"]["loss1"] = local / world_size
    for r in out.values():
        r["loss1"] = float(r["loss1"])
        r["median_ms"] = statistics.median(r["ms"])

    # Our step's pieces apart: forward alone, forward + backward, AdamW alone (gradients of the last step are
    # still there), on both sides' sharded parameters.
    def fwd_bwd(module: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor):
        return lambda: F.mse_loss(module(xs), ys).backward()

    with torch.no_grad():
        fwd = {"ours": _median_ms(lambda: ours(x)), "torch": _median_ms(lambda: fsdp(xl))}
    out["parts"] = {
        "forward_ours": fwd["ours"], "forward_torch": fwd["torch"],
        "fwd_bwd_ours": _median_ms(fwd_bwd(ours, x, y)), "fwd_bwd_torch": _median_ms(fwd_bwd(fsdp, xl, yl)),
        "adamw_ours": _median_ms(opts["ours"].step), "adamw_torch": _median_ms(opts["torch"].step),
    }
    out["ref_loss1"] = ref_loss1
    out["parameters"] = sum(p.numel() for p in pristine.parameters())
    out["collectives"] = dict(ours.program.collectives)
    out["threads"] = torch.get_num_threads()
    return out
