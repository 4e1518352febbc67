"""Models whose parameters enter an op as a 0-d tensor where the op's rule read a dim of it (round 16, r16a):
`weight_norm(m, dim=None)` (one norm over the whole weight: aten._weight_norm(v, g 0-d, -1)), and F.prelu with a
single 0-d slope. Planning raised a raw IndexError on every mesh. Each builder returns (model, inputs) with a
scalar loss output."""
import torch
import torch.nn.functional as F
from torch import nn


class ScalarGains(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        from torch.nn.utils.parametrizations import weight_norm
        self.a = weight_norm(nn.Linear(width, width), dim=None)            # g: 0-d
        self.b = weight_norm(nn.Linear(width, width), dim=None)
        self.slope = nn.Parameter(torch.tensor(0.2))                       # prelu's single slope, 0-d
        self.c = nn.Linear(width, width)

    def forward(self, x):                                                  # x (B, T, D)
        h = F.prelu(self.a(x).transpose(1, 2), self.slope).transpose(1, 2)
        return self.c(torch.tanh(self.b(h))).pow(2).mean()


def scalar_gains(batch: int = 5, seed: int = 0):
    torch.manual_seed(seed)
    return ScalarGains(), (torch.randn(batch, 6, 16, generator=torch.Generator().manual_seed(seed + 1)),)
