"""Rehearse the trial models on ddp/fsdp/tp (2 ranks) and dp x tp (4 ranks), forced roles and random costs."""
import contextlib, io, sys, time, traceback
import numpy as np
import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve
from parallelizer.runtime.rehearsal import rehearse_many
import hc_models as M


def plan(builder, mesh, roles, seed=None):
    model, inputs = builder()[:2]
    with contextlib.redirect_stdout(io.StringIO()):
        traced = parallelizer.trace(model, inputs)
        if seed is None:
            return parallelizer.plan(traced, mesh, axis_roles=roles)
        config = PlanConfig(axis_roles=roles)
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())),
                                        config=config)
        rng = np.random.default_rng(seed)
        problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
        problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
        return to_plan(traced, problem, pricer, solve(problem, config), config)


MESHES2 = [({"dp": 2}, {"dp": "ddp"}, None), ({"dp": 2}, {"dp": "fsdp"}, None), ({"tp": 2}, {"tp": "tp"}, None),
           ({"tp": 2}, {"tp": "tp"}, 1), ({"dp": 2}, {"dp": "auto"}, 2)]
MESHES4 = [({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}, None), ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, None),
           ({"dp": 2, "tp": 2}, {"dp": "auto", "tp": "auto"}, 3), ({"tp": 4}, {"tp": "tp"}, None),
           ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, 4)]

if __name__ == "__main__":
    names = sys.argv[2:]
    meshes = MESHES2 if sys.argv[1] == "2" else MESHES4
    cases, labels = [], []
    for name in names:
        fn = getattr(M, name)
        for mesh, roles, seed in meshes:
            label = f"{name} {mesh} {roles} seed={seed}"
            try:
                cases.append((fn, {}, plan(fn, mesh, roles, seed)))
                labels.append(label)
            except Exception as e:
                print(f"PLAN-ERR {label}: {type(e).__name__}: {str(e)[:300]}")
    t = time.time()
    try:
        reports = rehearse_many(cases, steps=2)
    except Exception as e:
        traceback.print_exc()
        sys.exit(1)
    for label, r in zip(labels, reports):
        print(f"{'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} out={r.output:.2e} "
              f"loss={r.loss:.2e} grad={r.grad:.2e}({r.worst_grad}) params={r.params:.2e} :: {label}")
    print(f"rehearse {time.time() - t:.0f}s")
