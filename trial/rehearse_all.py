"""Plan each model of hf_models on ddp dp=2, tp=2, fsdp dp=2 x tp=2, and dp=2 x tp=2 with random ILP costs;
rehearse against one device with rehearse_many (grouped by world size, chunks; a failed chunk is retried per case)."""
import sys, time, contextlib, io, warnings
sys.path.insert(0, __file__.rsplit("/", 1)[0])
sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tests/fuzz")
import numpy as np
import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.errors import ParallelizerError
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
from run_fuzz import _randomise
import hf_models as H

CASES = [("ddp2", {"dp": 2}, {"dp": "ddp"}, False), ("tp2", {"tp": 2}, {"tp": "tp"}, False),
         ("fsdp2xtp2", {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, False),
         ("rand2x2", {"dp": 2, "tp": 2}, {}, True), ("randtp2", {"tp": 2}, {}, True)]


def plan_one(traced, mesh, roles, rand, seed):
    config = PlanConfig(axis_roles=roles)
    with contextlib.redirect_stdout(io.StringIO()):
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())), config=config)
        if rand:
            _randomise(problem, seed)
        plan = to_plan(traced, problem, pricer, solve(problem, config), config)
    return spec_from_plan(plan)


if __name__ == "__main__":
    names = sys.argv[1:] or H.ALL
    todo = {2: [], 4: []}
    for n in names:
        m, a, k = getattr(H, n)()
        tr = parallelizer.trace(m, a, k)
        for tag, mesh, roles, rand in CASES:
            t = time.perf_counter()
            try:
                spec = plan_one(tr, mesh, roles, rand, 7)
                todo[int(np.prod(list(mesh.values())))].append((n, tag, spec))
                print(f"planned {n} {tag} {time.perf_counter()-t:.1f}s", flush=True)
            except ParallelizerError as e:
                print(f"RESULT {n} {tag} typed-plan-error {type(e).__name__}: {str(e)[:300]}", flush=True)
            except Exception as e:
                print(f"RESULT {n} {tag} UNTYPED-plan {type(e).__name__}: {str(e)[:300]}", flush=True)

    def go(part):
        reps = rehearse_many([(getattr(H, n), {}, spec) for n, _, spec in part], steps=2, eps=1e-3)
        for (n, tag, _), r in zip(part, reps):
            print(f"RESULT {n} {tag} {'match' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} "
                  f"{str(r).split('; collectives')[0][:400]}", flush=True)

    for world, cases in todo.items():
        for i in range(0, len(cases), 8):
            part = cases[i:i + 8]
            try:
                go(part)
            except Exception as e:
                print(f"chunk failed {type(e).__name__}: {str(e)[:300]}; retrying per case", flush=True)
                for c in part:
                    try:
                        go([c])
                    except Exception as e2:
                        print(f"RESULT {c[0]} {c[1]} CRASH {type(e2).__name__}: {str(e2)[:600]}", flush=True)
