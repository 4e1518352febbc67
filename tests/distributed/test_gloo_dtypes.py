"""Dtypes gloo's kernels lack (int16, uint16-64, float8) moved outside the sharded programs' collectives: a pipeline
plan's `full_state_dict` broadcasts each tensor from the stage holding it over the pp group, which raised gloo's
"Invalid scalar type" on every rank for such buffers (round 12: `rewriter.collectives.carried_view`, also used by
checkpoint export's send / recv and BitPipe's transfers). Pure data movement: compared bitwise."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.runtime import spawn
from gloo_dtype_workers import coded_stack, full_state_of_a_pipeline

pytestmark = pytest.mark.distributed


def test_a_pipeline_full_state_dict_moves_int16_uint16_and_float8_buffers():
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(parallelizer.trace(*coded_stack(batch=4)), {"pp": 2}, schedule="1f1b",
                                 microbatches=2)
    assert plan.pipeline.pp == 2
    for rank, r in enumerate(spawn(full_state_of_a_pipeline, 2, plan, timeout_s=300)):
        assert "error" not in r, (rank, r)
        assert r == {"shift": ("torch.int16", True), "codes": ("torch.uint16", True),
                     "scale": ("torch.float8_e4m3fn", True)}, (rank, r)
