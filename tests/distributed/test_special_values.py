"""Special values (NaN, +-inf) through collectives, global norms and the ranks' input checks, against one device
(round 23, r23g; rank bodies in special_value_workers.py).

Two classes found:
- a MAX all-reduce on gloo is `std::max` in member order, which keeps a NaN only from the group's first member:
  `collectives.all_reduce_max` now reduces the floats' order-preserving integer image (NaN above +inf), so an
  inf-norm over sharded gradients is NaN when any shard holds a NaN, and `clip_grad_norm_(error_if_nonfinite=True)`
  raises on every rank, as on one device;
- the vocab-parallel cross-entropy's backward multiplied an ignored row's softmax by the gradient reaching its
  (constant 0) loss: a mean over no counted target sends 1/0 = inf there, so every logits gradient was NaN where one
  device gives 0; and it zeroed an ignored row whose softmax is NaN (all -inf), where one device gives NaN;
- the ranks' digest of their inputs and weights (`runtime.replicas._differing`) was NaN for a tensor holding a
  NaN (or +inf beside -inf), and NaN != NaN: the SAME batch was refused as "differing between ranks";
  `full_model` / `apply`'s own check read a NaN sum as 0, so a NaN written on one rank only passed against a
  zero sum on the others (it now takes the same digest).
"""
import math

import pytest
import torch

from launch_once import run_each
from parallelizer.runtime import spawn
from special_value_workers import (apply_with_nan, max_of_ranks, nan_in_the_batch, nonfinite_shard_norms, pipeline_nonfinite_norms,
                                   special_logits, vocab_shard_special)

pytestmark = pytest.mark.distributed

PLANS = {"fsdp": (2, {"dp": 2}, {"dp": "fsdp"}), "tp": (2, {"tp": 2}, {"tp": "tp"}),
         "dp x tp": (4, {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})}
BATCH_PLANS = {"ddp": (2, {"dp": 2}, {"dp": "ddp"}), "tp": PLANS["tp"]}
REDUCTIONS = (1, 2, 0)  # mean, sum, none (`vocab_shard_special`)


def _bodies() -> dict[tuple, tuple[int, object, tuple]]:
    """key -> (world size, rank body, its arguments) of every rank body of this file's tests."""
    bodies = {("max", ws): (ws, max_of_ranks, ()) for ws in (2, 4)}
    for plan, (ws, mesh, roles) in PLANS.items():
        for bad in (math.nan, math.inf):  # the last rank's piece: never the first member of a group
            bodies[("nonfinite", plan, str(bad))] = (ws, nonfinite_shard_norms, (mesh, roles, bad, ws - 1))
    bodies[("pipeline",)] = (2, pipeline_nonfinite_norms, (math.nan, 1))
    for plan, (ws, mesh, roles) in BATCH_PLANS.items():
        for fill in ("nan", "inf"):
            bodies[("batch", plan, fill)] = (ws, nan_in_the_batch, (mesh, roles, fill))
    for ws in (2, 4):
        for case in ("ignored_row_all_neginf", "all_ignored"):
            for reduction in REDUCTIONS:
                bodies[("vocab", ws, case, reduction)] = (ws, vocab_shard_special, (case, reduction))
    for nan_on in ("one", "all"):
        bodies[("apply", nan_on)] = (2, apply_with_nan, (nan_on,))
    return bodies


@pytest.fixture(scope="module")
def per_key():
    """key of `_bodies` -> the per-rank results of its body: ONE launch per world size (`launch_once.run_each`; round
    27, r27a: the 27 launches of one body each cost ~0.5-0.7 s of CPU apiece to start)."""
    bodies, out = _bodies(), {}
    for ws in (2, 4):
        keys = [key for key, (size, _, _) in bodies.items() if size == ws]
        per_rank = spawn(run_each, ws, [bodies[key][1:] for key in keys], timeout_s=600)
        out.update({key: [ranks[i] for ranks in per_rank] for i, key in enumerate(keys)})
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_max_keeps_a_nan_from_any_rank_as_amax_does(per_key, world_size):
    # before: NaN held by rank r > 0 alone vanished (gloo: [nan, 1.0] for NaN on ranks 0, 1 of 2)
    for rank, per_dtype in enumerate(per_key[("max", world_size)]):
        for r in per_dtype:
            assert r["got"].dtype == r["eager"].dtype, (rank, r["dtype"])
            # exact: a maximum rounds nothing; +0.0 where amax picks by position between -0.0 and +0.0
            torch.testing.assert_close(r["got"], r["eager"], equal_nan=True, atol=0, rtol=0,
                                       msg=lambda m, r=r, rank=rank: f"rank {rank} {r['dtype']}: {m}")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_a_nonfinite_gradient_on_one_ranks_shard_makes_every_ranks_norm_nonfinite(per_key, plan, bad):
    # the last rank's piece: never the first member of a group, where gloo's MAX kept a NaN before
    for rank, r in enumerate(per_key[("nonfinite", plan, str(bad))]):
        for norm_type in ("2.0", "inf"):
            got, eager = r[norm_type]["total"], r[norm_type]["eager"]
            assert not math.isfinite(eager), (norm_type, eager)  # the case is what it claims
            # before (inf-norm, NaN on rank 1's shard): a finite total on every rank and no error
            torch.testing.assert_close(torch.tensor(got), torch.tensor(eager), equal_nan=True,
                                       msg=f"rank {rank} {plan} norm {norm_type} of {r['sharded']}")
            assert r[norm_type]["raised"], (rank, plan, norm_type, "error_if_nonfinite=True did not raise")
            for mine, one_device in r[norm_type]["grads"]:  # scaled by NaN or 0 (inf * 0 = NaN), as torch does
                torch.testing.assert_close(mine, one_device, equal_nan=True)


def test_a_nan_gradient_on_the_second_pipeline_stage_makes_the_inf_norm_nan_on_every_rank(per_key):
    # before: 0.244 on both ranks (the stage-1 rank's NaN dropped by the pp group's MAX), no error; eager NaN
    for rank, r in enumerate(per_key[("pipeline",)]):
        for norm_type in ("2.0", "inf"):
            assert math.isnan(r[norm_type]["eager"]), (norm_type, r[norm_type])
            assert math.isnan(r[norm_type]["total"]) and r[norm_type]["raised"], (rank, norm_type, r[norm_type])


@pytest.mark.parametrize("fill", ["nan", "inf"])
@pytest.mark.parametrize("plan", ["ddp", "tp"])
def test_the_same_batch_holding_nan_or_inf_is_not_refused_and_matches_one_device(per_key, plan, fill):
    for rank, r in enumerate(per_key[("batch", plan, fill)]):
        # before: PlanMismatchError "input(s) 'x' differ between ranks" on every rank
        assert "error" not in r, (rank, r.get("error"))
        torch.testing.assert_close(*r["loss"], equal_nan=True)
        for fqn, (mine, eager) in r["grads"].items():
            torch.testing.assert_close(mine, eager, equal_nan=True, msg=lambda m, f=fqn: f"rank {rank} {f}: {m}")


@pytest.mark.parametrize("case", ["ignored_row_all_neginf", "all_ignored"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_vocab_parallel_cross_entropy_gives_one_devices_nan_and_zeros_on_ignored_rows(per_key, world_size, case):
    for reduction in REDUCTIONS:
        logits, target = special_logits(case)
        whole = logits.clone().requires_grad_(True)
        want = torch.nn.functional.cross_entropy(whole, target, reduction={0: "none", 1: "mean", 2: "sum"}[reduction])
        (want.sum() * 1.5).backward()
        reports = per_key[("vocab", world_size, case, reduction)]
        for r in reports:
            torch.testing.assert_close(r["loss"], want.detach(), equal_nan=True)  # NaN for a mean over no target
        # before: all_ignored + mean: every element NaN (eager 0); ignored_row_all_neginf: row 0 zero (eager NaN)
        torch.testing.assert_close(torch.cat([r["grad"] for r in reports], dim=1), whole.grad, equal_nan=True,
                                   msg=lambda m, red=reduction: f"reduction {red}: {m}")


def test_full_model_writes_refuse_a_nan_on_one_rank_only_and_take_it_on_every_rank(per_key):
    # before: "written" for both (a NaN sum read as 0 against rank 0's zero sum): rank 1's replica kept a NaN weight
    one = per_key[("apply", "one")]
    assert all(r.startswith("PlanMismatchError") and "fc1.weight" in r for r in one), one
    assert per_key[("apply", "all")] == ["written", "written"]
