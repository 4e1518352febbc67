"""Sums split over ranks of float16 / bfloat16 values run in float32 and are rounded once, as one device's kernels
accumulate them (round 24, r24b; rank bodies in narrow_sum_workers.py). Before, each rank rounded its summand
(a row-parallel product, a sum or mean over a sharded dim) to the narrow dtype and the collective summed in it:
float16 halves beyond 65504 gave inf / NaN where one device's value is finite (NaN vs 8000), and bfloat16
cancellations lost what one rounding keeps (1 vs 2).

Members, each against eager on one device:
- the forward reduction of a Partial (`collectives.all_reduce` / `reduce_scatter`) and the backward gradient sums
  (`grad_all_reduce`, `all_gather_rs`'s reduce-scatter, the bucketed DDP sync `grad_all_reduce_bucketed`):
  summed in float32 (`core.redistribute.sum_dtype`), 4 gloo ranks;
- a float16 op whose output is a pending sum (row-parallel linear, sum and mean over a sharded dim) runs on
  float32 copies of its inputs and its value stays float32 until the sum is complete (`rewriter.apply._sums_wide`),
  tp=2 (a bfloat16 one keeps its dtype: `core.redistribute.WIDENED_FLOATS`);
- the vocab-parallel cross-entropy's sum of exponentials, target logit and mean, in float32 (`vocab_parallel`);
- complex32 (round 26): every collective kind above sums it as complex64 (float32 parts), rounded once; gloo summed
  its float16 parts in float16 before (real parts 2048 + 1 + 1 - 2048 gave 0 for 2, a float16 overflow inf).
Pipelines' sums over microbatches, tied copies and BitPipe's twins: test_narrow_pipeline_sums.py.
"""
import pytest
import torch

from parallelizer.runtime import spawn
from narrow_sum_workers import collective_sums, edited_plans, two_rank_cases

pytestmark = pytest.mark.distributed

# bfloat16 ops are not widened (`core.redistribute.WIDENED_FLOATS`: no overflow; their product is rounded once per
# rank, as Megatron-LM's): its "rms" case (a mean of squares, one device's value kept) guards the float32 sums
CASES = [(head, "float16") for head in ("linear", "sum", "rms")] + [("rms", "bfloat16")]
PARTIALS = {"linear": ["linear_1"], "sum": ["add", "linear_1", "sum_1"], "rms": ["linear_1", "mean"]}


@pytest.fixture(scope="module")
def four_ranks():
    return spawn(collective_sums, 4, timeout_s=300)


@pytest.fixture(scope="module")
def two_ranks():
    return spawn(two_rank_cases, 2, CASES, edited_plans(CASES, 2), timeout_s=600)


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "grad_all_reduce", "all_gather_rs",
                                  "grad_all_reduce_bucketed"])
def test_a_narrow_sum_over_ranks_is_rounded_once_as_on_one_device(four_ranks, kind):
    # before (gloo sums float16 in float16): [2, 2, 2, 1, inf, ...] where one device gives [2, 2, 2, 2, 19648, ...]
    for rank, per_dtype in enumerate(four_ranks):
        for r in per_dtype:
            got, want = r["got"][kind], r["want"][kind]
            assert got.dtype == want.dtype and torch.isfinite(want).all(), (rank, r["dtype"], want)
            # exact: every summand is a float16 / bfloat16 value, their float32 sum is exact, one rounding follows
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=lambda m, r=r: f"rank {rank} {r['dtype']}: {m}")


@pytest.mark.parametrize("head, dtype", CASES)
def test_a_pending_sum_of_a_narrow_model_gives_one_devices_value(two_ranks, head, dtype):
    # before: float16 NaN (linear, sum) and 0 (rms) where one device gives 8000 / 8000 / 10.24
    for rank, r in enumerate(two_ranks):
        res = next(c for c in r["planned"] if c["case"] == (head, dtype))
        assert res["partials"] == PARTIALS[head], res["partials"]  # the split sums the case is about
        got, eager = res["out"]
        assert got.dtype == eager.dtype == getattr(torch, dtype) and torch.isfinite(eager).all()
        torch.testing.assert_close(got, eager, msg=lambda m: f"rank {rank} {head} {dtype}: {m}")
        for fqn, (mine, one_device) in res["grads"].items():
            torch.testing.assert_close(mine, one_device, equal_nan=True,
                                       msg=lambda m, f=fqn: f"rank {rank} {head} {dtype} {f}: {m}")


def test_vocab_parallel_cross_entropy_sums_narrow_logits_in_float32(two_ranks):
    # before: float16 losses inf (a sum of exponentials over 80000 classes) where one device gives 11.29
    for rank, r in enumerate(two_ranks):
        assert len(r["vocab"]) == 6
        for res in r["vocab"]:
            assert torch.isfinite(res["want"]).all(), res["case"]
            assert res["got"].dtype == res["want"].dtype, res["case"]
            torch.testing.assert_close(res["got"], res["want"], msg=lambda m, c=res["case"]: f"rank {rank} {c}: {m}")
