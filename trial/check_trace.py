import sys, time, contextlib, io, traceback
import torch, parallelizer
from models import FAMILIES
names = sys.argv[1:] or list(FAMILIES)
for n in names:
    t = time.time()
    try:
        m, a, k = FAMILIES[n]()
        out = m(*a, **k)
        with contextlib.redirect_stdout(io.StringIO()):
            tr = parallelizer.trace(m, a, k)
        print(n, "ok", f"{time.time()-t:.1f}s", "loss" , getattr(out, "loss", None), len(tr.blocks), tr.notes[:2] if hasattr(tr,'notes') else '', flush=True)
    except Exception as e:
        print(n, "FAIL", type(e).__name__, str(e)[:400], flush=True)
