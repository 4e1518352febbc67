"""Rank body for test_zero1: torch's ZeroRedundancyOptimizer (ZeRO-1) on parallel modules of 4 gloo ranks
(importable by name)."""
from __future__ import annotations

import copy
import warnings

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

import parallelizer
from parallelizer import zoo
from parallelizer.errors import OptimizerError


def _mlp():
    torch.manual_seed(0)
    return zoo.mlp(batch=8, in_features=16, dim=32, hidden=64, out_features=4)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()


def zero1(rank: int, world_size: int, plans: dict) -> dict:
    """Per case (name -> plan): 3 AdamW steps against eager AdamW on the whole batch, with the optimizer the
    name's suffix says: "world": ZeroRedundancyOptimizer over the default (whole-world) group; "plain":
    torch.optim.AdamW; else ZeroRedundancyOptimizer over pm.process_group("dp"). Returns per case (max |diff| of
    the parameters after the steps, max |diff| of the losses, the optimizer's group size (1: none), the number
    of ZeRO-1 warnings) or ("refused", kind, parameters unchanged, message)."""
    out = {}
    for name, plan in plans.items():
        model, (x,) = _mlp()
        reference = copy.deepcopy(model)
        pm = parallelizer.auto_parallelize(model, (x,), plan=plan)
        if name.endswith("plain"):
            opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
        else:
            group = None if name.endswith("world") else pm.process_group("dp")
            opt = ZeroRedundancyOptimizer(pm.parameters(), optimizer_class=torch.optim.AdamW, process_group=group,
                                          lr=1e-2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = _train(pm, reference, opt, plan, x)
        if result[0] != "refused":
            result = (*result, sum("ZeRO-1" in str(w.message) for w in caught))
        out[name] = result
    return out


def _train(pm, reference, opt, plan, x) -> tuple:
    """3 steps of `opt` on pm and of AdamW on `reference`: (max |diff| of the parameters, of the losses, the
    optimizer's group size) or ("refused", kind, parameters unchanged, message)."""
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in pm.parameters()]
    losses = 0.0
    try:
        for _ in range(3):
            opt.zero_grad()
            ref_opt.zero_grad()
            if plan.pipeline is not None:
                loss = pm.step(x, loss_fn=lambda out, target: out.pow(2).mean())
            else:
                loss = pm(x).pow(2).mean()
                loss.backward()
            ref_loss = reference(x).pow(2).mean()
            ref_loss.backward()
            losses = max(losses, _diff(loss, ref_loss))
            opt.step()
            ref_opt.step()
    except OptimizerError as e:
        return ("refused", e.kind, all(torch.equal(a, b) for a, b in zip(before, pm.parameters())), str(e))
    full = pm.full_state_dict()
    params = max(_diff(full[f], p) for f, p in reference.state_dict().items())
    group = getattr(opt, "process_group", None)
    return params, losses, torch.distributed.get_world_size(group) if group is not None else 1


def zero1_resume(rank: int, world_size: int, plan, path: str) -> dict:
    """ZeroRedundancyOptimizer(AdamW) on `plan`: 2 steps; parallelizer.checkpoint.save with it (refused?); the
    model saved by parallelizer.checkpoint and the optimizer by torch's recipe per replica group
    (consolidate_state_dict(to=0), torch.save on the group's first rank, load_state_dict of that file on every
    rank of the group) into a new module and optimizer on the same plan; 2 more
    steps. Returns (checkpoint.save's error type and text, max |diff| of the parameters to eager AdamW's after 4
    steps)."""
    import os

    import torch.distributed as dist

    from parallelizer import checkpoint
    from parallelizer.errors import StateDictError

    model, (x,) = _mlp()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)

    def steps(pm, opt, n):
        for _ in range(n):
            opt.zero_grad()
            pm(x).pow(2).mean().backward()
            opt.step()

    def zero(pm):
        return ZeroRedundancyOptimizer(pm.parameters(), optimizer_class=torch.optim.AdamW,
                                       process_group=pm.process_group("dp"), lr=1e-2)

    pm = parallelizer.auto_parallelize(copy.deepcopy(model), (x,), plan=plan)
    opt = zero(pm)
    steps(pm, opt, 2)
    try:
        checkpoint.save(pm, opt, os.path.join(path, "refused"))
        refused = ("saved", "")
    except StateDictError as e:
        refused = (type(e).__name__, str(e))
    checkpoint.save(pm, None, os.path.join(path, "model"))
    opt.consolidate_state_dict(to=0)  # per replica group: its first rank holds the group's state (of its pieces)
    lead = dist.get_global_rank(pm.process_group("dp"), 0)
    if rank == lead:
        torch.save(opt.state_dict(), os.path.join(path, f"optimizer.{lead}.pt"))
    dist.barrier()
    resumed = parallelizer.auto_parallelize(copy.deepcopy(model), (x,), plan=plan)
    checkpoint.load(resumed, None, os.path.join(path, "model"))
    opt2 = zero(resumed)
    opt2.load_state_dict(torch.load(os.path.join(path, f"optimizer.{lead}.pt"), weights_only=False))
    steps(resumed, opt2, 2)
    steps(reference, ref_opt, 4)
    full = resumed.full_state_dict()
    return refused, max(_diff(full[f], p) for f, p in reference.state_dict().items())
