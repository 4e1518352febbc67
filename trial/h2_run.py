"""Round-6 trial harness: plan every h2 model on the meshes of one world size (real and random ILP costs),
rehearse them all in one launch (2 AdamW steps), print one line per case.

    python trial/h2_run.py --world 2 [--models a,b] [--out trial/h2_w2.json]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import traceback
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import parallelizer  # noqa: E402
from parallelizer.config import PlanConfig  # noqa: E402
from parallelizer.errors import ParallelizerError  # noqa: E402
from parallelizer.planner.api import build as build_problem, to_plan  # noqa: E402
from parallelizer.planner.ilp import solve  # noqa: E402
from parallelizer.rewriter.spec import spec_from_plan  # noqa: E402
from parallelizer.runtime.rehearsal import rehearse_many  # noqa: E402

import h2_models as M  # noqa: E402

MESHES = {2: [({"tp": 2}, {"tp": "tp"}), ({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"})],
          3: [({"tp": 3}, {"tp": "tp"})],
          4: [({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})]}


def plan(fn, mesh, roles, costs, seed):
    model, args = fn()[:2]
    with contextlib.redirect_stdout(io.StringIO()):
        traced = parallelizer.trace(model, args)
        config = PlanConfig(axis_roles=roles)
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())),
                                        config=config)
        if costs == "random":
            rng = np.random.default_rng(seed)
            problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
            problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
        p = to_plan(traced, problem, pricer, solve(problem, config), config)
    return spec_from_plan(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--models", default="")
    ap.add_argument("--costs", default="real,random")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    fns = [f for f in M.ALL + M.RANDOM if not a.models or f.__name__ in a.models.split(",")]
    cases, labels, rows = [], [], []
    t0 = time.time()
    for fn in fns:
        for mesh, roles in MESHES[a.world]:
            for costs in a.costs.split(","):
                label = f"{fn.__name__} {mesh} {roles} {costs}"
                try:
                    spec = plan(fn, mesh, roles, costs, seed=zlib.crc32(fn.__name__.encode()) % 1000)
                except ParallelizerError as err:
                    rows.append({"case": label, "result": f"typed {type(err).__name__}: {str(err)[:300]}"})
                    continue
                except Exception as err:  # noqa: BLE001
                    rows.append({"case": label, "result": f"UNTYPED plan {type(err).__name__}: {str(err)[:300]}",
                                 "tb": traceback.format_exc()[-2000:]})
                    continue
                cases.append((fn, {}, spec))
                labels.append(label)
    print(f"planned {len(cases)} in {time.time() - t0:.0f}s", flush=True)
    t0 = time.time()
    try:
        reports = rehearse_many(cases, steps=2, timeout_s=1200)
    except Exception as err:  # noqa: BLE001
        print("REHEARSE FAILED", type(err).__name__, str(err)[:3000])
        reports = []
    print(f"rehearsed in {time.time() - t0:.0f}s", flush=True)
    for label, r in zip(labels, reports):
        res = ("match" if r.matches() else "MISMATCH") + (f" ratio={r.tolerance_ratio:.3g} out={r.output:.2e} "
                                                          f"loss={r.loss:.2e} grad={r.grad:.2e}({r.worst_grad}) "
                                                          f"params={r.params:.2e}({r.worst_param}) buf={r.buffers}"
                                                          f"({r.worst_buffer}) rnd={r.random}")
        rows.append({"case": label, "result": res, "collectives": r.collectives})
    for row in rows:
        print(row["case"], "->", row["result"])
        if "tb" in row:
            print(row["tb"])
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
