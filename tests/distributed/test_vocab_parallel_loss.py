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


LM = dict(vocab_size=4097, seq_len=32, batch=8, labels=True, returns="loss")  # labels: -100 on a quarter of sample 0


def test_vocab_parallel_loss_trains_as_one_device_tied_and_untied():
    """The planner's tp=2 plans of GPT-2 (tied wte / lm_head) and Llama (untied lm_head), vocabulary 4097 (shards
    of 2049 and 2048), their own loss with ignored tokens: the loss is vocab-parallel, and loss, every gradient
    (both heads included) and the parameters after 3 AdamW steps match one device (`rehearse_many`, torch.testing's
    float32 bounds). Guards the custom backward of `rewriter.vocab_parallel` (round 22, r22e)."""
    import contextlib
    import io

    import parallelizer
    from parallelizer import zoo
    from parallelizer.runtime.rehearsal import rehearse_many

    cases = []
    for fn, kwargs in ((zoo.gpt2, dict(n_layer=2, n_embd=64, n_head=4, **LM)), (zoo.llama, LM)):
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            plan = parallelizer.plan(parallelizer.trace(*fn(**kwargs)), {"tp": 2}, axis_roles={"tp": "tp"},
                                     precision="fp32", cluster="h100:1x2")
        ce = next(n for n in plan.nodes.values() if n.op == "aten.cross_entropy_loss.default")
        assert ce.strategy == "S(1) R -> R", ce  # vocab-parallel, the planner's own choice
        cases.append((fn, kwargs, plan))
    for report in rehearse_many(cases, timeout_s=600):
        assert report.tolerance_ratio <= 1.0, report
