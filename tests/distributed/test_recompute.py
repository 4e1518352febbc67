"""Activation recomputation in the emitted program (issue 13, item 4; `rewriter.recompute`).

2-layer GPT-2 (zoo, fp32) with `Plan.recompute` set by hand to "full" and to "selective" on dp=2 and tp=2:
- dropout 0.1: the recomputing program and the same plan without recomputation, on the same ranks with the
  same RNG, give the same losses, every gradient of 3 steps and the parameters after 3 AdamW steps within
  1e-5 (so dropout masks are replayed in recomputation and collectives inside regions run again in step),
  while the recomputing program saves fewer bytes for backward and runs the region's softmax twice;
- dropout 0: tp=2 "selective" matches the single-device eager model (`rehearse_many`: loss, gradients,
  parameters after 3 steps) within 1e-5, and so do users' own torch.utils.checkpoint regions (transformers'
  reentrant gradient checkpointing on dp=2, a non-reentrant non-block region on tp=2), which
  `parallelizer.plan` puts into `Plan.recompute`.
"""
import contextlib
import dataclasses
import io

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from benchmarks._recompute_workers import GPT2, checkpointed_gpt2, checkpointed_mlp, recompute_rank

pytestmark = pytest.mark.distributed

BLOCKS = ("transformer.h.0", "transformer.h.1")
ROLES = {"dp": {"dp": "ddp"}, "tp": {"tp": "tp"}}


def _plan(traced, axis):
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, {axis: 2}, axis_roles=ROLES[axis], precision="fp32")


def _with(plan, mode):
    return dataclasses.replace(plan, recompute={b: mode for b in BLOCKS})


@pytest.fixture(scope="module")
def runs():
    """Plans, then ONE launch of 2 gloo ranks for both tests."""
    traced = parallelizer.trace(*zoo.gpt2(dropout=0.1, **GPT2))
    plans = {axis: _plan(traced, axis) for axis in ROLES}
    user = _plan(parallelizer.trace(*checkpointed_gpt2(reentrant=True)), "dp")
    mlp = _plan(parallelizer.trace(*checkpointed_mlp()), "tp")
    cases = [(axis, spec_from_plan(plan), {m: spec_from_plan(_with(plan, m)) for m in ("full", "selective")})
             for axis, plan in plans.items()]
    single_device = [(zoo.gpt2, GPT2, spec_from_plan(_with(plans["tp"], "selective"))),
                     (checkpointed_gpt2, {"reentrant": True}, spec_from_plan(user)),
                     (checkpointed_mlp, {}, spec_from_plan(mlp))]
    return {"user": user, "mlp": mlp}, spawn(recompute_rank, 2, cases, 0.1, 3, single_device, timeout_s=300)


def test_recomputation_replays_dropout_and_collectives_and_saves_memory(runs):
    for rank_result in (r["recompute"] for r in runs[1]):
        assert sorted(rank_result) == ["dp_full", "dp_selective", "tp_full", "tp_selective"]
        for name, r in rank_result.items():
            assert max(r["loss"], r["grad"], r["params"]) <= 1e-5, (name, r)
            suffix = "" if name.endswith("full") else "#attention0"
            assert r["recomputed"] == tuple(b + suffix for b in BLOCKS), (name, r["recomputed"])
            assert r["checkpoint_calls"] == 2, name
            # tp: each block's forward collectives (all-reduce of a row-parallel output, gathers) sit inside its
            # full region and run again in backward; dp's blocks have none (DDP syncs gradients only)
            if name == "tp_full":
                assert r["region_collectives"] >= 2 * len(BLOCKS), (name, r["region_collectives"])
            elif name.startswith("dp"):
                assert r["region_collectives"] == 0, (name, r["region_collectives"])
            plain, recomputed = r["saved"]
            assert recomputed < plain, (name, r["saved"])
            # one softmax per block in forward; recomputation runs it again in backward
            assert r["softmax"] == (2, 4), (name, r["softmax"])
        for axis in ROLES:  # full keeps only block inputs: less than selective
            assert rank_result[f"{axis}_full"]["saved"][1] < rank_result[f"{axis}_selective"]["saved"][1], axis


def test_recomputation_and_user_checkpoint_regions_match_single_device(runs):
    plans, results = runs
    assert plans["user"].recompute == {b: "full" for b in BLOCKS}  # the user's own regions, respected
    assert plans["mlp"].recompute == {"@checkpoint0": "full"}
    for rank_result in results:
        for name, r in zip(("tp_selective", "user_gpt2_reentrant", "user_mlp"), rank_result["single_device"]):
            for key in ("output", "loss", "grad", "params"):
                assert r[key][0] <= 1e-5 and r[key][2] <= 1.0, (name, key, r[key])
            if r["code"]:  # rank 0's program
                assert "torch.utils.checkpoint.checkpoint(" in r["code"], name
