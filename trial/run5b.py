"""Plan every trial5b family (trial/hf5b.py) on the meshes below with forced roles and rehearse each world size in
one launch of ranks; a case's exception is reported, not fatal. python -m trial.run5b [--random=K] [--meshes=a,b]
[--default] [families...]"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback
import warnings

import torch

import parallelizer
from parallelizer.runtime import rehearsal as R
from parallelizer.runtime.launch import spawn
from parallelizer.rewriter.spec import spec_from_plan
from trial.hf5b import FAMILIES, build

MESHES = [("ddp2", {"dp": 2}, {"dp": "ddp"}), ("tp2", {"tp": 2}, {"tp": "tp"}),
          ("fsdp2tp2", {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}), ("tp3", {"tp": 3}, {"tp": "tp"})]


def rank_cases(rank, world_size, cases, steps, lr, eps):
    warnings.filterwarnings("ignore")
    out, traces = [], {}
    for name, kwargs, spec in cases:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                res = R._rank_main(rank, world_size, build, kwargs, spec, steps, lr, eps, traces=traces)
            err = None
        except Exception as e:  # noqa: BLE001
            res, err = None, f"{type(e).__name__}: {e}"[:600] + "\n" + traceback.format_exc()[-1500:]
        flag = torch.tensor([1.0 if err else 0.0])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if err or flag.item():
            out.append({"error": err or "other rank failed"})
            continue
        if R._any_rank_outside(res):
            res = R._rank_main(rank, world_size, build, kwargs, spec, steps, lr, eps, wide=True, traces=traces)
        out.append(res)
    return out


def random_plan(traced, mesh, roles, seed):
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


def main(names, meshes, random_k=0, default=False, tag="run"):
    warnings.filterwarnings("ignore")
    t0 = time.time()
    by_size, results = {}, {}
    for name in names:
        kwargs = {"family": name, "default": default} if default else {"family": name}
        try:
            model, args, kw = build(**kwargs)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                traced = parallelizer.trace(model, args, kw)
        except Exception as e:  # noqa: BLE001
            results[name] = f"TRACE-ERROR {type(e).__name__}: {str(e)[:300]}"
            continue
        for mname, mesh, roles in MESHES:
            if mname not in meshes:
                continue
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    if random_k:
                        for k in range(random_k):
                            spec = spec_from_plan(random_plan(traced, mesh, roles, k))
                            by_size.setdefault(spec.mesh.world_size, []).append((f"{name}@{mname}#r{k}", kwargs, spec))
                        continue
                    plan = parallelizer.plan(traced, mesh, axis_roles=roles)
                spec = spec_from_plan(plan)
                by_size.setdefault(spec.mesh.world_size, []).append((f"{name}@{mname}", kwargs, spec))
            except Exception as e:  # noqa: BLE001
                results[f"{name}@{mname}"] = f"PLAN-ERROR {type(e).__name__}: {str(e)[:300]}"
    print(f"planned in {time.time() - t0:.0f}s", flush=True)
    for size, cases in sorted(by_size.items()):
        try:
            per_rank = spawn(rank_cases, size, cases, 3, 1e-3, 1e-3, timeout_s=1500)
        except Exception as e:  # noqa: BLE001
            for cname, _, _ in cases:
                results[cname] = f"LAUNCH-ERROR {type(e).__name__}: {str(e)[:300]}"
            continue
        for i, (cname, _, spec) in enumerate(cases):
            rs = [r[i] for r in per_rank]
            errs = [r["error"] for r in rs if "error" in r]
            if errs:
                results[cname] = "RUN-ERROR " + next((e for e in errs if e != "other rank failed"), errs[0])
            else:
                rep = R._report(size, rs)
                results[cname] = ("MATCH " if rep.matches() else "MISMATCH ") + str(rep)[:600]
            print(cname, "::", results[cname].replace("\n", " | ")[:400], flush=True)
        print(f"size {size} done at {time.time() - t0:.0f}s", flush=True)
    print("=== SUMMARY")
    for k in sorted(results):
        print(k, "::", results[k].replace("\n", " | ")[:300])
    json.dump(results, open(f"/tmp/trial5b_{tag}.json", "w"), indent=1)


if __name__ == "__main__":
    args = sys.argv[1:]
    meshes, rk, default, tag = [m for m, *_ in MESHES], 0, False, "run"
    while args and args[0].startswith("--"):
        a = args.pop(0)
        if a.startswith("--random="):
            rk = int(a.split("=")[1])
        elif a.startswith("--meshes="):
            meshes = a.split("=")[1].split(",")
        elif a == "--default":
            default = True
        elif a.startswith("--tag="):
            tag = a.split("=")[1]
    main(args or [f for f in FAMILIES if f != "longformer"], meshes, rk, default, tag)
