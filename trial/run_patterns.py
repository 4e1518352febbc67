"""Plan each pattern on the meshes of world size N and rehearse all in one launch. usage: run_patterns.py N [names]"""
import contextlib, io, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
import patterns

MESHES = {2: [({"dp": 2}, {"dp": "ddp"}), ({"tp": 2}, {"tp": "tp"}), ({"dp": 2}, {"dp": "fsdp"})],
          4: [({"tp": 4}, {"tp": "tp"}), ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})]}

if __name__ == "__main__":
    ws = int(sys.argv[1]); names = sys.argv[2:] or list(patterns.PATTERNS)
    cases, labels = [], []
    for name in names:
        fn = patterns.PATTERNS[name]
        for mesh, roles in MESHES[ws]:
            try:
                m, a = fn()
                m(*a)  # eager sanity
                with contextlib.redirect_stdout(io.StringIO()):
                    plan = parallelizer.plan(parallelizer.trace(m, a), mesh, axis_roles=roles)
                cases.append((fn, {}, plan)); labels.append(f"{name:18s} {roles}")
                fb = [f.node for f in plan.fallbacks]
                if fb:
                    print(f"  {name} {roles} fallbacks {fb[:6]}", flush=True)
            except Exception as e:
                print(f"{name:18s} {roles} PLAN-ERROR {type(e).__name__}: {str(e)[:400]}", flush=True)
    t = time.time()
    reps = rehearse_many(cases, steps=2, timeout_s=1800)
    for lab, r in zip(labels, reps):
        print(f"{lab} {'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} out={r.output:.2e} "
              f"loss={r.loss:.2e} grad={r.grad:.2e}({r.worst_grad}) param={r.params:.2e}({r.worst_param}) "
              f"[{time.time()-t:.0f}s]", flush=True)
