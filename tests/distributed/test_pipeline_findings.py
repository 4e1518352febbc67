"""Pipeline plans on models nobody here wrote (round 10 (e)), on 4 gloo ranks in ONE launch (`launch_once`),
each against one device by the rank body of `parallelizer rehearse` (`runtime.pipeline_rehearsal._rank_main`:
eager gradient accumulation over the same microbatches, and the whole batch at once for the loss; loss,
every gradient and buffer every step, parameters after 3 AdamW steps, within float32's bound).

- A block that returns a contiguous VIEW (OPT's decoder layer: `.view(B, T, d)` of its flattened sum) on
  zbv, pp=2 x dp=2: torch's split backward detaches stage outputs in place, and every rank raised
  "Can't detach views in-place" (transformers' OPT on zbv and dualpipev the same way).
"""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from parallelizer.runtime.pipeline_rehearsal import _rank_main as rehearsal_rank
from parallelizer.runtime.rehearsal import _report
from launch_once import run_each
from pipeline_models import view_out_lm

pytestmark = pytest.mark.distributed

CASES = {  # name: (builder, global batch, mesh, plan options)
    "view_out_pp2_dp2_zbv": (view_out_lm, 8, {"pp": 2, "dp": 2},
                             dict(schedule="zbv", microbatches=4, axis_roles={"dp": "ddp"})),
    "view_out_pp2_dp2_dualpipev": (view_out_lm, 8, {"pp": 2, "dp": 2},
                                   dict(schedule="dualpipev", microbatches=4, axis_roles={"dp": "ddp"})),
}


def _plan(fn, batch, mesh, options):
    """The planner's pipeline plan, traced on one microbatch."""
    traced = parallelizer.trace(*fn(batch=batch // options["microbatches"]))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, mesh, **options)


@pytest.fixture(scope="module")
def runs():
    """{name: (plan, [rank 0's report, ..., rank 3's])} from one launch of 4 ranks."""
    plans = {name: _plan(fn, batch, mesh, options) for name, (fn, batch, mesh, options) in CASES.items()}
    calls = [(rehearsal_rank, (CASES[name][0], {"batch": CASES[name][1]}, spec_from_plan(plan),
                               plan.pipeline.to_dict(), 3, 1e-3, 1e-3)) for name, plan in plans.items()]
    per_rank = spawn(run_each, 4, calls, timeout_s=600)
    return {name: (plans[name], [r[i] for r in per_rank]) for i, name in enumerate(plans)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pipeline_plan_matches_one_device(runs, name):
    plan, per_rank = runs[name]
    assert plan.pipeline.schedule == CASES[name][3]["schedule"] and plan.pipeline.pp == 2
    report = _report(4, per_rank, "", None)  # what `parallelizer rehearse` prints and judges
    assert report.matches(), str(report)
    assert report.collectives.get("grad_all_reduce"), report.collectives  # dp=2 really synced
