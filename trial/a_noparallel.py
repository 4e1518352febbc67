"""Part (a): what auto_parallelize gives a small model on 2 ranks with defaults."""
import sys, warnings
import torch, torch.nn as nn
import parallelizer
from parallelizer.runtime import spawn


class MLP(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.a = nn.Linear(d, 4 * d); self.b = nn.Linear(4 * d, d)
    def forward(self, x):
        return self.b(torch.relu(self.a(x))).pow(2).mean()


def body(rank, world, batch, kw):
    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(batch, 64)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pm = parallelizer.auto_parallelize(m, (x,), **kw)
    notes = pm.plan.notes()
    return [str(i.message)[:300] for i in w], notes, str(pm.plan.mesh)


if __name__ == "__main__":
    for batch, kw in [(8, {}), (1, {}), (8, {"axis_roles": {"dp": "ddp"}}), (8, {"mesh": {"dp": 1, "tp": 2}})]:
        try:
            out = spawn(body, 2, batch, kw)
            print(batch, kw, out[0])
        except Exception as e:
            print(batch, kw, "ERR", type(e).__name__, str(e)[:300])
