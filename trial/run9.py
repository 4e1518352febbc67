"""Round 9 (r9a): trace each builder of models9 (eager-check warnings), plan with the public API on ddp dp=2,
tp=2 and fsdp dp=2, print plan notes, rehearse against one device (2 AdamW steps) in one launch per chunk."""
import sys, time, warnings
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import parallelizer
from parallelizer.errors import ParallelizerError
from parallelizer.runtime.rehearsal import rehearse_many
import models9 as M

CASES = [("ddp2", {"dp": 2}, {"dp": "ddp"}), ("tp2", {"tp": 2}, {"tp": "tp"}), ("fsdp2", {"dp": 2}, {"dp": "fsdp"})]

if __name__ == "__main__":
    args = sys.argv[1:]
    only = None
    if args and args[0].startswith("--cases="):
        only = args.pop(0).split("=", 1)[1].split(",")
    todo = []
    for n in args:
        t = time.perf_counter()
        try:
            m, a, k = getattr(M, n)()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                tr = parallelizer.trace(m, a, k)
            mine = [str(x.message)[:300] for x in w if "parallelizer" in (x.filename or "") or "eager" in str(x.message).lower()]
            print(f"TRACE {n} ok {len(tr.nodes)} nodes {time.perf_counter()-t:.1f}s warnings={mine}", flush=True)
            for note in tr.notes:
                print(f"  tnote {n}: {str(note)[:300]}", flush=True)
        except Exception as e:
            print(f"RESULT {n} all TRACE-{'typed' if isinstance(e, ParallelizerError) else 'UNTYPED'} {type(e).__name__}: {str(e)[:500]}", flush=True)
            continue
        for tag, mesh, roles in CASES:
            if only and tag not in only:
                continue
            t = time.perf_counter()
            try:
                plan = parallelizer.plan(tr, mesh, axis_roles=roles)
                todo.append((n, tag, plan))
                print(f"PLAN {n} {tag} {time.perf_counter()-t:.1f}s notes={plan.notes()}", flush=True)
            except ParallelizerError as e:
                print(f"RESULT {n} {tag} typed-plan-error {type(e).__name__}: {str(e)[:400]}", flush=True)
            except Exception as e:
                print(f"RESULT {n} {tag} UNTYPED-plan {type(e).__name__}: {str(e)[:400]}", flush=True)

    def go(part):
        t = time.perf_counter()
        reps = rehearse_many([(getattr(M, n), {}, plan) for n, _, plan in part], steps=2, eps=1e-3)
        for (n, tag, _), r in zip(part, reps):
            print(f"RESULT {n} {tag} {'match' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} "
                  f"{str(r).split('; collectives')[0][:500]} [{time.perf_counter()-t:.0f}s chunk]", flush=True)

    for i in range(0, len(todo), 6):
        part = todo[i:i + 6]
        try:
            go(part)
        except Exception as e:
            print(f"chunk failed {type(e).__name__}: {str(e)[:300]}; retrying per case", flush=True)
            for c in part:
                try:
                    go([c])
                except Exception as e2:
                    print(f"RESULT {c[0]} {c[1]} CRASH {type(e2).__name__}: {str(e2)[:800]}", flush=True)
