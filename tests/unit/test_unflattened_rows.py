"""Normalisation 12 (`tracer.normalize._unflattened_rows`): rows flattened to (L*N, E) around row-wise ops and
unflattened again keep their (L, N) dims, so a batch on dim 1 stays sharded under "ddp" (round 18 (g): a ViT of
nn.TransformerEncoderLayer on dp=2 ddp emitted all_to_all x4 for MultiheadAttention's out-projection and the
residual add after it; torch DDP moves no activation). The traced program computes eager's values."""
import contextlib
import io
import os
import sys

import pytest
import torch

import parallelizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "distributed"))
from row_models import WHICH, row_model  # noqa: E402


@pytest.mark.parametrize("which", WHICH)
def test_rows_flattened_around_row_wise_ops_move_no_activation_under_ddp(which):
    model, inputs = row_model(which)
    traced = parallelizer.trace(model, inputs)
    torch.testing.assert_close(traced.exported.module()(*inputs), model(*inputs))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": "ddp"})
    moved = [(e.src, e.dst, s.kind) for e, s in plan.steps() if e.dst != "output"
             and s.kind in ("all_gather", "all_to_all", "all_reduce", "reduce_scatter")]
    assert not moved, (which, moved)
    assert not plan.notes(), plan.notes()
