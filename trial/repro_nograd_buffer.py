"""Wrong gradient, no error: a buffer updated in place inside `torch.no_grad()` from a value that has a gradient
(an EMA of a parameter or an activation). The tracer inlined the no-grad region and detached only its OUTPUTS;
an in-place write has none, so in the sharded program the buffer carried autograd history into the next step,
whose backward sent gradient through it into the previous step's graph: a.bias's gradient grows from step 2
on (or, when the history holds saved tensors, "Trying to backward through the graph a second time").
Eager: the buffer never has a gradient. Run: PYTHONPATH=. python trial/repro_nograd_buffer.py"""
import torch
import torch.nn as nn

import parallelizer
from parallelizer.runtime.rehearsal import rehearse

B, H = 4, 8


class EmaOfBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.register_buffer("ema", torch.zeros(H))

    def forward(self, x):
        out = self.b(self.a(x) - self.ema)
        with torch.no_grad():
            self.ema.mul_(0.5).add_(self.a.bias * 0.5)
        return out


def build():
    torch.manual_seed(0)
    return EmaOfBias(), (torch.randn(B, H, generator=torch.Generator().manual_seed(1)),)


if __name__ == "__main__":
    model, inputs = build()
    plan = parallelizer.plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles={"dp": "ddp"})
    report = rehearse(build, {}, plan, steps=3)
    print(report)
    print("MATCH" if report.matches() else f"MISMATCH: params after steps {report.params:.3g} ({report.worst_param})")
