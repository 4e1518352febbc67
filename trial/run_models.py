"""Plan each trial model on dp=2 (ddp), tp=2 (tp) [2 ranks] or dp2xtp2 (fsdp,tp) [4 ranks] and rehearse it.
usage: run_models.py 2|4 name ..."""
import contextlib, io, sys, time, traceback, warnings
warnings.filterwarnings("ignore")
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
import models

MESHES = {2: [({"dp": 2}, {"dp": "ddp"}), ({"tp": 2}, {"tp": "tp"})],
          4: [({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})]}


def main():
    ws, names = int(sys.argv[1]), sys.argv[2:]
    together = names[0] == "--together"
    if together:
        names = names[1:]
    allcases, alllabels = [], []
    for name in names:
        fn = models.FAMILIES[name]
        cases, labels = [], []
        for mesh, roles in MESHES[ws]:
            t = time.time()
            try:
                m, a, k = fn()
                with contextlib.redirect_stdout(io.StringIO()):
                    plan = parallelizer.plan(parallelizer.trace(m, a, k), mesh, axis_roles=roles)
                cases.append((fn, {}, plan)); labels.append(f"{mesh}")
                if plan.fallbacks:
                    print(f"  {name} {mesh} fallbacks: {list(plan.fallbacks)[:6]}", flush=True)
            except Exception as e:
                print(f"{name:18s} {mesh} PLAN-ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
        if together:
            allcases += cases; alllabels += [f"{name:18s} {l}" for l in labels]
            continue
        if not cases:
            continue
        t = time.time()
        try:
            reps = rehearse_many(cases, steps=2)
            for lab, r in zip(labels, reps):
                print(f"{name:18s} {lab} {'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} "
                      f"out={r.output:.2e} loss={r.loss:.2e} grad={r.grad:.2e}({r.worst_grad}) "
                      f"param={r.params:.2e}({r.worst_param}) [{time.time()-t:.0f}s]", flush=True)
        except Exception as e:
            print(f"{name:18s} {labels} RUN-ERROR {type(e).__name__}: {str(e)[-1500:]}", flush=True)
    if together:
        t = time.time()
        reps = rehearse_many(allcases, steps=2, timeout_s=1800)
        for lab, r in zip(alllabels, reps):
            print(f"{lab} {'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} "
                  f"out={r.output:.2e} loss={r.loss:.2e} grad={r.grad:.2e}({r.worst_grad}) "
                  f"param={r.params:.2e}({r.worst_param}) [{time.time()-t:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
