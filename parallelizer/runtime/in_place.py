"""torch.distributed collectives that write their tensor in place, run on a contiguous tensor.

gloo (torch 2.13.0) reads and writes the tensor handed to `all_reduce`, `broadcast`, `reduce` and `scatter` as
if its elements lay in memory in their logical order (pytorch#192920; `all_gather` / `gather` were fixed in
pytorch#158903, point-to-point `send` / `recv` and `all_to_all_single` refuse a non-contiguous tensor, and the
functional collectives that `rewriter.collectives` emits copy to a contiguous tensor first). So ranks whose
tensors have different strides, or a view with gaps, exchange elements in another order, with no error.
Measured on 2 gloo ranks, torch 2.13.0 (round 25, r25g):

- `dist.all_reduce` of a column view (stride 2): wrong sums on both ranks; `dist.broadcast` / `scatter` of one:
  wrong values received; `dist.reduce`: wrong sum on the destination;
- a pipeline's shared-parameter gradient sum (`pipeline.sum_over_copies`): zero-bubble schedules (zbv) take the
  weight gradient from `torch.autograd.grad`, which keeps the layout of the op that made it (an einsum
  `"btd,od->bto"` over an 8 x 8 weight gives it transposed, strides (1, 8)), while the copy on the other rank
  came from a contiguous path: a weight shared by blocks of both pipeline ranks ended 0.56-3.89 off one device
  after 2 SGD steps, silently (1F1B, where AccumulateGrad makes gradients contiguous, and DualPipeV matched);
- a pipeline's `full_state_dict` broadcast (`PipelineModule.full_state_dict`) after `pm.to(memory_format=
  torch.channels_last)`: the holder's channels_last convolution weight into the other ranks' contiguous
  buffers: every rank's state dict 0.31 off the model's, while training itself matched.

Every in-place c10d call of the runtime on a tensor it did not allocate itself goes through these two. Those
that stay direct run on tensors allocated contiguous right before (flag and digest vectors of `grad_reach`,
`replicas`, the rehearsal verdicts; the flat gradient buckets of `rewriter.grad_sync` and the chunks of
`rewriter.hierarchical`, which are also asynchronous, where a copy back could not follow the call).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ..rewriter.collectives import carried_view


def all_reduce_in_place(tensor: torch.Tensor, *, group: dist.ProcessGroup | None = None,
                        op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    """`torch.distributed.all_reduce(tensor, op, group)` (synchronous), right for any strides: a tensor that is
    not contiguous is reduced as a contiguous copy, which is then copied back into it. Returns `tensor`, holding
    the reduction over `group` (the default group when None). Collective: every rank of the group calls it, each
    with a tensor of the same shape and dtype (strides may differ between ranks).

    Raises: what `torch.distributed.all_reduce` raises (a dtype the backend does not carry, a group this rank
    is not in)."""
    return _on_contiguous(tensor, lambda t: dist.all_reduce(t, op=op, group=group))


def broadcast_in_place(tensor: torch.Tensor, src: int, *, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """`torch.distributed.broadcast(tensor, src, group)` (synchronous), right for any strides on the sender and
    the receivers, and for the dtypes gloo does not carry (moved as `rewriter.collectives.carried_view`'s bit or
    real view). `src` is a global rank. Returns `tensor`, holding the sender's values on every rank of `group`.
    Collective, as `all_reduce_in_place`.

    Raises: what `torch.distributed.broadcast` raises (a group without `src`, a group this rank is not in)."""
    return _on_contiguous(tensor, lambda t: dist.broadcast(carried_view(t), src=src, group=group))


def _on_contiguous(tensor: torch.Tensor, collective: Callable[[torch.Tensor], object]) -> torch.Tensor:
    """Run `collective` on `tensor` itself when it is contiguous, else on a contiguous copy copied back after."""
    if tensor.is_contiguous():
        collective(tensor)
        return tensor
    buffer = tensor.contiguous()
    collective(buffer)
    with torch.no_grad():
        tensor.copy_(buffer)
    return tensor
