"""Rehearsal's default loss (mean of squares of the first output) is nearly constant for a model whose output is
a LayerNorm with its initial affine (weight 1, bias 0): every row has mean 0 and variance ~1, so mean(y^2) ~= 1
whatever the parameters before the norm. Their gradients are then smaller than float32's rounding of them
(YolosModel: the float64 gradients of the body are at most ~2e-4, the float32 ones differ from them by ~7e-4),
so rehearsal's gradient comparison (float32 bound, float64 fallback) could not see a backward error of the
size of the true gradients upstream of the final norm: its YOLOS "match" (grads |diff| 7.7e-4 on tp=2, ratio
0.3-0.7, against 2e-8 under ddp) compares rounding noise. Prints both dtypes' gradients and their difference."""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch
import hf_models as H
from parallelizer.runtime.rehearsal import _loss


def grads(dtype):
    m, a, _ = H.yolos()
    m = m.to(dtype)
    loss = _loss(m(a[0].to(dtype)))
    loss.backward()
    return loss.item(), {n: p.grad.double() for n, p in m.named_parameters()
                         if p.grad is not None and not n.startswith("layernorm.")}


if __name__ == "__main__":
    l32, g32 = grads(torch.float32)
    l64, g64 = grads(torch.float64)
    true = max(g.abs().max().item() for g in g64.values())
    noise = max((g32[n] - g64[n]).abs().max().item() for n in g64)
    print(f"loss fp32 {l32:.7f}, fp64 {l64:.7f}; body gradients (before the final LayerNorm): largest fp64 value "
          f"{true:.3g}, largest fp32 - fp64 difference {noise:.3g} (noise / signal = {noise / true:.2f})")
