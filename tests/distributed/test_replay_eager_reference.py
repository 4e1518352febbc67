"""The float64 replay of a plan when the model's EAGER float64 run raises but its traced program runs (round 21,
r21e: DeepSeek-V4 pp=2 x dp=2, whose transformers experts take `grouped_mm` eagerly, float32-only on CPU, and
`grouped_mm_fallback` under export). Before, the replay ran the program and then the eager reference outside its
guard, and every rank raised a RuntimeError (a DistributedError instead of a report); now the report says the
replay could not run and why, as for a program that does not run in float64 (`runtime.replay64.EAGER_ONLY_NOTE`).
Members: the replay on one mesh (`replay64.replay`, via `rehearse`) and on a pipeline (`replay_pipeline`)."""
import contextlib
import io

import pytest

import parallelizer
from eager_only_models import KERNEL_ERROR, cast_blocks_eager_head
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline
from parallelizer.runtime.rehearsal import rehearse

pytestmark = pytest.mark.distributed


def _check(report):
    """The fp32 comparison matches (the model is right), and the replay's failure is named, not raised."""
    assert report.matches(), str(report)
    assert "could not be replayed in float64" in report.reference and KERNEL_ERROR in report.reference, str(report)


def test_a_replay_on_one_mesh_whose_eager_reference_has_no_float64_kernel_is_reported():
    traced = parallelizer.trace(*cast_blocks_eager_head(batch=8))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": "ddp"})
    _check(rehearse(cast_blocks_eager_head, {"batch": 8}, plan, steps=2, timeout_s=300))


def test_a_pipeline_replay_whose_eager_reference_has_no_float64_kernel_is_reported():
    traced = parallelizer.trace(*cast_blocks_eager_head(batch=4))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 2}, schedule="1f1b", microbatches=2)
    _check(rehearse_pipeline(cast_blocks_eager_head, {"batch": 8}, spec_from_plan(plan), plan.pipeline, steps=2,
                             timeout_s=300))
