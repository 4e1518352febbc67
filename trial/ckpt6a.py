"""trial6a: checkpoint.save on a pipeline plan (tied stack, pp=2 x dp=2 1f1b) -> load on dp=2 x tp=2 fsdp+tp ->
save -> load on pp=2 x tp=2 zbv -> full_state_dict; AdamW + LambdaLR + param groups, against one device
doing the same steps. Run: PYTHONPATH=$PWD python -m trial.ckpt6a"""
import contextlib, copy, io, shutil

import torch
import torch.distributed as dist

import parallelizer
from parallelizer import checkpoint
from trial.h6a import Stack, labels_of, ce, V, B, T

DIR = "/tmp/h6a/ckpt"


def groups(m):
    named = [(n, p) for n, p in m.named_parameters()]
    return [{"params": [p for n, p in named if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for n, p in named if p.dim() < 2], "weight_decay": 0.0, "lr": 3e-2}]


def fresh():
    torch.manual_seed(0)
    return Stack("attn", 4, tied=True)


def body(rank, world):
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, 5:] = False
    y = labels_of(ids)
    ref = fresh()
    ropt = torch.optim.AdamW(groups(ref), lr=1e-2, eps=1e-3)
    rs = torch.optim.lr_scheduler.LambdaLR(ropt, lambda s: 1 / (1 + s))
    meshes = [({"pp": 2, "dp": 2}, dict(schedule="1f1b", microbatches=4, axis_roles={"dp": "ddp"})),
              ({"dp": 2, "tp": 2}, dict(axis_roles={"dp": "fsdp", "tp": "tp"})),
              ({"pp": 2, "tp": 2}, dict(schedule="zbv", microbatches=4, axis_roles={"tp": "tp"}))]
    out = []
    for i, (mesh, opts) in enumerate(meshes):
        with contextlib.redirect_stdout(io.StringIO()):
            pm = parallelizer.auto_parallelize(fresh(), (ids, pad), mesh=mesh, **opts)
        opt = torch.optim.AdamW(groups(pm), lr=1e-2, eps=1e-3)
        sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
        if i:
            checkpoint.load(pm, opt, f"{DIR}/{i - 1}")
            sch.last_epoch = rs.last_epoch  # the scheduler's own state is the user's to keep
            for g, rg in zip(opt.param_groups, ropt.param_groups):
                g["lr"] = rg["lr"]
        for _ in range(2):
            loss = pm.step(ids, pad, target=y, loss_fn=ce)
            rl = ce(ref(ids, pad), y)
            rl.backward()
            opt.step(); ropt.step(); opt.zero_grad(); ropt.zero_grad(); sch.step(); rs.step()
            out.append((str(mesh), abs(loss.item() - rl.item())))
        full = pm.full_state_dict()
        sd = ref.state_dict()
        out.append((str(mesh) + " params", max((full[k] - sd[k]).abs().max().item() for k in sd)))
        if rank == 0:
            shutil.rmtree(f"{DIR}/{i}", ignore_errors=True)
        dist.barrier()
        checkpoint.save(pm, opt, f"{DIR}/{i}")
        dist.barrier()
    return out


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    for name, d in spawn(body, 4, timeout_s=600)[0]:
        print(f"{name}: {d:.2e}", "MISMATCH" if d > 1e-5 else "ok")
