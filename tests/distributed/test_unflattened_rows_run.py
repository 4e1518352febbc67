"""Normalisation 12 run: the models of `row_models` (nn.TransformerEncoderLayer, nn.MultiheadAttention sequence
first, rows flattened by hand around an MLP) planned under ddp and fsdp on dp=2, whose reshapes keep the batch on
dim 1 sharded (tests/unit/test_unflattened_rows.py), match the same model on one device (`rehearse_many`: outputs,
loss, every gradient, parameters after 3 AdamW steps)."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from row_models import WHICH, row_model

pytestmark = pytest.mark.distributed


def _plan(which, role):
    model, inputs = row_model(which)
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles={"dp": role})


def test_unflattened_rows_match_one_device_under_ddp_and_fsdp():
    cells = [(w, r) for w in WHICH for r in ("ddp", "fsdp")]
    reports = rehearse_many([(row_model, {"which": w}, _plan(w, r)) for w, r in cells], steps=3, timeout_s=400)
    for cell, report in zip(cells, reports):
        assert report.matches(), (cell, str(report))
