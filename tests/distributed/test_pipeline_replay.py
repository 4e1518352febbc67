"""A float32 model that casts values to 16 bits inside its blocks, on a pipeline plan: what the casts reach is
judged at float16's bound, blind to an error of 0.1% of the scale. Before (round 19), a pipeline rehearsal of a
program 0.1% off one device matched (ratio < 1); now the plan is also replayed in float64 (casts widened, one
step; `runtime.pipeline_rehearsal.replay_pipeline`) and the replay's ratio joins the verdict, as rehearsals on
one mesh do since round 18 (`runtime.replay64`)."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline
from precision_models import cast_blocks

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("skew", [0.0, 1e-3])
def test_a_pipeline_of_a_float32_model_narrowing_inside_is_judged_by_its_float64_replay(skew):
    """`precision_models.CastBlocks` on pp=2 (1f1b, 2 microbatches of 4): the exported stages compute the model
    without the skew, the one-device reference (eager) 1 + `skew` times each block's update."""
    traced = parallelizer.trace(*cast_blocks(batch=4))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 2}, schedule="1f1b", microbatches=2)
    report = rehearse_pipeline(cast_blocks, {"skew": skew, "batch": 8}, spec_from_plan(plan), plan.pipeline,
                               steps=2, timeout_s=300)
    assert report.matches() == (skew == 0.0), str(report)
    assert "replayed in float64" in report.reference, str(report)
