"""eager + trace check of each pattern."""
import sys, warnings, contextlib, io, traceback
warnings.filterwarnings("ignore")
import parallelizer, patterns3
for name, fn in patterns3.PATTERNS.items():
    if len(sys.argv) > 1 and name not in sys.argv[1:]:
        continue
    try:
        m, a, *kw = fn(); kw = kw[0] if kw else {}
        m(*a, **kw)
        with contextlib.redirect_stdout(io.StringIO()):
            tg = parallelizer.trace(m, a, kw)
        print(f"{name:22s} OK nodes={len(tg.nodes)}", flush=True)
    except Exception as e:
        print(f"{name:22s} {type(e).__module__}.{type(e).__name__}: {str(e)[:300]}", flush=True)
