"""MobileViT on tp=2 (role tp): rehearse reports NUMERICS DIFFER (worst |diff| / bound = 11; grads 1.1e-4 on
encoder.layer.2.transformer.layer.0.attention.output.dense.bias, whose eager gradient is 0.041). Not a wrong
program: eager fp32 itself differs from eager fp64 by 9.4e-5 on the same parameter (the bias feeds a
BatchNorm through the fold, its gradient is a sum with heavy cancellation). The rehearsal's fp32 bound
(atol 1e-5 + rtol 1.3e-6 |ref|, elementwise) does not scale with the terms summed, so it flags rounding noise.
Run: PYTHONPATH=. HF_HUB_OFFLINE=1 python trial/repro_mobilevit_fp32_noise.py
(per-parameter sharded-vs-eager differences: python trial/diag.py hf_models mobilevit tp2-tp)"""
import copy
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
import hf_models  # noqa: E402

if __name__ == "__main__":
    m, a, k = hf_models.build("mobilevit")
    m64 = copy.deepcopy(m).double()
    m(*a, **k).loss.backward()
    m64(a[0].double(), **k).loss.backward()
    p32, p64 = dict(m.named_parameters()), dict(m64.named_parameters())
    rows = sorted(((p32[n].grad.double() - p64[n].grad).abs().max().item(), p64[n].grad.abs().max().item(), n)
                  for n in p32 if p32[n].grad is not None)[::-1][:5]
    print("eager fp32 vs eager fp64 gradient |diff| (the sharded program's worst was 1.1e-4 on the first row):")
    for r in rows:
        print("  %.3g (|grad| %.3g) %s" % r)
