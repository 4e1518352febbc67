"""Rules of loss ops other than cross-entropy (`nn_ops.cross_entropy`): elementwise losses and NLL.

An elementwise loss (mse, l1, smooth_l1, huber, soft_margin, kl_div, binary cross-entropy with or without
logits, hinge embedding, margin ranking, Poisson NLL) is a pointwise function of its inputs, broadcast
together, followed by the reduction its `reduction` argument names (0 "none", 1 "mean", 2 "sum"). Any dim
of the broadcast shape may be sharded, every input alike where it has that dim (Replicate where it is
broadcast): "none" keeps the shard, "sum" gives Partial, and "mean" gives Partial through its local form,
the local sum divided by the GLOBAL element count (`rewriter.localize.sharded_loss_mean`: exact for uneven
shards, as `aten.mean`). A Partial input never passes: none of them is linear.

A per-sample loss (multi-margin, multilabel-margin, cosine-embedding, triplet-margin) reads a whole row of
its inputs (the classes, the embedding) for each sample of the batch dim 0 and gives one loss per sample:
the batch may be sharded, and its "mean" is the local sum over the GLOBAL number of samples, as above.

Before these rows the ops ran replicated, and so did the prediction feeding them: a data-parallel regression
or diffusion model gathered its whole batch of predictions onto every rank for the loss.
"""
from __future__ import annotations

import math

import torch
from torch.distributed.tensor.placement_types import Shard

from .base import P, R, AxisOption, OpView, aten, replicate, same_dims
from .nn_ops import cross_entropy

# the ops `elementwise` covers; `rewriter.localize` gives their "mean" its local form
ELEMENTWISE_LOSSES = frozenset({aten.mse_loss, aten.l1_loss, aten.smooth_l1_loss, aten.huber_loss, aten.soft_margin_loss,
                                aten.kl_div, aten.binary_cross_entropy, aten.binary_cross_entropy_with_logits,
                                aten.hinge_embedding_loss, aten.margin_ranking_loss, aten.poisson_nll_loss})
# the ops `per_sample` covers -> how many of their leading tensor inputs hold one row per sample (the rest,
# multi_margin_loss's class weights, are Replicate)
PER_SAMPLE_LOSSES = {aten.multi_margin_loss: 2, aten.multilabel_margin_loss: 2, aten.cosine_embedding_loss: 3,
                     aten.triplet_margin_loss: 3}


def mean_count(packet, in_shapes) -> int:
    """The number of loss terms a "mean" reduction of loss op `packet` divides by, from the GLOBAL input shapes:
    every element of the broadcast inputs for an elementwise loss, every sample (the first input's dims but
    the last: (N, C) -> N, (C,) -> 1) for a per-sample loss."""
    if packet in PER_SAMPLE_LOSSES:
        return math.prod(in_shapes[0][:-1])
    return math.prod(torch.broadcast_shapes(*in_shapes))


def reduction_index(target) -> int:
    """Position of the `reduction` argument in the op's schema (it differs per loss: 2 for mse_loss, 4 for
    binary_cross_entropy_with_logits, 5 for poisson_nll_loss)."""
    return next(i for i, a in enumerate(target._schema.arguments) if a.name == "reduction")


def elementwise(v: OpView) -> list[AxisOption]:
    """Elementwise loss (module docstring): shard any dim of the inputs' broadcast shape."""
    reduction = v.arg(reduction_index(v.target), "reduction", 1)
    full = tuple(torch.broadcast_shapes(*v.in_shapes))
    return [replicate(v)] + [AxisOption(same_dims(v, d, out=full), Shard(d) if reduction == 0 else P)
                             for d in range(len(full)) if full[d] > 1]


def per_sample(v: OpView) -> list[AxisOption]:
    """Per-sample loss (module docstring) on a batch (N, ...): shard N on the per-sample inputs (input and
    target, or the embeddings and the +-1 target), class weights Replicate; "none" keeps the shard, "sum" and
    "mean" give Partial. An unbatched call (1-D input) is replicated."""
    rows = PER_SAMPLE_LOSSES[v.packet]
    n = v.in_shapes[0][0] if v.nd() == 2 else 1
    if n == 1 or any(s[:1] != (n,) for s in v.in_shapes[:rows]):
        return [replicate(v)]
    reduction = v.arg(reduction_index(v.target), "reduction", 1)
    return [replicate(v), AxisOption((Shard(0),) * rows + (R,) * (v.n_in - rows), Shard(0) if reduction == 0 else P)]


def nll_loss(v: OpView) -> list[AxisOption]:
    """nll_loss_nd(log-probabilities (N, C, d1..) or (C,), target (N, d1..), weight, reduction,
    ignore_index): cross-entropy's batch-dim options (`nn_ops.cross_entropy`: the mean divides by the
    GLOBAL count or class-weight sum of the targets not ignored); not its vocabulary-parallel option,
    which is a local form of cross-entropy only."""
    return [o for o in cross_entropy(v) if not (o.inputs and o.inputs[0] == Shard(1))]
