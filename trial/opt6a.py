"""trial6a: whole-tensor optimizers (Adafactor, Muon, LBFGS) on pipeline and mixed meshes, and a trainable
module in front of the parallel model (floating input that requires grad). Run: python -m trial.opt6a"""
import contextlib, copy, io, traceback

import torch
import torch.distributed as dist

import parallelizer
from trial.h6a import Stack, labels_of, ce, V, B, T, D

CASES = [("adafactor", {"pp": 2, "dp": 2}, dict(schedule="1f1b", microbatches=4, axis_roles={"dp": "ddp"})),
         ("adafactor", {"pp": 2, "tp": 2}, dict(schedule="zbv", microbatches=4, axis_roles={"tp": "tp"})),
         ("muon", {"pp": 2, "tp": 2}, dict(schedule="1f1b", microbatches=4, axis_roles={"tp": "tp"})),
         ("lbfgs", {"pp": 2, "dp": 2}, dict(schedule="gpipe", microbatches=4, axis_roles={"dp": "ddp"})),
         ("lbfgs", {"pp": 4}, dict(schedule="1f1b", microbatches=4)),
         ("adafactor", {"dp": 2, "tp": 2}, dict(axis_roles={"dp": "ddp", "tp": "tp"})),
         ("front", {"dp": 2, "tp": 2}, dict(axis_roles={"dp": "fsdp", "tp": "tp"})),
         ("front", {"pp": 2, "dp": 2}, dict(schedule="1f1b", microbatches=4, axis_roles={"dp": "ddp"}))]


class Body(torch.nn.Module):  # float input (B, T, D): blocks + head
    def __init__(self):
        super().__init__()
        s = Stack("mlp", 4)
        self.blocks, self.norm, self.head = s.blocks, s.norm, s.head

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def make_opt(kind, params):
    if kind == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2)
    if kind == "muon":
        return torch.optim.Muon([p for p in params if p.dim() == 2], lr=1e-2)
    if kind == "lbfgs":
        return torch.optim.LBFGS(params, lr=0.1)
    return torch.optim.SGD(params, lr=0.1)


def one(rank, kind, mesh, opts):
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    y = labels_of(ids)
    torch.manual_seed(0)
    if kind == "front":
        front = torch.nn.Embedding(V, D)
        body = Body()
        rfront, rbody = copy.deepcopy(front), copy.deepcopy(body)
        with contextlib.redirect_stdout(io.StringIO()):
            pm = parallelizer.auto_parallelize(body, (front(ids).detach(),), mesh=mesh, **opts)
        x = front(ids)
        loss = pm.step(x, target=y, loss_fn=ce)
        rl = ce(rbody(rfront(ids)), y)
        rl.backward()
        return f"loss diff {abs(loss.item() - rl.item()):.2e}, front grad diff {(front.weight.grad - rfront.weight.grad).abs().max().item():.2e}"
    model = Stack("mlp", 4)
    ref = copy.deepcopy(model)
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, **opts)
    opt, ropt = make_opt(kind, list(pm.parameters())), make_opt(kind, list(ref.parameters()))
    before = {k: v.clone() for k, v in pm.state_dict().items()}
    for _ in range(2):
        pm.step(ids, target=y, loss_fn=ce)
        ce(ref(ids), y).backward()
        if kind == "lbfgs":
            opt.step(lambda: torch.zeros(()))
        else:
            opt.step()
        ropt.step(lambda: torch.zeros(())) if kind == "lbfgs" else ropt.step()
        opt.zero_grad(); ropt.zero_grad()
    full, sd = pm.full_state_dict(), ref.state_dict()
    return f"stepped; params diff {max((full[k] - sd[k]).abs().max().item() for k in sd):.2e}"


def body(rank, world):
    out = []
    for kind, mesh, opts in CASES:
        try:
            out.append(one(rank, kind, mesh, opts))
        except Exception as e:  # noqa
            out.append(f"{type(e).__name__}: {str(e)[:300]}")
        dist.barrier()
    return out


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    res = spawn(body, 4, timeout_s=600)
    for i, (kind, mesh, _) in enumerate(CASES):
        print(kind, mesh, "->", {r[i] for r in res})
