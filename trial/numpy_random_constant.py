"""Finding (silent semantic change, unfixed): randomness drawn OUTSIDE torch in forward (numpy, like
Wav2Vec2's SpecAugment `_compute_mask_indices` with the default mask_time_prob=0.05) becomes a lifted constant
of the traced graph: the parallel program applies the SAME mask at every step, eager draws a new one per call.
`rehearse` of Wav2Vec2Model (default masking) reports NUMERICS DIFFER (outputs 4.5 apart) on dp=2 / tp=2;
auto_parallelize + a training loop would silently train with a frozen augmentation.
Run: python trial/numpy_random_constant.py"""
import warnings
warnings.filterwarnings("ignore")
import numpy as np
import torch
from torch import nn
import parallelizer


class NumpyMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.embed = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        h = self.a(x)
        mask = torch.tensor(np.random.rand(*h.shape[:2]) < 0.5)   # SpecAugment-style, numpy RNG
        h[mask] = self.embed
        return h


torch.manual_seed(0)
m = NumpyMask()
x = torch.randn(4, 6, 8)
traced = parallelizer.trace(m, (x,))
prog = traced.exported.module()
print("notes:", [n for n in traced.notes if "constant" in n or "random" in n])
print("eager call 1 vs 2 differ:", not torch.equal(m(x), m(x)))
print("traced program call 1 vs 2 differ:", not torch.equal(prog(x), prog(x)))
