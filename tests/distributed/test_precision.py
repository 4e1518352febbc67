"""bf16 (issue 12 item 11): a model with bf16 parameters and an fp32 model with a torch.autocast(bfloat16)
region trace, plan and run on dp=2 and tp=2, and match eager at bfloat16's tolerance (`runtime.tolerance`:
torch.testing's bf16 rtol, relative to each tensor's scale, for two bf16 computations): outputs, loss, every
gradient, parameters after 3 AdamW steps."""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
from parallelizer.runtime.tolerance import compute_dtype
from precision_models import autocast_mlp, bf16_mlp

pytestmark = pytest.mark.distributed


def test_bf16_and_autocast_models_match_eager_at_bf16_tolerance():
    cases = []
    for fn in (bf16_mlp, autocast_mlp):
        traced = parallelizer.trace(*fn())
        assert compute_dtype(traced) == torch.bfloat16
        for mesh, roles in (({"dp": 2}, {"dp": "ddp"}), ({"tp": 2}, {"tp": "tp"})):
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(traced, mesh, axis_roles=roles)
            cases.append((fn, {}, spec_from_plan(plan)))
    reports = rehearse_many(cases, timeout_s=300)
    for (fn, _, spec), report in zip(cases, reports):
        assert report.matches(), (fn.__name__, spec.mesh, str(report))
        assert report.output > 1e-4 or report.grad > 1e-5, str(report)  # bf16 rounding is really there
    autocast_tp = reports[3]
    assert autocast_tp.collectives.get("all_reduce"), str(autocast_tp)  # the row-parallel sum runs in bf16
