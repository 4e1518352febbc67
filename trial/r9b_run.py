"""Round 9b trial: every pattern model on ddp / fsdp / tp=2 / fsdp x tp / tp=4 / ddp=4 against one device
(rehearse_many: 3 AdamW steps; outputs, loss, every gradient, parameters, buffers).

python trial/r9b_run.py [name ...]"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback
import warnings

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse, rehearse_many

sys.path.insert(0, "trial")
import r9b_models as M  # noqa: E402

MESHES = {
    "ddp2": ({"dp": 2}, {"dp": "ddp"}),
    "fsdp2": ({"dp": 2}, {"dp": "fsdp"}),
    "tp2": ({"tp": 2}, {"tp": "tp"}),
    "2x2": ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}),
    "tp4": ({"tp": 4}, {"tp": "tp"}),
    "ddp4": ({"dp": 4}, {"dp": "ddp"}),
}
CASES = ["smoothed_ce", "tied_ce", "stats", "stats1", "norm_sum", "scaled_sums", "softmax_tied",
         "index_reductions", "sharded_view", "misaligned_rows", "padded_emb", "padded_emb_low", "seq_norm_block",
         "row_bias", "token_mean", "sum_loss_stack", "tied_stack", "router_aux", "bn_uneven", "uneven_weights",
         "clip_model", "weighted_ce"]


def main(names):
    results = {}
    by_size = {}
    for name in names:
        fn = getattr(M, name)
        for mname, (mesh, roles) in MESHES.items():
            try:
                with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model, inputs = fn()[:2]
                    traced = parallelizer.trace(model, inputs)
                    plan = parallelizer.plan(traced, mesh, axis_roles=roles)
                size = 1
                for v in mesh.values():
                    size *= v
                by_size.setdefault(size, []).append((name, mname, fn, spec_from_plan(plan), plan))
            except Exception as e:  # noqa: BLE001
                results[(name, mname)] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    for size, cases in by_size.items():
        t = time.time()
        try:
            reports = rehearse_many([(fn, {}, spec) for _, _, fn, spec, _ in cases])
        except Exception:  # noqa: BLE001  one at a time to find the failing one
            reports = []
            for _, _, fn, spec, _ in cases:
                try:
                    reports.append(rehearse(fn, {}, spec))
                except Exception as e:  # noqa: BLE001
                    reports.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        print(f"size {size}: {len(cases)} cases in {time.time() - t:.0f} s", flush=True)
        for (name, mname, _, _, plan), r in zip(cases, reports):
            if isinstance(r, str):
                results[(name, mname)] = r
            else:
                repl = [n for n in plan.nodes.values() if all(x == "R" for x in (n.output,))]
                results[(name, mname)] = (f"{'match' if r.matches() else 'DIFFER'} ratio={r.tolerance_ratio:.3g} "
                                          f"grad={r.grad:.2e}@{r.worst_grad} "
                                          f"params={r.params:.2e} fallbacks={len(plan.fallbacks)}")
    for name in names:
        for mname in MESHES:
            print(f"{name:18s} {mname:6s} {results.get((name, mname))}")
    json.dump({f"{k[0]}|{k[1]}": v for k, v in results.items()}, open("/tmp/r9b_results.json", "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1:] or CASES)
