"""Driver: trace, plan (ddp / tp / fsdp on 2 ranks + random-cost plans), rehearse in groups; results -> JSON lines."""
import contextlib, io, json, sys, time, traceback, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.errors import ParallelizerError
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
import sweep_models

CONFIGS = [("ddp2", {"dp": 2}, {"dp": "ddp"}, None), ("tp2", {"tp": 2}, {"tp": "tp"}, None),
           ("fsdp2", {"dp": 2}, {"dp": "fsdp"}, None), ("rand_dp2", {"dp": 2}, {}, 11), ("rand_tp2", {"tp": 2}, {}, 12)]


def plan_one(traced, mesh, roles, seed):
    with contextlib.redirect_stdout(io.StringIO()):
        if seed is None:
            return spec_from_plan(parallelizer.plan(traced, mesh, axis_roles=roles or None))
        config = PlanConfig(axis_roles=roles)
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())), config=config)
        rng = np.random.default_rng(seed)
        problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
        problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
        return spec_from_plan(to_plan(traced, problem, pricer, solve(problem, config), config))


def main(names, out, chunk=30, configs=CONFIGS):
    f = open(out, "a")
    def emit(**row):
        f.write(json.dumps(row) + "\n"); f.flush()
    pending = []
    def flush():
        if not pending:
            return
        try:
            reps = rehearse_many([(sweep_models.build, {"name": n}, s) for n, c, s in pending], steps=2, eps=1e-3)
            for (n, c, s), r in zip(pending, reps):
                emit(name=n, cfg=c, status="match" if r.matches() else "MISMATCH", ratio=r.tolerance_ratio,
                     detail=str(r).split("; collectives")[0][:600], random=getattr(r, "random", ""))
        except Exception as e:
            if len(pending) > 1:
                items = list(pending); pending.clear()
                for it in items:
                    pending.append(it); flush()
                return
            n, c, s = pending[0]
            emit(name=n, cfg=c, status="rehearse_error", detail=f"{type(e).__name__}: {str(e)[:1500]}")
        pending.clear()
    for name in names:
        t0 = time.time()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = parallelizer.trace(*sweep_models.build(name))
        except Exception as e:
            emit(name=name, cfg="trace", status="trace_error" if isinstance(e, ParallelizerError) else "UNTYPED_trace",
                 detail=f"{type(e).__name__}: {str(e)[:800]}", tb=traceback.format_exc()[-1500:])
            continue
        for cname, mesh, roles, seed in configs:
            if name.startswith("loss:") and not name.endswith(":mean") and cname not in ("ddp2", "tp2", "rand_tp2"):
                continue
            try:
                spec = plan_one(traced, mesh, roles, seed)
            except Exception as e:
                emit(name=name, cfg=cname, status="plan_error" if isinstance(e, ParallelizerError) else "UNTYPED_plan",
                     detail=f"{type(e).__name__}: {str(e)[:800]}", tb=traceback.format_exc()[-1500:])
                continue
            pending.append((name, cname, spec))
        print(f"[sweep] {name} traced+planned in {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
        if len(pending) >= chunk:
            flush()
    flush()


if __name__ == "__main__":
    sel = sys.argv[2] if len(sys.argv) > 2 else ""
    names = [n for n in sweep_models.LAYERS if n.startswith(sel) or (sel == "layers" and ":" not in n)] if sel else list(sweep_models.LAYERS)
    if sel == "layers":
        names = [n for n in sweep_models.LAYERS if ":" not in n]
    main(names, sys.argv[1])
