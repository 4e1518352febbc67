import sys, time, traceback
sys.path.insert(0, "trial")
import torch, h1_models as M
for n in sys.argv[1:]:
    t = time.time()
    try:
        m, a, k = M.build(n)
        out = m(*a, **k)
        l1 = out.loss.item(); l2 = m(*a, **k).loss.item()
        print(n, "ok", round(l1, 5), "det" if l1 == l2 else f"NONDET {l2}", sum(p.numel() for p in m.parameters()), f"{time.time()-t:.1f}s")
    except Exception as e:
        print(n, "FAIL", type(e).__name__, str(e)[:300])
