"""Build, run eagerly, trace each model of hf_models; print trace seconds and the tracer's warnings."""
import sys, time, warnings, traceback
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch, parallelizer
import hf_models as H

if __name__ == "__main__":
    names = sys.argv[1:] or H.ALL
    for n in names:
        try:
            m, a, k = getattr(H, n)()
            t = time.perf_counter()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                tr = parallelizer.trace(m, a, k)
            ws = [str(x.message)[:200] for x in w if "parallelizer" in (x.filename or "") or "differs" in str(x.message) or "frozen" in str(x.message)]
            print(f"OK {n} trace {time.perf_counter()-t:.1f}s nodes={len(tr.graph_module.graph.nodes)} warns={ws}", flush=True)
        except Exception as e:
            print(f"ERR {n} {type(e).__name__}: {str(e)[:400]}", flush=True)
