"""Activation recomputation in the emitted program (issue 13, item 4; `rewriter.recompute`).

2-layer GPT-2 (zoo, fp32) with `Plan.recompute` set by hand to "full" and to "selective" on dp=2 and tp=2:
- dropout 0.1: the recomputing program and the same plan without recomputation, on the same ranks with the
  same RNG, give the same losses, every gradient of 3 steps and the parameters after 3 AdamW steps within
  1e-5 (so dropout masks are replayed in recomputation and collectives inside regions run again in step),
  while the recomputing program saves fewer bytes for backward and runs the region's softmax twice;
- dropout 0: matches the single-device eager model (`rehearse_many`: loss, gradients, parameters after 3
  steps) within 1e-5, and so do users' own torch.utils.checkpoint regions (transformers' reentrant gradient
  checkpointing on dp=2, a non-reentrant non-block region on tp=2), which `parallelizer.plan` puts into
  `Plan.recompute`.
"""
import contextlib
import dataclasses
import io

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from parallelizer.runtime.rehearsal import rehearse_many
from recompute_workers import GPT2, checkpointed_gpt2, checkpointed_mlp, compare_recompute

pytestmark = pytest.mark.distributed

BLOCKS = ("transformer.h.0", "transformer.h.1")
ROLES = {"dp": {"dp": "ddp"}, "tp": {"tp": "tp"}}


def _plan(traced, axis):
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, {axis: 2}, axis_roles=ROLES[axis], precision="fp32")


@pytest.fixture(scope="module")
def plans():
    traced = parallelizer.trace(*zoo.gpt2(dropout=0.1, **GPT2))
    return {axis: _plan(traced, axis) for axis in ROLES}


def _with(plan, mode):
    return dataclasses.replace(plan, recompute={b: mode for b in BLOCKS})


def test_recomputation_replays_dropout_and_collectives_and_saves_memory(plans):
    cases = [(f"{axis}_{mode}", spec_from_plan(plan), spec_from_plan(_with(plan, mode)))
             for axis, plan in plans.items() for mode in ("full", "selective")]
    for rank_result in spawn(compare_recompute, 2, cases, 0.1, 3, timeout_s=300):
        for name, r in rank_result.items():
            assert max(r["loss"], r["grad"], r["params"]) <= 1e-5, (name, r)
            suffix = "" if name.endswith("full") else "#attention0"
            assert r["recomputed"] == tuple(b + suffix for b in BLOCKS), (name, r["recomputed"])
            assert r["checkpoint_calls"] == 2, name
            plain, recomputed = r["saved"]
            assert recomputed < plain, (name, r["saved"])
            # one softmax per block in forward; recomputation runs it again in backward
            assert r["softmax"] == (2, 4), (name, r["softmax"])
        full, selective = rank_result["dp_full"]["saved"][1], rank_result["dp_selective"]["saved"][1]
        assert full < selective, (full, selective)


def test_recomputation_and_user_checkpoint_regions_match_single_device(plans):
    traced = parallelizer.trace(*checkpointed_gpt2(reentrant=True))
    user = _plan(traced, "dp")
    assert user.recompute == {b: "full" for b in BLOCKS}  # the user's regions, respected
    mlp_traced = parallelizer.trace(*checkpointed_mlp())
    mlp = _plan(mlp_traced, "tp")
    assert mlp.recompute == {"@checkpoint0": "full"}
    reports = rehearse_many([
        (zoo.gpt2, GPT2, spec_from_plan(_with(plans["dp"], "full"))),
        (zoo.gpt2, GPT2, spec_from_plan(_with(plans["tp"], "selective"))),
        (checkpointed_gpt2, {"reentrant": True}, spec_from_plan(user)),
        (checkpointed_mlp, {}, spec_from_plan(mlp)),
    ], steps=3, timeout_s=300)
    for report in reports:
        assert report.matches() and max(report.loss, report.grad, report.params) <= 1e-5, str(report)
        assert "torch.utils.checkpoint.checkpoint(" in report.rank0_code
