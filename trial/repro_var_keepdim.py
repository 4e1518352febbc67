"""Crash (VerificationError, typed but misleading): var/std over dim 0 with keepdim passed POSITIONALLY
(torch.var(h, 0, keepdim=True) exports as aten.var.dim(h, [0], True, True)). The rule kept_dims(1, None)
read keepdim from the keyword only, so it took the output for (T, H) instead of (1, T, H) and labelled a
S(1) shard S(0). The verifier caught the shape; with no sample of var.dim with keepdim the rule harness never
ran it. Run: PYTHONPATH=. python trial/repro_var_keepdim.py"""
import torch
import torch.nn as nn

import parallelizer
from parallelizer.runtime.rehearsal import rehearse


class VarBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.a(x)
        return self.b(h - h.var(0, keepdim=True))


def build():
    torch.manual_seed(0)
    return VarBatch(), (torch.randn(6, 8, 16, generator=torch.Generator().manual_seed(1)),)


if __name__ == "__main__":
    model, inputs = build()
    plan = parallelizer.plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles={"dp": "ddp"})
    print(rehearse(build, {}, plan, steps=2))
