"""Plan every trial model on the five meshes (forced roles) and rehearse them, one launch per world size,
each case isolated (an exception on a case is reported, not fatal). Usage: python -m trial.harness [names...]"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback

import torch

import parallelizer
from parallelizer.runtime import rehearsal as R
from parallelizer.runtime.launch import spawn
from parallelizer.rewriter.spec import spec_from_plan
from trial import models as M

MESHES = [("tp2", {"tp": 2}, {"tp": "tp"}), ("ddp2", {"dp": 2}, {"dp": "ddp"}), ("fsdp2", {"dp": 2}, {"dp": "fsdp"}),
          ("tp3", {"tp": 3}, {"tp": "tp"}), ("dp2tp2", {"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"})]


def rank_cases(rank, world_size, cases, steps, lr, eps):
    out, traces = [], {}
    for name, fn, spec in cases:
        try:
            res = R._rank_main(rank, world_size, fn, {}, spec, steps, lr, eps, traces=traces)
            err = None
        except Exception as e:  # noqa: BLE001
            res, err = None, f"{type(e).__name__}: {e}"[:600] + "\n" + traceback.format_exc()[-1500:]
        flag = torch.tensor([1.0 if err else 0.0])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if err or flag.item():
            out.append({"error": err or "other rank failed"})
            continue
        if R._any_rank_outside(res):
            res = R._rank_main(rank, world_size, fn, {}, spec, steps, lr, eps, wide=True, traces=traces)
        out.append(res)
    return out


def random_plan(traced, mesh, roles, seed):
    """A valid plan under random ILP costs (as tests/fuzz does): arbitrary sharded strategies get exercised."""
    import numpy as np
    from parallelizer.core import MeshSpec
    from parallelizer.config import PlanConfig
    from parallelizer.planner.api import build as build_problem, to_plan
    from parallelizer.planner.ilp import solve
    config = PlanConfig(axis_roles=roles)
    problem, pricer = build_problem(traced, MeshSpec(tuple(mesh), tuple(mesh.values())), config=config)
    rng = np.random.default_rng(seed)
    problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
    problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
    return to_plan(traced, problem, pricer, solve(problem, config), config)


RANDOM = 0  # set by --random=K


def main(names, meshes):
    t0 = time.time()
    by_size, results = {}, {}
    for name in names:
        fn = M.BUILDERS[name]
        for mname, mesh, roles in MESHES:
            if mname not in meshes:
                continue
            try:
                model, inputs = fn()[:2]
                with contextlib.redirect_stdout(io.StringIO()):
                    traced = parallelizer.trace(model, inputs)
                    if RANDOM:
                        for k in range(RANDOM):
                            spec = spec_from_plan(random_plan(traced, mesh, roles, k))
                            by_size.setdefault(spec.mesh.world_size, []).append((f"{name}@{mname}#r{k}", fn, spec))
                        continue
                    plan = parallelizer.plan(traced, mesh, axis_roles=roles)
                spec = spec_from_plan(plan)
                by_size.setdefault(spec.mesh.world_size, []).append((f"{name}@{mname}", fn, spec))
            except Exception as e:  # noqa: BLE001
                results[f"{name}@{mname}"] = f"PLAN-ERROR {type(e).__name__}: {str(e)[:300]}"
    print(f"planned in {time.time() - t0:.0f}s", flush=True)
    for size, cases in by_size.items():
        per_rank = spawn(rank_cases, size, cases, 3, 1e-3, 1e-3, timeout_s=1200)
        for i, (cname, _, spec) in enumerate(cases):
            rs = [r[i] for r in per_rank]
            errs = [r["error"] for r in rs if "error" in r]
            if errs:
                results[cname] = "RUN-ERROR " + next((e for e in errs if e != "other rank failed"), errs[0])
            else:
                rep = R._report(size, rs)
                results[cname] = ("MATCH " if rep.matches() else "MISMATCH ") + str(rep)[:400]
        print(f"size {size} done at {time.time() - t0:.0f}s", flush=True)
    for k in sorted(results):
        print(k, "::", results[k].split("\n")[0][:300])
    json.dump(results, open(f"/tmp/trial4b_{'_'.join(meshes)}_{names[0]}_r{RANDOM}.json", "w"), indent=1)
    return results


if __name__ == "__main__":
    args = sys.argv[1:]
    global_args = args
    meshes = [m for m, *_ in MESHES]
    if args and args[0].startswith("--random="):
        globals()["RANDOM"] = int(args[0].split("=")[1])
        args = args[1:]
    if args and args[0].startswith("--meshes="):
        meshes = args[0].split("=")[1].split(",")
        args = args[1:]
    main(args or list(M.BUILDERS), meshes)
