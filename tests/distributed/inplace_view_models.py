"""Models that write activations in place through slices (round 17, r17a): `F.elu(h[..., 2:10], inplace=True)`,
`h[..., 1:5].lerp_(g, 0.3)`, `.masked_fill_(mask, torch.tensor(v))` after a slice write, ... torch.export keeps the
in-place op when it writes through a view, and ops with no in-place row (or an overload no sample ran, such as
masked_fill_.Tensor) ran replicated, which data-parallel axis roles cannot run: every ddp / fsdp plan of these
per-sample models was refused with an InfeasiblePlanError. Each builder returns (model, inputs) with a scalar
loss output."""
import torch
import torch.nn.functional as F
from torch import nn


class InplaceSlices(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):                                                  # x (B, T, D)
        h, g = self.a(x), self.b(x)
        ops = (lambda v: F.elu(v[..., 2:7], inplace=True),
               lambda v: F.hardswish(v[..., 5:9], inplace=True),
               lambda v: v[..., 7:12].sqrt_(),
               lambda v: v[..., 1:5].lerp_(g[..., 1:5], 0.3),
               lambda v: v[..., 9:].addcmul_(g[..., 9:], g[..., 9:], value=0.5),
               lambda v: v[..., 3:14].clamp_(min=torch.tensor(-0.4), max=torch.tensor(0.6)),
               lambda v: v[:, 1:].pow_(2),
               lambda v: v.masked_fill_(v > 0.5, torch.tensor(0.5)))
        out = 0
        for k, op in enumerate(ops):                                      # one written copy per op: eager's
            v = (h.abs() + 0.1 if k == 2 else h).clone()                  # backward needs what each op saved
            v[..., 0] = 0.0                                               # a slice write first (export keeps
            op(v)                                                         # the in-place op after it)
            out = out + v
        return self.c(torch.tanh(out)).pow(2).mean()


def inplace_slices(batch: int = 5, seed: int = 0):
    torch.manual_seed(seed)
    return InplaceSlices(), (torch.randn(batch, 6, 16, generator=torch.Generator().manual_seed(seed + 1)),)
