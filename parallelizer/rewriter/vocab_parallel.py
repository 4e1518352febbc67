"""Vocab-parallel cross-entropy: the per-row losses of logits whose classes (dim 1) are split over mesh axes,
as Megatron-LM computes them (`VocabParallelCrossEntropy`, megatron/core/tensor_parallel/cross_entropy.py;
Shoeybi et al. 2019, Sec. 3): the row max (all-reduce max), the sum of exponentials and the target logit
(all-reduce sum) are combined over the class groups; no rank ever holds a full row of logits.

Memory (what `planner.costs._vocab_parallel_saved_bytes` prices): one autograd node that keeps ONE
logits-sized tensor for backward, the local softmax (N, C_local, *) in the logits' dtype, written in place
over the shifted logits it is computed from, plus per row an int64 local target index and a bool "this
rank holds the target" flag. Its backward is local: d logits = softmax * g - onehot(target) * g (rows whose
target is `ignore_index` get softmax * 0, as one device's log_softmax backward: 0, or NaN where that row's softmax
is NaN), with no collective (the loss is Replicate over the class groups, so each
rank's g is the whole gradient of its own classes). For float16 / bfloat16 logits the sum of exponentials, the
target logit and the loss are held in float32 and the loss rounded once, as one device's log_softmax accumulates
in float32 (round 24, r24b: a float16 sum over 80000 classes was inf where one device's loss is 11.29). Before round 22 (r22e) the same arithmetic ran as plain
autograd ops, which kept the shifted logits (saved whole by `gather`) AND the exponentials (saved by `exp`):
two logits-sized tensors, so a memory-bound plan of a 128k vocabulary took the all-to-all to batch shards
instead (benchmarks/RESULTS.md, Round 21 (g) finding 2).
"""
from __future__ import annotations

import torch

from ..core.redistribute import sum_dtype
from . import collectives


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-row losses log(sum_c exp(x_c)) - x_target of class-sharded logits (module docstring)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, ignore_index: int, class_groups: list,
                class_start: int) -> torch.Tensor:
        c_local = logits.shape[1]
        rows = logits.amax(dim=1) if c_local else \
            logits.new_full((logits.shape[0], *logits.shape[2:]), float("-inf"))  # an empty class shard
        for ranks in class_groups:
            rows = collectives.all_reduce_max(rows, ranks)
        softmax = logits - rows.unsqueeze(1)  # (N, C_local, *): the one logits-sized buffer, reused below
        local_t = target - class_start
        inside = (local_t >= 0) & (local_t < c_local)
        index = local_t.clamp(0, max(c_local - 1, 0)).unsqueeze(1)  # (N, 1, *)
        picked = softmax.gather(1, index).squeeze(1) if c_local else softmax.new_zeros(target.shape)
        picked = torch.where(inside, picked, 0.0)  # not `* inside`: a clamped index may land on a -inf logit
        # (a banned class, padded vocab, a masked diagonal), and -inf * 0 is NaN
        wide = sum_dtype(logits.dtype)  # float16 / bfloat16: the sum of exponentials and the loss in float32,
        # as one device's log_softmax accumulates (a float16 sum over 80000 classes was inf: loss inf; r24b)
        sum_exp = softmax.exp_().sum(1, dtype=wide)
        picked = picked.to(wide)
        for ranks in class_groups:
            sum_exp = collectives.all_reduce(sum_exp, ranks)
            picked = collectives.all_reduce(picked, ranks)
        valid = target != ignore_index
        softmax.div_(sum_exp.unsqueeze(1))
        # an ignored row's index is -1: its gradient is softmax * 0 whatever reaches it (`backward`)
        ctx.save_for_backward(softmax, index.masked_fill_(~valid.unsqueeze(1), -1), inside & valid)
        return torch.where(valid, sum_exp.log() - picked, 0.0).to(logits.dtype)  # an ignored row may be all -inf

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        softmax, index, hit = ctx.saved_tensors
        # one device (log_softmax + nll_loss): an ignored row gets d logits = 0 - exp(log_softmax) * 0, whatever
        # gradient reaches its loss: 0, or NaN where its softmax is NaN (a row of all -inf or holding +inf/NaN);
        # a mean over no counted target sends inf (1/0) to every row, and 0 * inf made every gradient NaN (r23g)
        grad = torch.where(index.squeeze(1) >= 0, grad, 0.0)
        grad_logits = softmax * grad.unsqueeze(1)
        if softmax.shape[1]:
            picked = torch.where(hit, -grad, 0.0).unsqueeze(1).to(grad_logits.dtype)
            grad_logits.scatter_add_(1, index.clamp(min=0), picked)
        return grad_logits, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int,
                                 class_groups: list[list[int]], class_start: int) -> torch.Tensor:
    """Per-row cross-entropy losses (N, *) of local logits (N, C_local, *) holding global classes
    [class_start, class_start + C_local) of a class dim split over `class_groups`; `target` (N, *) global class
    ids (each rank passes the same); 0 where the target is `ignore_index`. The result is the same on every rank
    of the class groups (Replicate). Saved for backward: the local softmax and two row vectors (module
    docstring). Targets must lie in [0, classes) or be `ignore_index` (the caller checks, `check_indices`)."""
    return _VocabParallelCrossEntropy.apply(logits, target, ignore_index, class_groups, class_start)

