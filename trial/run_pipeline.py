"""pp=2 x dp=2 (or pp=2 x tp=2) pipeline plans of trial models, rehearsed on 4 ranks vs one device.
usage: run_pipeline.py dp|tp name ..."""
import contextlib, io, sys, time, warnings
warnings.filterwarnings("ignore")
import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline
import models

if __name__ == "__main__":
    inner, names = sys.argv[1], sys.argv[2:]
    for name in names:
        fn = models.FAMILIES[name]
        t = time.time()
        try:
            m, a, k = fn(batch=2)
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(parallelizer.trace(m, a, k), {"pp": 2, inner: 2}, microbatches=2,
                                         global_batch=4, schedule="1f1b")
            r = rehearse_pipeline(fn, {"batch": 4}, spec_from_plan(plan), plan.pipeline, steps=2, timeout_s=900)
            print(f"{name:18s} pp2x{inner}2 {'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} "
                  f"loss={r.loss:.2e} grad={r.grad:.2e}({r.worst_grad}) param={r.params:.2e}({r.worst_param}) "
                  f"[{time.time()-t:.0f}s]", flush=True)
        except Exception as e:
            print(f"{name:18s} pp2x{inner}2 ERROR {type(e).__name__}: {str(e)[-1200:]}", flush=True)
