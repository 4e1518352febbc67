"""The loss of one pipeline microbatch as the schedules see it (`runtime.pipeline`, `runtime.bitpipe`): `MicrobatchLoss`,
what torch's schedule (or our BitPipe runner) calls on the last stage's output for each microbatch, weighted by the
microbatch's share of the batch's items (`runtime.step`), and the zero-weight cases: a microbatch that counts no item
adds exactly 0 to the batch loss and zero gradients (`weighted_loss`, `counts_no_item`, `_zero_through`).
Split out of `runtime/pipeline.py` (round 24: the module was over 600 lines); no behaviour changed.
"""
from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from ..core.redistribute import sum_dtype
from .grad_reach import autograd_leaves, read_outputs


def weighted_loss(loss: torch.Tensor, weight) -> torch.Tensor:
    """loss_j * w_j of one microbatch in the batch loss. A microbatch that counts no item while the batch does
    (w_j = n_j / N = 0, e.g. every label -100) adds exactly 0: its mean loss is 0/0 = NaN, and NaN * 0 would
    make the batch loss NaN where one device's loss of the whole batch is finite (its gradient is already 0:
    a mean cross-entropy whose targets are all ignored back-propagates zeros). A batch with no item at all
    (N = 0: w_j = 0/0 = NaN) stays NaN, as one device's cross_entropy is."""
    return torch.zeros_like(loss) if is_zero_weight(weight) else loss * weight


def batch_loss(recorded) -> torch.Tensor:
    """The batch loss sum_j loss_j * w_j of `recorded` (unscaled loss_j, w_j) pairs, detached: added in the dtype a
    sum of the losses' dtype runs in (`core.redistribute.sum_dtype`: float32 for float16 / bfloat16) and rounded
    once to the losses' dtype, as one device's mean over the whole batch accumulates in float32 (round 26: summed in
    float16, microbatch losses 2048, 1, 1, -2048 (weighted) gave 0 for one device's 2)."""
    loss, weight = recorded[0]
    dtype = torch.result_type(loss, weight)  # the product's dtype (a float32 item-count weight promotes it)
    wide = sum_dtype(dtype)
    return sum(weighted_loss(loss.detach().to(wide), weight) for loss, weight in recorded).to(dtype)


class MicrobatchLoss:
    """The loss torch's schedule calls on the last stage for each microbatch: `fn(output, target_j) * w_j`.

    w_j = n_j / N (`runtime.step`: token-weighted) when the step gave an item count (`begin`), else 1 / m (a
    plain mean of the microbatch losses, as torch's schedules compute it). `recorded` gets
    (unscaled loss_j, w_j) of the running step, in the order the schedule computes them; `read` the positions of
    the stage outputs some microbatch's loss reached (`grad_reach.read_outputs`).
    """

    def __init__(self, fn, microbatches: int) -> None:
        self.default_fn, self.fn, self.microbatches = fn, fn, microbatches
        self.item_count, self.total = None, None
        self.recorded: list[tuple[torch.Tensor, torch.Tensor | float]] = []
        self.read: set[int] = set()

    def begin(self, fn, item_count, target) -> None:
        """Set the loss of the next step (fn None: the build's) and, with `item_count`, N = item_count(target)."""
        self.fn = fn if fn is not None else self.default_fn
        self.item_count = item_count
        self.total = item_count(target) if item_count is not None else None
        self.recorded.clear()
        self.read.clear()

    def __call__(self, output, target):
        loss = self.fn(output, target)
        self.read |= read_outputs(loss, pytree.tree_leaves(output))
        weight = self.item_count(target) / self.total if self.item_count is not None else 1.0 / self.microbatches
        self.recorded.append((loss.detach(), weight))
        if counts_no_item(loss, weight):
            return _zero_through(output, loss)
        return loss * weight


def is_zero_weight(weight) -> bool:
    return bool((weight == 0).all()) if isinstance(weight, torch.Tensor) else weight == 0


def counts_no_item(loss: torch.Tensor, weight) -> bool:
    """A microbatch that counts no item (weight 0) and whose mean loss is 0/0: its backward must add zeros, not
    back-propagate `loss * 0` (NaN in every gradient)."""
    return is_zero_weight(weight) and not bool(torch.isfinite(loss).all())


def _zero_through(output, loss: torch.Tensor) -> torch.Tensor:
    """A 0 whose backward sends zero gradients into the stage's finite floating outputs, for a microbatch that
    counts no item (weight 0) and whose mean loss is not finite: backward of `loss * 0` through a masked mean
    `(x * mask).sum() / mask.sum()` with an all-zero mask is 0 / 0 = NaN in every gradient (one device's loss
    of the whole batch has none). When the loss is the stage's only such output (a model returning its own loss
    alone), the zeros go to the leaves of the loss's autograd graph instead (`grad_reach.autograd_leaves`: the stage's
    received activations and its parameters), so the gradient sent back is 0 (round 22, r22b: pp=2, loss right,
    every parameter NaN after the step). Falls back to `loss * 0` when the loss has no autograd graph."""
    leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad
              and t.is_floating_point() and bool(torch.isfinite(t).all())] or autograd_leaves([loss])
    if not leaves:
        return loss * 0
    return sum((t * 0).sum() for t in leaves).to(loss.dtype)
