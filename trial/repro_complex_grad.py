"""Silent gradient mismatch: a value that passes through complex tensors (view_as_complex -> complex mul ->
view_as_real, e.g. Meta-Llama's complex rotary) and then feeds a column-parallel linear loses its Megatron f
(grad_all_reduce over tp): the rewriter decides "a gradient flows" with dtype.is_floating_point, which is False
for complex64. Outputs and loss match; gradients of the first linear are off (only this rank's partial sum).
Run: PYTHONPATH=. python trial/repro_complex_grad.py"""
import torch
import torch.nn as nn

import parallelizer
from parallelizer.runtime.rehearsal import rehearse

B, T, H = 4, 8, 16


class ComplexRotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        z = torch.view_as_complex(h.reshape(B, T, H // 2, 2))
        ang = torch.arange(T).float()[:, None] * torch.arange(H // 2).float()[None] * 0.1
        h = torch.view_as_real(z * torch.polar(torch.ones_like(ang), ang)).reshape(B, T, H)
        return self.b(h)


def build():
    torch.manual_seed(0)
    return ComplexRotary(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


if __name__ == "__main__":
    model, inputs = build()
    plan = parallelizer.plan(parallelizer.trace(model, inputs), {"tp": 2}, axis_roles={"tp": "tp"})
    report = rehearse(build, {}, plan, steps=1)
    print(report)
    print("MATCH" if report.matches() else f"MISMATCH: grad diff {report.grad:.3g} in {report.worst_grad}")
