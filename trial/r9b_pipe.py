"""Round 9b trial, pipelines: a tied embedding/head (Megatron-LM #844) and a sum-reduced loss (AReaL #1273) on
pp=2 x dp=2, pp=2 x tp=2 and pp=4 (rehearse_pipeline: 3 AdamW steps against one device).

python trial/r9b_pipe.py"""
from __future__ import annotations

import contextlib
import io
import sys
import warnings

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline

sys.path.insert(0, "trial")
import r9b_models as M  # noqa: E402


def half(fn):
    model, inputs = fn()
    return model, tuple(t[: t.shape[0] // 2] for t in inputs)


if __name__ == "__main__":
    for name in ("tied_stack", "sum_loss_stack"):
        fn = getattr(M, name)
        for mesh, roles, sched in (({"pp": 2, "dp": 2}, {"dp": "ddp"}, None), ({"pp": 2, "dp": 2}, {"dp": "fsdp"}, None),
                                   ({"pp": 2, "tp": 2}, {"tp": "tp"}, None), ({"pp": 4}, {}, None)):
            try:
                model, inputs = half(fn)
                with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    plan = parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles, microbatches=2)
                r = rehearse_pipeline(fn, {}, spec_from_plan(plan), plan.pipeline)
                res = f"{'match' if r.matches() else 'DIFFER'} ratio={r.tolerance_ratio:.3g} grad={r.grad:.2e}@{r.worst_grad} sched={plan.pipeline.schedule}"
            except Exception as e:  # noqa: BLE001
                res = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            print(name, mesh, roles, res, flush=True)
