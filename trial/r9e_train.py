"""Trial r9e: train one of three own models with pm.step under torchrun, compare with one device,
save a checkpoint; with --resume, load it on another mesh and continue.

torchrun --nproc-per-node 2 trial/r9e_train.py --kind ae --mesh dp=2 --steps 3 --save /tmp/r9e-ck-ae
torchrun --nproc-per-node 4 trial/r9e_train.py --kind ae --mesh tp=4 --steps 2 --resume /tmp/r9e-ck-ae
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import parallelizer  # noqa: E402
from parallelizer import checkpoint  # noqa: E402
from parallelizer.cli import parse_mesh  # noqa: E402
from trial.r9e_models import build  # noqa: E402


def ratio(a, b, atol=1e-5, rtol=1.3e-6):
    return float(((a - b).abs() / (atol + rtol * b.abs())).max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="ae")
    ap.add_argument("--mesh", default=None)
    ap.add_argument("--roles", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--save", default=None)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--plan-out", default=None)
    ap.add_argument("--plan-in", default=None)
    ap.add_argument("--opt", default="adamw")
    a = ap.parse_args()
    torch.manual_seed(0)
    model, args, target, loss_fn = build(a.kind, a.batch)
    ref = copy.deepcopy(model)
    mesh = parse_mesh(a.mesh) if a.mesh else None
    opts = {}
    if a.roles:
        opts["axis_roles"] = dict(kv.split("=") for kv in a.roles.split(","))
    pm = parallelizer.auto_parallelize(model, args, mesh=mesh, plan=a.plan_in, time_limit_s=30, **opts)
    rank = dist.get_rank()
    if rank == 0:
        print(pm.plan.summary(max_nodes=4), flush=True)
        if a.plan_out:
            pm.plan.save(a.plan_out)
    mk = (lambda ps: torch.optim.AdamW(ps, lr=1e-3)) if a.opt == "adamw" else (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    opt = mk(pm.parameters())
    ref_opt = mk([p for p in ref.parameters() if p.requires_grad])
    start = 0
    if a.resume:
        # the reference replays the steps the saved run did
        saved_steps = int(open(a.resume + ".steps").read())
        for _ in range(saved_steps):
            ref_opt.zero_grad(); loss_fn(ref(*args), target).backward(); ref_opt.step()
        checkpoint.load(pm, opt, a.resume)
        start = saved_steps
    worst = 0.0
    for step in range(start, start + a.steps):
        opt.zero_grad()
        loss = pm.step(*args, target=target, loss_fn=loss_fn)
        opt.step()
        ref_opt.zero_grad()
        rl = loss_fn(ref(*args), target)
        rl.backward()
        ref_opt.step()
        r = ratio(loss, rl.detach())
        worst = max(worst, r)
        if rank == 0:
            print(f"step {step}: loss {loss.item():.7f} ref {rl.item():.7f} ratio {r:.3g}", flush=True)
    full = pm.full_state_dict()
    pr = 0.0
    worst_key = None
    for k, v in ref.state_dict().items():
        if k not in full:
            print(f"rank {rank}: {k} missing from full_state_dict", flush=True); continue
        if v.is_floating_point():
            rk = ratio(full[k].float(), v.float())
            if rk > pr:
                pr, worst_key = rk, k
        elif not torch.equal(full[k], v):
            print(f"rank {rank}: {k} differs {full[k]} vs {v}", flush=True)
    if rank == 0:
        print(f"RESULT kind={a.kind} mesh={a.mesh} loss_ratio={worst:.3g} state_ratio={pr:.3g} ({worst_key})", flush=True)
    if a.save:
        checkpoint.save(pm, opt, a.save)
        if rank == 0:
            open(a.save + ".steps", "w").write(str(start + a.steps))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
