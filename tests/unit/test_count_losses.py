"""Losses normalised by a count of the batch's items, weighed over a pipeline's microbatches (`runtime.loss_weight`,
round 24, r24f): `(tok * m).sum() / count_nonzero(m)`, a ratio of means `(tok * m).mean() / m.float().mean()`, and
a cross-entropy with ignore_index plus a z-loss masked by `labels != -100` were refused (StepError "not a plain
sum" / "2 loss terms weighted differently (count, count)") although they add up over microbatches. Each weighted
sum of microbatch losses (a microbatch that counts nothing adds 0, as `MicrobatchLoss`) and its gradient equal the
eager model's on the whole batch; losses that do not add up are still refused, with the reason."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from parallelizer.runtime.loss_weight import batch_target, model_loss_weighting
from parallelizer.runtime.pipeline import counts_no_item
from parallelizer.runtime.step import StepError
from parallelizer.tracer.microbatch_check import microbatch_mixing
from parallelizer.tracer.trace import trace

sys.path.insert(0, str(Path(__file__).parents[1] / "distributed"))
from count_loss_workers import BATCH, KINDS, CountLoss, count_batch  # noqa: E402

M = 2


class Variant(CountLoss):
    """More forms of the same class: other spellings of a count, of a ratio of means and of same-item terms."""

    def forward(self, ids, labels, mask):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        tok = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none").view_as(mask)
        valid = labels != -100
        z = torch.logsumexp(logits, -1).pow(2)
        if self.kind == "nonzero_of_ne":  # count_nonzero of a boolean mask made from the labels
            return (tok * valid).sum() / torch.count_nonzero(valid)
        if self.kind == "sum_over_dims":  # sum over all dims named explicitly; mean over per-row sums
            return (tok * mask).sum(dim=(0, 1)) / mask.sum(dim=(0, 1))
        if self.kind == "row_means":  # a ratio of means over per-row sums: both over B elements
            return (tok * mask).sum(-1).mean() / mask.sum(-1).mean()
        if self.kind == "zloss_nonzero":  # the z-loss's count written as count_nonzero of the same labels
            ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return ce + 1e-2 * (z * valid).sum() / torch.count_nonzero(labels.flatten() != -100)
        if self.kind == "same_mask_terms":  # two means over one input mask (not made from labels)
            return (tok * mask).sum() / mask.sum() + 0.1 * (z * mask).sum() / mask.sum()
        if self.kind == "summed_ce":  # a loss summed over the counted labels / their count (num_items_in_batch)
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / (labels != -100).sum()
        if self.kind == "summed_ce_zloss":  # the same beside a z-loss over the same labels
            ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / valid.sum()
            return ce + 1e-2 * (z * valid).sum() / valid.sum()
        if self.kind == "sum_over_mean":  # a sum over a mean: scales with the batch size
            return (tok * mask).sum() / mask.float().mean()
        if self.kind == "summed_ce_over_mean":  # a summed loss over a mean: scales with the batch size too
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / valid.float().mean()
        if self.kind == "other_items":  # CE over the labels + a z-loss over another mask: different counts
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) + 1e-2 * (z * mask).sum() / mask.sum()
        raise ValueError(self.kind)


def _weighted_against_whole(model, weighting, batch):
    """(sum_j w_j loss_j with w_j = n_j / N from `weighting`, the model's own, and the whole batch's loss), after
    backward of each: (the microbatches' accumulated gradients, the whole batch's)."""
    ids, labels, mask = batch
    target, count = batch_target(weighting, [ids, labels, mask], M)
    total, n = torch.zeros(()), count(target)
    model.zero_grad(set_to_none=True)
    for chunk, i, y, k in zip(target.tensor_split(M), ids.tensor_split(M), labels.tensor_split(M), mask.tensor_split(M)):
        w = count(chunk) / n
        loss = model(i, y, k)
        if not counts_no_item(loss, w):  # a microbatch that counts nothing adds 0, as `MicrobatchLoss`
            (loss * w).backward()
            total = total + loss.detach() * w
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    whole = model(ids, labels, mask)
    whole.backward()
    return total, whole.detach(), grads, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("kind", [*KINDS, "nonzero_of_ne", "sum_over_dims", "row_means", "zloss_nonzero",
                                  "same_mask_terms", "summed_ce", "summed_ce_zloss"])
def test_a_count_normalised_loss_weighs_to_the_whole_batch(kind):
    """On a batch of uneven lengths and on one whose microbatch 0 counts no token (its loss 0 / 0)."""
    torch.manual_seed(0)
    model = CountLoss(kind) if kind in KINDS else Variant(kind)
    batches = [count_batch(0, seed=1), count_batch(BATCH // 2, seed=1)]
    weighting = model_loss_weighting(model, trace(model, tuple(t[:BATCH // M] for t in batches[0])))
    for batch in batches:
        total, whole, grads, whole_grads = _weighted_against_whole(model, weighting, batch)
        assert torch.isfinite(whole)
        torch.testing.assert_close(total, whole)
        for g, h in zip(grads, whole_grads):
            torch.testing.assert_close(g, h)
    # the model's own loss mixes no samples: the microbatch check (with the pipeline's weights) finds nothing
    counts = weighting.counts(list(batches[0]), M).double()
    assert microbatch_mixing(model, batches[0], {}, M, counts / counts.sum()) is None


@pytest.mark.parametrize("kind, reason", [
    ("sum_over_mean", "the quotient scales with the batch size"),
    ("summed_ce_over_mean", "the quotient scales with the batch size"),
    ("other_items", "means over different items"),
])
def test_a_count_normalised_loss_that_does_not_add_up_is_refused_with_why(kind, reason):
    """A sum over a mean (S_j x b / C_j: microbatch values weighted by C_j / C give S b / C, not one device's
    S B / C) and two means over different items (A / n + B / k: no one weight per microbatch) stay refused; the
    message says why. Their microbatch sums are checked here to differ from the whole batch's, so the refusal is
    no false one."""
    torch.manual_seed(0)
    model = Variant(kind)
    ids, labels, mask = count_batch(0, seed=1)
    labels[BATCH // M:, :3] = -100  # microbatch 1's labels count fewer tokens than its mask: n_j / k_j differ
    with torch.no_grad():
        whole = model(ids, labels, mask)
        n = mask.tensor_split(M) if kind == "sum_over_mean" else [(y != -100).sum() for y in labels.tensor_split(M)]
        n = [float(c.sum()) for c in n]
        parts = [model(i, y, k) for i, y, k in zip(ids.tensor_split(M), labels.tensor_split(M), mask.tensor_split(M))]
        weighted = sum(p * c / sum(n) for p, c in zip(parts, n))
    assert abs(float(weighted - whole)) > 1e-4  # float32's bound at |loss| ~4: 1.5e-5
    with pytest.raises(StepError, match=reason) as info:
        model_loss_weighting(model, trace(model, (ids[:BATCH // M], labels[:BATCH // M], mask[:BATCH // M])))
    assert "item_count=" in str(info.value)


def test_a_loss_fn_normalised_by_count_nonzero_is_weighted_by_it():
    """loss_fn (not the model's own loss) over count_nonzero of the target's valid entries: weighed by that
    count, the microbatch losses add up to the whole batch's (before: StepError "not a plain sum")."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.runtime.loss_weight import ChunkCount
    from parallelizer.tracer.graph import TensorMeta

    def loss_fn(out, y):
        tok = F.cross_entropy(out.flatten(0, 1), y.clamp(min=0).flatten(), reduction="none").view_as(y)
        return (tok * (y != -100)).sum() / torch.count_nonzero(y != -100)

    torch.manual_seed(0)
    _, labels, _ = count_batch(0, seed=1)
    logits = torch.randn(BATCH, labels.shape[1], 7)
    labels = labels.clamp(max=6)
    spec = torch.utils._pytree.tree_flatten(logits)[1]
    weighting = loss_fn_weighting(loss_fn, [TensorMeta((BATCH // M, labels.shape[1], 7), torch.float32)], spec,
                                  labels[:BATCH // M])
    count = ChunkCount(weighting, M, BATCH // M)
    parts = [loss_fn(o, y) * (count(y) / count(labels)) for o, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    torch.testing.assert_close(sum(parts), loss_fn(logits, labels))
