"""Reshard after forward (`rewriter.reshard`) with a gathered weight read through an op that returns the weight
or a view of it without declaring it (einsum('ii->i') / ('ij->ji'), type_as, atleast_2d): the release must wait
for the readers of that output. Before r18a the storage was freed after the weight's last DIRECT reader: the
fsdp rank program of `einsum_diag` died with SIGSEGV reading the freed diagonal. Judged against the same model
on one device (`rehearse_many`: outputs, loss, every gradient, parameters after 3 AdamW steps)."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from alias_models import WHICH, aliased_weights

pytestmark = pytest.mark.distributed


def _plan(which, mesh, roles):
    model, inputs = aliased_weights(which)
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles)


def test_weights_read_through_undeclared_aliases_match_one_device_under_fsdp():
    plans = [_plan(w, {"dp": 2}, {"dp": "fsdp"}) for w in WHICH]
    reports = rehearse_many([(aliased_weights, {"which": w}, p) for w, p in zip(WHICH, plans)], steps=3,
                            timeout_s=300)
    for which, report in zip(WHICH, reports):
        assert report.matches(), (which, str(report))
