import sys, time, traceback, torch
import models9 as M
for n in sys.argv[1:]:
    t = time.time()
    try:
        m, a, k = getattr(M, n)()
        out = m(*a, **k)
        first = out[0] if isinstance(out, tuple) else next(v for v in out.values() if torch.is_tensor(v))
        npar = sum(p.numel() for p in m.parameters())
        print(f"EAGER {n} ok params={npar} first={tuple(first.shape)} loss={getattr(out,'loss',None)} {time.time()-t:.1f}s", flush=True)
    except Exception as e:
        print(f"EAGER {n} FAIL {type(e).__name__}: {str(e)[:400]}", flush=True)
