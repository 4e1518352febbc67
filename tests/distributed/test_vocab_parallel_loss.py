"""The vocab-parallel cross-entropy (Megatron-LM's VocabParallelCrossEntropy; `rewriter.vocab_parallel`) on real
gloo ranks: loss and logits gradient equal torch's cross_entropy on the whole logits (ignored rows, a -inf class,
uneven class shards), and it keeps ONE logits-sized tensor for backward, as the planner prices it
(`planner.costs._vocab_parallel_saved_bytes`; two before round 22, r22e)."""
import pytest
import torch

from parallelizer.runtime import spawn
from vocab_parallel_workers import class_shard, logits_and_target

pytestmark = pytest.mark.distributed

ROWS, CLASSES = 40, 37  # 37 classes: shards of 19 and 18 on 2 ranks, 10/9/9/9 on 4


@pytest.mark.parametrize("world_size", [2, 4])
def test_vocab_parallel_cross_entropy_matches_one_device_and_saves_one_logits_tensor(world_size):
    for reduction in (1, 2, 0):  # mean (over the 32 counted targets), sum, none
        logits, target = logits_and_target(ROWS, CLASSES)
        whole = logits.clone().requires_grad_(True)
        name = {0: "none", 1: "mean", 2: "sum"}[reduction]
        want = torch.nn.functional.cross_entropy(whole, target, ignore_index=-100, reduction=name)
        (want.sum() * 1.5).backward()
        reports = spawn(class_shard, world_size, ROWS, CLASSES, reduction, timeout_s=120)
        for r in reports:
            torch.testing.assert_close(r["loss"], want.detach())  # Replicate over the class group
        torch.testing.assert_close(torch.cat([r["grad"] for r in reports], dim=1), whole.grad)
        for r in reports:
            n, c_local = r["local_shape"]
            # closed form: the local softmax (float32) + an int64 local index and a bool flag per row (+ the mean's
            # 0-d float32 denominator, which its division keeps)
            want_bytes = n * c_local * 4 + n * 9 + (4 if reduction == 1 else 0)
            assert r["saved_bytes"] == want_bytes, (reduction, r["saved_bytes"], want_bytes)
