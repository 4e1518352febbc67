"""trace -> plan -> rehearse for trial models. usage: drive.py MESH ROLES name... (MESH like dp=2,tp=2; ROLES like dp=fsdp,tp=tp or -)"""
import contextlib, io, sys, time, traceback, warnings
warnings.filterwarnings("ignore")
import torch
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
import models3a


def parse(s):
    return {} if s == "-" else {k: (int(v) if v.isdigit() else v) for k, v in (p.split("=") for p in s.split(","))}


def main():
    mesh, roles, names = parse(sys.argv[1]), parse(sys.argv[2]), sys.argv[3:]
    opts = {}
    if "--bf16" in names:
        names.remove("--bf16"); opts["precision"] = "bf16"
    for r in ("full", "selective"):
        if f"--recompute={r}" in names:
            names.remove(f"--recompute={r}"); opts["recompute"] = r
    cases = []
    for n in names:
        t = time.time()
        try:
            m, a, k = models3a.build(n)
            with contextlib.redirect_stdout(io.StringIO()):
                tr = parallelizer.trace(m, a, k)
                plan = parallelizer.plan(tr, mesh, axis_roles=roles or None, time_limit_s=60, **opts)
            print(f"[{n}] planned in {time.time()-t:.1f}s fallbacks={len(plan.fallbacks)} notes={plan.notes()[:2]}", flush=True)
            cases.append((n, plan))
        except Exception as e:
            print(f"[{n}] PLAN ERROR {type(e).__module__}.{type(e).__name__}: {str(e)[:600]}", flush=True)
            traceback.print_exc(limit=-3)
    if not cases:
        return
    def run(group):
        return rehearse_many([(models3a.build, {"name": n}, p) for n, p in group], steps=2, timeout_s=900)
    try:
        t = time.time()
        reps = run(cases)
        for (n, _), r in zip(cases, reps):
            print(f"[{n}] {'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} {r}", flush=True)
        print(f"rehearse {time.time()-t:.0f}s")
    except Exception as e:
        if len(cases) == 1:
            print(f"[{cases[0][0]}] RUN ERROR {type(e).__name__}: {str(e)[-3000:]}", flush=True)
            return
        print(f"group failed ({type(e).__name__}); one by one", flush=True)
        for c in cases:
            try:
                r = run([c])[0]
                print(f"[{c[0]}] {'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} {r}", flush=True)
            except Exception as e2:
                print(f"[{c[0]}] RUN ERROR {type(e2).__name__}: {str(e2)[-3000:]}", flush=True)


if __name__ == "__main__":
    main()
