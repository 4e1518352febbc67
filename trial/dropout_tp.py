"""Dropout on a tp-replicated activation (after a row-parallel linear's all-reduce) on tp=2: the mask must agree on
both tp ranks (docs: masks agree on replicas), and the output must equal eager's computed with that mask.
Run: python trial/dropout_tp.py"""
import contextlib, io, warnings
warnings.filterwarnings("ignore")
import torch
import torch.nn.functional as F
from torch import nn
import parallelizer
from parallelizer.rewriter.spec import all_axis_groups, spec_from_plan
from parallelizer.runtime import create_groups
from parallelizer.runtime.launch import spawn
from parallelizer.runtime.module import ParallelModule
import torch.distributed as dist


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(16, 64), nn.Linear(64, 16), nn.Linear(16, 64), nn.Linear(64, 16)
        self.drop1, self.drop2 = nn.Dropout(0.5), nn.Dropout(0.5)

    def forward(self, x):
        h = self.b(F.gelu(self.a(x)))          # row-parallel output, all-reduced: replicated over tp
        hd = self.drop1(h)
        m = self.drop2(F.gelu(self.c(hd)))     # dropout on a column-sharded activation
        return self.d(m), hd, m


def build():
    torch.manual_seed(0)
    return Net(), (torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(1)),)


def body(rank, ws, spec):
    model, (x,) = build()
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(parallelizer.trace(model, (x,)), spec, rank, model)
    out, hd, m = pm(x)
    full = pm.full_state_dict()
    ref = Net(); ref.load_state_dict(full)
    h = ref.b(F.gelu(ref.a(x)))
    mask1 = (hd != 0)
    e_hd = torch.where(mask1, h * 2, torch.zeros_like(h))
    return {"hd": hd.detach(), "m_shape": tuple(m.shape), "out": out.detach(), "hd_vs_mask": (hd - e_hd).abs().max().item(),
            "m": m.detach()}


if __name__ == "__main__":
    m, a = build()
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(parallelizer.trace(m, a), {"tp": 2}, axis_roles={"tp": "tp"})
    print({n: (p.inputs, p.output) for n, p in plan.nodes.items() if "dropout" in n or "mm" in n})
    r = spawn(body, 2, spec_from_plan(plan), timeout_s=600)
    print("hd (replicated dropout output) equal on both ranks:", torch.equal(r[0]["hd"], r[1]["hd"]))
    print("hd consistent with eager h * mask / (1-p):", r[0]["hd_vs_mask"], r[1]["hd_vs_mask"])
    print("out equal on both ranks:", torch.equal(r[0]["out"], r[1]["out"]))
    # eager with the program's masks: out = d(drop2(gelu(c(hd))))  where drop2's mask read from m
    model, (x,) = build()
    with torch.no_grad():
        pre = F.gelu(model.c(r[0]["hd"]))
        mask2 = r[0]["m"] != 0
        print("m (second dropout output) shape", r[0]["m_shape"], "zeros fraction", 1 - mask2.float().mean().item())
        eager_out = model.d(torch.where(mask2, pre * 2, torch.zeros_like(pre)))
    print("out vs eager with the program's masks:", (eager_out - r[0]["out"]).abs().max().item())
