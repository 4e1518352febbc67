"""Plan each pattern on the meshes of world size N and rehearse all in one launch. usage: run3.py N [names]"""
import contextlib, io, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
import patterns3

MESHES = {2: [({"tp": 2}, {"tp": "tp"}), ({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"})],
          3: [({"tp": 3}, {"tp": "tp"})],
          4: [({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"})]}

if __name__ == "__main__":
    ws = int(sys.argv[1]); names = sys.argv[2:] or list(patterns3.PATTERNS)
    cases, labels = [], []
    for name in names:
        fn = patterns3.PATTERNS[name]
        for mesh, roles in MESHES[ws]:
            try:
                m, a, *kw = fn(); kw = kw[0] if kw else {}
                with contextlib.redirect_stdout(io.StringIO()):
                    plan = parallelizer.plan(parallelizer.trace(m, a, kw), mesh, axis_roles=roles)
                cases.append((patterns3.build, {"name": name}, plan)); labels.append(f"{name:22s} {roles}")
                fb = [f.node for f in plan.fallbacks]
                if fb:
                    print(f"  {name} {roles} fallbacks {fb[:6]}", flush=True)
            except Exception as e:
                print(f"{name:22s} {roles} PLAN-ERROR {type(e).__module__}.{type(e).__name__}: {str(e)[:400]}", flush=True)
    t = time.time()
    print(f"rehearsing {len(cases)} cases", flush=True)
    reps = rehearse_many(cases, steps=2, timeout_s=2400)
    for lab, r in zip(labels, reps):
        print(f"{lab} {'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} out={r.output:.2e} "
              f"loss={r.loss:.2e} grad={r.grad:.2e}({r.worst_grad}) param={r.params:.2e}({r.worst_param}) "
              f"[{time.time()-t:.0f}s]", flush=True)
