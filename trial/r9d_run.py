"""Plan + rehearse trial/r9d_models on several meshes. usage: r9d_run.py WORLD [names...] [--seeds 1,2]"""
import contextlib, io, sys, time, traceback, functools
sys.path.insert(0, "tests/distributed"); sys.path.insert(0, "trial")
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
import numpy as np
from parallelizer.config import PlanConfig
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve


def random_cost_plan(builder, mesh, roles, seed):
    model, inputs, *kw = builder()
    with contextlib.redirect_stdout(io.StringIO()):
        traced, config = parallelizer.trace(model, inputs, *kw), PlanConfig(axis_roles=roles)
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())), config=config)
        rng = np.random.default_rng(seed)
        problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
        problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
        return to_plan(traced, problem, pricer, solve(problem, config), config)
import r9d_models, r9d_hf
r9d_models.BUILDERS.update(r9d_hf.BUILDERS)

KINDS = {
    4: {"dp4": ({"dp": 4}, {"dp": "ddp"}), "dp2tp2_ddp": ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}),
        "dp2tp2_fsdp": ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}), "tp4": ({"tp": 4}, {"tp": "tp"}),
        "fsdp4": ({"dp": 4}, {"dp": "fsdp"})},
    3: {"dp3": ({"dp": 3}, {"dp": "ddp"}), "fsdp3": ({"dp": 3}, {"dp": "fsdp"})},
    2: {"dp2": ({"dp": 2}, {"dp": "ddp"}), "tp2": ({"tp": 2}, {"tp": "tp"}), "fsdp2": ({"dp": 2}, {"dp": "fsdp"})},
}


def plan_of(builder, mesh, roles, seed, precision):
    if seed is not None:
        return random_cost_plan(builder, mesh, roles, seed)
    model, inputs, *kw = builder()
    pkw = {"precision": precision} if precision else {}
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs, *kw), mesh, axis_roles=roles, **pkw)


def main():
    world = int(sys.argv[1])
    args = [a for a in sys.argv[2:] if not a.startswith("--")]
    opts = dict(a[2:].split("=") for a in sys.argv[2:] if a.startswith("--"))
    seeds = [int(s) for s in opts.get("seeds", "").split(",") if s]
    kinds = opts.get("kinds", ",".join(KINDS[world])).split(",")
    precision = opts.get("precision")
    names = args or list(r9d_models.BUILDERS)
    cases = []
    for name in names:
        b = r9d_models.BUILDERS[name]
        if "batch" in opts:
            b = functools.partial(b, batch=int(opts["batch"]))
            b.__module__ = "r9d_models"
        for k in kinds:
            mesh, roles = KINDS[world][k]
            cases.append((name, k, b, mesh, roles, None))
        for s in seeds:
            rmesh = {"dp": 2, "tp": 2} if world == 4 else ({"dp": 3} if world == 3 else {"tp": 2})
            cases.append((name, f"rand{s}", b, rmesh, {}, s))
    ok = []
    for name, k, b, mesh, roles, seed in cases:
        t = time.time()
        try:
            p = plan_of(b, mesh, roles, seed, precision)
            fb = [f.op for f in p.fallbacks]
            print(f"PLAN {name} {k}: ok {time.time()-t:.1f}s fallbacks={fb}", flush=True)
            ok.append((name, k, b, p))
        except Exception as e:
            print(f"PLAN {name} {k}: {type(e).__name__}: {str(e)[:600]}", flush=True)
    t = time.time()
    reps = rehearse_many([(b, {}, p) for _, _, b, p in ok], steps=3, timeout_s=1200)
    for (name, k, _, p), r in zip(ok, reps):
        print(f"REH {name} {k}: matches={r.matches()} ratio={r.tolerance_ratio:.3g} loss={r.loss:.2g} grad={r.grad:.2g}@{r.worst_grad} coll={dict(r.collectives)}", flush=True)
    print(f"rehearse {time.time()-t:.0f}s")


if __name__ == "__main__":
    main()
