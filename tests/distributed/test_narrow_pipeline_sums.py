"""A pipeline plan of a float16 / bfloat16 model (`model.half()`, no autocast) sums its gradients over microbatches,
dp replicas, tied copies and BitPipe's twin stage copies in float32 and rounds once, as one device's backward of the
whole batch accumulates in its kernels (round 26, r26g; rank bodies in narrow_pipeline_workers.py).

Before, autograd added each microbatch's gradient into `.grad` in the parameter's dtype (and the deferred dp sync
added the last one to it there), BitPipe's twins each rounded their half before the exchange, and the batch loss
added the weighted microbatch losses in the narrow dtype. The batch (`cancelling_batch`) makes every scalar's
weighted microbatch gradients BIG, 1, 1, -BIG: exact in the dtype, their float32 sum 2 exact, while the narrow running
sum rounds BIG + 1 back to BIG: main gave 0 (1 on BitPipe, whose twins each sum half) for one device's 2, and the
batch loss 0 for 2. Each value is checked against the float64 model (the error measured there bounded by one
device's, which is 0 for these exact sums) and against one device in the dtype (torch.testing's tolerances).

One launch of 2 ranks (pp=2: no dp sync, the stages' own rounding `grad_sync.narrow_grads`; every schedule) and one of
4 (pp=2 x dp=2: the deferred DDP sync folds the float32 running sum in, `grad_sync._fold_in_accumulated`).
"""
import pytest
import torch

from parallelizer.runtime import spawn
from narrow_pipeline_workers import pipelined_sums

pytestmark = pytest.mark.distributed

TWO_RANKS = ([("float16", s, False) for s in ("gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe")]
             + [("bfloat16", "1f1b", False), ("float16", "1f1b", True), ("float16", "bitpipe", True),
                ("bfloat16", "bitpipe", True)])
FOUR_RANKS = [("float16", "1f1b", False), ("float16", "zbv", False), ("bfloat16", "1f1b", True)]


@pytest.fixture(scope="module")
def launches():
    return {2: spawn(pipelined_sums, 2, TWO_RANKS, timeout_s=400),
            4: spawn(pipelined_sums, 4, FOUR_RANKS, timeout_s=400)}


def _check(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    assert got.dtype == eager.dtype and exact.dtype == torch.float64, what
    ours, one_device = (got.double() - exact).abs().max().item(), (eager.double() - exact).abs().max().item()
    assert ours <= one_device, f"{what}: |ours - float64| = {ours} > one device's {one_device} ({got} vs {exact})"
    torch.testing.assert_close(got, eager, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("world_size, case", [(2, c) for c in TWO_RANKS] + [(4, c) for c in FOUR_RANKS],
                         ids=lambda v: v if isinstance(v, int) else "-".join(map(str, v)))
def test_a_narrow_pipelines_gradient_and_loss_sums_round_once(launches, world_size, case):
    # before: every gradient 0 (BitPipe 1; tied copies 2 for 4) and the batch loss 0 where one device gives 2
    losses = 0
    for rank, results in enumerate(launches[world_size]):
        res = next(r for r in results if r["case"] == case)
        assert res["grads"], (rank, case)  # every rank holds some stage's scalars
        for name, (got, eager, exact) in res["grads"].items():
            assert exact.item() in (2.0, 4.0), (name, exact)  # the batch makes them exact sums (4: a tied pair)
            _check(got, eager, exact, f"rank {rank} {case} grad {name}")
        if res["loss"] is not None:
            losses += 1
            _check(*res["loss"], f"rank {rank} {case} batch loss")
    assert losses >= 1  # the last stage's ranks report the loss
