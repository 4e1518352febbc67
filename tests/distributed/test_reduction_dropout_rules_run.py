"""The new rows of sum_to_size, feature_dropout, feature_alpha_dropout and alpha_dropout, run: each model
(`reduction_dropout_models`) planned under ddp and fsdp on dp=2 (batch-sharded through the op, sum_to_size over the
batch as a Partial: tests/unit/test_reduction_dropout_rules.py) matches the same model on one device
(`rehearse_many`: outputs, loss, every gradient, parameters after 3 AdamW steps, rehearse's bound). The dropouts run
in eval mode (their train-mode masks are drawn per shard, so they cannot equal one device's draw; which dims a
mask may be drawn over is the unit test's)."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from reduction_dropout_models import WHICH, reduction_dropout

pytestmark = pytest.mark.distributed


def _plan(which, role):
    model, inputs = reduction_dropout(which, train=which.startswith("sum_to_size"))
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles={"dp": role})


def test_reduction_and_dropout_rows_match_one_device_under_ddp_and_fsdp():
    cells = [(w, r) for w in WHICH for r in ("ddp", "fsdp")]
    reports = rehearse_many([(reduction_dropout, {"which": w, "train": w.startswith("sum_to_size")}, _plan(w, r))
                             for w, r in cells], steps=3, timeout_s=500)
    for cell, report in zip(cells, reports):
        assert report.matches(), (cell, str(report))
