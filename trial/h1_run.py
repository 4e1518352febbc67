"""Trial h1 (round 9): plan each model on 5 meshes and rehearse vs one device (2 AdamW steps)."""
import contextlib, io, json, sys, time, traceback, warnings
sys.path.insert(0, "trial"); sys.path.insert(0, "tests/fuzz")
import numpy as np
import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
import h1_models as M

MESHES = [("ddp dp=2", {"dp": 2}, {"dp": "ddp"}, False), ("tp=2", {"tp": 2}, {"tp": "tp"}, False),
          ("fsdp dp2 x tp2", {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, False),
          ("tp=2 random", {"tp": 2}, {}, True), ("dp2 x tp2 random", {"dp": 2, "tp": 2}, {}, True)]


def randomise(problem, seed):
    rng = np.random.default_rng(seed)
    problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
    problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}


def plan_all(name, out):
    m, a, k = M.build(name)
    try:
        with warnings.catch_warnings(record=True) as w, contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("always")
            traced = parallelizer.trace(m, a, k)
        notes = [str(x.message)[:200] for x in w if "parallelizer" in str(x.filename) or "trace" in str(x.message).lower()]
    except Exception as e:
        out.append(dict(model=name, mesh="trace", result=f"{type(e).__module__}.{type(e).__name__}: {str(e)[:400]}"))
        return []
    specs = []
    import os
    sel = os.environ.get("H1_MESHES")
    for label, mesh, roles, rnd in MESHES:
        if sel and label not in sel.split(","):
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                config = PlanConfig(axis_roles=roles)
                if rnd:
                    problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())), config=config)
                    randomise(problem, 7)
                    plan = to_plan(traced, problem, pricer, solve(problem, config), config)
                else:
                    plan = parallelizer.plan(traced, mesh, axis_roles=roles)
            specs.append((label, int(np.prod(list(mesh.values()))), spec_from_plan(plan)))
        except Exception as e:
            out.append(dict(model=name, mesh=label, result=f"plan {type(e).__module__}.{type(e).__name__}: {str(e)[:400]}"))
    return specs


if __name__ == "__main__":
    names = sys.argv[1:]
    out, cases = [], []
    for n in names:
        t = time.time()
        print(f"planning {n}", file=sys.stderr, flush=True)
        for label, world, spec in plan_all(n, out):
            cases.append((n, label, world, spec))
        print(f"planned {n} {time.time()-t:.1f}s", file=sys.stderr, flush=True)
    for world in sorted({c[2] for c in cases}):
        group = [c for c in cases if c[2] == world]
        try:
            reports = rehearse_many([(M.build, {"name": c[0]}, c[3]) for c in group], steps=2, eps=1e-3, timeout_s=900)
            for c, r in zip(group, reports):
                out.append(dict(model=c[0], mesh=c[1], result=("match" if r.matches() else "MISMATCH"),
                                ratio=r.tolerance_ratio, detail=str(r).split("; collectives")[0][:600]))
        except Exception as e:
            msg = f"{type(e).__module__}.{type(e).__name__}: {str(e)[:1500]}"
            for c in group:
                out.append(dict(model=c[0], mesh=c[1], result="launch error", detail=msg))
    for r in out:
        print(json.dumps(r))
    tag = "_".join(names)[:60]
    json.dump(out, open(f"trial/h1_results_{tag}.json", "w"), indent=1)
