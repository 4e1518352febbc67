import sys, traceback, warnings, torch
sys.path.insert(0, "trial")
import h3_models as M
warnings.filterwarnings("ignore")
for n in (sys.argv[1:] or M.NAMES):
    try:
        m, a, k = M.build(n)
        out = m(*a, **k)
        l = out[0] if out[0].ndim == 0 else out[0].float().pow(2).mean()
        l.backward()
        print("OK", n, tuple(out[0].shape), sum(p.numel() for p in m.parameters()), flush=True)
    except Exception as e:
        print("FAIL", n, type(e).__name__, str(e)[:300], flush=True)
