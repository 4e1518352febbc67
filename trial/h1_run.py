"""Plan every h1 pattern on the brief's meshes (real and random ILP costs) and rehearse against one device.

    python trial/h1_run.py WORLD [name ...]      (WORLD = 2, 3 or 4)
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import parallelizer  # noqa: E402
from parallelizer.config import PlanConfig  # noqa: E402
from parallelizer.planner.api import build as build_problem, to_plan  # noqa: E402
from parallelizer.planner.ilp import solve  # noqa: E402
from parallelizer.rewriter.spec import spec_from_plan  # noqa: E402
from parallelizer.runtime.rehearsal import rehearse_many  # noqa: E402

import h1_models  # noqa: E402

CONFIGS = {2: [({"tp": 2}, {"tp": "tp"}, "real"), ({"dp": 2}, {"dp": "ddp"}, "real"),
               ({"dp": 2}, {"dp": "fsdp"}, "real"), ({"tp": 2}, {}, "random"), ({"dp": 2}, {}, "random")],
           3: [({"tp": 3}, {"tp": "tp"}, "real"), ({"tp": 3}, {}, "random"), ({"dp": 3}, {"dp": "fsdp"}, "real")],
           4: [({"dp": 2, "tp": 2}, {}, "real"), ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}, "real"),
               ({"dp": 2, "tp": 2}, {"dp": "fsdp"}, "random")]}


def make_spec(fn, mesh, roles, costs, seed=0):
    model, *rest = fn()
    args = rest[0]
    kwargs = rest[1] if len(rest) > 1 else {}
    traced = parallelizer.trace(model, args, kwargs) if kwargs else parallelizer.trace(model, args)
    config = PlanConfig(axis_roles=roles)
    with contextlib.redirect_stdout(io.StringIO()):
        if costs == "real":
            return spec_from_plan(parallelizer.plan(traced, mesh, axis_roles=roles))
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())),
                                        config=config)
        rng = np.random.default_rng(seed)
        problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
        problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
        return spec_from_plan(to_plan(traced, problem, pricer, solve(problem, config), config))


def main():
    world = int(sys.argv[1])
    names = sys.argv[2:] or list(h1_models.BUILDERS)
    rows, cases = [], []
    for name in names:
        fn = h1_models.BUILDERS[name]
        for mesh, roles, costs in CONFIGS[world]:
            label = f"{name} {mesh} {roles or 'free'} {costs}"
            try:
                cases.append((label, fn, make_spec(fn, mesh, roles, costs, seed=len(cases) + 7)))
            except Exception as err:  # noqa: BLE001
                rows.append({"case": label, "result": f"plan error {type(err).__name__}: {str(err).splitlines()[0][:300]}"})
                print(rows[-1], flush=True)
    t0 = time.time()
    for i in range(0, len(cases), 12):
        part = cases[i:i + 12]
        try:
            reports = rehearse_many([(fn, {}, spec) for _, fn, spec in part], steps=2)
        except Exception as err:  # noqa: BLE001  one by one to find the failing case
            reports = []
            for label, fn, spec in part:
                try:
                    reports.append(rehearse_many([(fn, {}, spec)], steps=2)[0])
                except Exception as e2:  # noqa: BLE001
                    reports.append(f"run error {type(e2).__name__}: {str(e2)[-600:]}")
        for (label, _, _), r in zip(part, reports):
            if isinstance(r, str):
                rows.append({"case": label, "result": r})
            else:
                rows.append({"case": label, "result": ("match" if r.matches() else "MISMATCH"),
                             "ratio": round(r.tolerance_ratio, 3), "detail": str(r).split("; collectives")[0]})
            print(rows[-1], flush=True)
    print(f"rehearsal {time.time() - t0:.0f}s", flush=True)
    Path(f"/tmp/h1_results_{world}_{int(time.time())}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
