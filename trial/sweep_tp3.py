"""Random-cost plans of every trial model on tp=3 (uneven shards, empty batch chunks), rehearsed with the real
`rehearse_many` in chunks (a failing chunk is reported and retried case by case). python -m trial.sweep_tp3"""
import contextlib
import io
import sys

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
from trial import models as M
from trial.harness import random_plan

SKIP = {"m_floordiv", "norm_bn_cma", "emb_max_norm", "m_as_strided_off2"}

if __name__ == "__main__":
    mesh, roles = {"tp": 3}, {"tp": "tp"}
    cases = []
    for name, fn in M.BUILDERS.items():
        if name in SKIP:
            continue
        m, i = fn()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                cases.append((name, fn, spec_from_plan(random_plan(parallelizer.trace(m, i), mesh, roles,
                                                                   int(sys.argv[1]) if len(sys.argv) > 1 else 0))))
        except Exception as e:  # noqa: BLE001
            print(name, "PLAN-ERROR", type(e).__name__, str(e)[:200], flush=True)
    for k in range(0, len(cases), 20):
        part = cases[k:k + 20]
        try:
            reps = rehearse_many([(fn, {}, spec) for _, fn, spec in part], timeout_s=240)
        except Exception as e:  # noqa: BLE001
            print("chunk failed:", str(e)[:300].replace("\n", " "), flush=True)
            reps = []
            for name, fn, spec in part:
                try:
                    reps.append(rehearse_many([(fn, {}, spec)], timeout_s=60)[0])
                except Exception as e2:  # noqa: BLE001
                    reps.append(f"ERROR {type(e2).__name__}: " + str(e2)[:300].replace("\n", " "))
        for (name, _, _), r in zip(part, reps):
            print(name, r if isinstance(r, str) else ("MATCH" if r.matches() else "MISMATCH " + str(r)[:250]),
                  flush=True)
