"""The new rows of unsafe_chunk / unsafe_split / unsafe_split_with_sizes / atleast_1d / 2d / 3d, run: each model
(`alias_op_models`) planned under ddp and fsdp on dp=2 (batch-sharded through the op, `tests/unit/
test_alias_op_rules.py`) matches the same model on one device (`rehearse_many`: outputs, loss, every gradient,
parameters after 3 AdamW steps, rehearse's bound), including the write through unsafe_chunk that r18h saw refused."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from alias_op_models import WHICH, alias_op

pytestmark = pytest.mark.distributed


def _plan(which, role):
    model, inputs = alias_op(which)
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles={"dp": role})


def test_alias_ops_with_rules_match_one_device_under_ddp_and_fsdp():
    cells = [(w, r) for w in WHICH for r in ("ddp", "fsdp")]
    reports = rehearse_many([(alias_op, {"which": w}, _plan(w, r)) for w, r in cells], steps=3, timeout_s=400)
    for cell, report in zip(cells, reports):
        assert report.matches(), (cell, str(report))
