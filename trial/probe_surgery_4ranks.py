"""Probe on 4 ranks: surgery and shape-reading training code after auto_parallelize on {"pp":2,"dp":2} and
{"dp":2,"tp":2}, vs the same user code on one device (3 SGD steps through pm.step)."""
import contextlib, copy, io, sys, traceback
import torch
from torch import nn
import torch.distributed as dist
import parallelizer
from parallelizer import zoo
from parallelizer.runtime import spawn
import torch.nn.utils.prune as prune

SIZES = dict(batch=8, in_features=16, dim=32, hidden=64, out_features=4)


class MyLinear(nn.Linear):
    def forward(self, x):
        w = self.weight + (torch.round(self.weight * 8) / 8 - self.weight).detach()
        return nn.functional.linear(x, w, self.bias)


def swap(m):
    old = m.blocks[0].up
    new = MyLinear(old.in_features, old.out_features)
    new.weight, new.bias = old.weight, old.bias
    m.blocks[0].up = new


def qat(m):
    m.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
    torch.ao.quantization.prepare_qat(m, inplace=True)


def loss_fn(out, t):
    return (out - t).pow(2).mean()


def sgd_groups(m):  # muP-like: lr scaled by fan-in read from the shape; no decay for 1-d
    return [{"params": [p], "lr": 0.5 * 16 / p.shape[-1], "weight_decay": 0.1 if p.dim() > 1 else 0.0}
            for p in m.parameters()]


CASES = {
    "swap": (swap, None),
    "prepare_qat": (qat, None),
    "stage_swap": (lambda m: swap(m.stages[0] if hasattr(m, "stages") else m), None),
    "prune_l1": (lambda m: prune.l1_unstructured(m.blocks[0].up, "weight", amount=0.5), None),
    "head_identity": (lambda m: setattr(m, "head", nn.Identity()), None),
    "fanin_lr_groups": (lambda m: None, sgd_groups),
    "numel_lr": (lambda m: None, lambda m: [{"params": list(m.parameters()),
                                             "lr": 1e3 / sum(p.numel() for p in m.parameters())}]),
}


def one(name, mesh):
    surgery, groups = CASES[name]
    model, (x,) = zoo.mlp(**SIZES)
    t = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    ref = copy.deepcopy(model)
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (x,), mesh=mesh,
                                               **({"axis_roles": {"dp": "ddp", "tp": "tp"}} if "tp" in mesh else {}))
    try:
        surgery(ref)
    except Exception as e:
        return f"eager raises {type(e).__name__}"
    try:
        surgery(pm)
        opts = [torch.optim.SGD(groups(m) if groups else m.parameters(), lr=0.5) for m in (pm, ref)]
        for _ in range(3):
            pm.step(x, target=t, loss_fn=loss_fn)
            loss_fn(ref(x), t).backward()
            for o in opts:
                o.step(); o.zero_grad()
        sd = pm.full_state_dict() if hasattr(pm, "full_state_dict") else None
        if sd is None:
            return "no full_state_dict"
        d = max((sd[k] - v).abs().max().item() for k, v in ref.state_dict().items())
        return f"{type(pm).__name__} param diff {d:.3g}"
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return f"{type(e).__name__} @{tb.filename.split('/')[-1]}:{tb.lineno}: {str(e)[:200]}"


def body(rank, world, meshes, names):
    out = {}
    for mk, mesh in meshes.items():
        for n in names:
            out[(mk, n)] = one(n, mesh)
            dist.barrier()
    return out


if __name__ == "__main__":
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(CASES)
    meshes = {"pp2xdp2": {"pp": 2, "dp": 2}, "dp2xtp2": {"dp": 2, "tp": 2}}
    res = spawn(body, 4, meshes, names, timeout_s=900)
    for key in res[0]:
        others = {r: res[r][key] for r in range(1, 4) if res[r][key] != res[0][key]}
        print(key, "|", res[0][key], "|| others:", others or "same")
