"""torch.autograd.Function with a custom backward inside forward (gradient reversal, straight-through round),
and a tensor hook registered in forward: does the traced program keep the custom gradient?"""
import contextlib, io, warnings, sys
warnings.filterwarnings("ignore")
import torch
from torch import nn
import parallelizer


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -0.5 * g


class STERound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


class M(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.a(x)
        if self.kind == "reverse":
            h = GradReverse.apply(h)
        elif self.kind == "ste":
            h = STERound.apply(h * 3)
        elif self.kind == "hook":
            h = h * 1.0
            h.register_hook(lambda g: g * 10)
        return self.b(h).pow(2).mean()


def build(kind):
    torch.manual_seed(0)
    return M(kind), (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)


if __name__ == "__main__":
    for kind in ("reverse", "ste", "hook"):
        m, a = build(kind)
        m(*a).backward()
        ref = m.a.weight.grad.clone()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                tg = parallelizer.trace(m, a)
            gm = tg.exported.module()
            gm(*a).backward()
            got = dict(gm.named_parameters())["a.weight"].grad
            print(kind, "traced program a.weight grad max|diff| vs eager:", (got - ref).abs().max().item(),
                  "notes:", [n for n in tg.notes if "autograd" in n or "hook" in n])
        except Exception as e:
            print(kind, type(e).__module__, type(e).__name__, str(e)[:300])
