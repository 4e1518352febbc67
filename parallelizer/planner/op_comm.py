"""Collectives an op's sharded form runs inside the op, priced with the op (`costs.Pricer.node_cost`).

Most strategies move data only on the graph's edges (`core.redistribute`), which the ILP prices per edge.
A few local forms that the rewriter emits (`rewriter.localize`) communicate inside the op itself; they are
priced here from the strategy's input layouts, so that the ILP, the pipeline search and the step estimate
see them (before, a vocab-parallel cross-entropy looked free of communication: measured on 4 gloo ranks,
2026-12-01, its three all-reduces and the mean's denominator took 16 ms of a 79 ms forward):

* `cross_entropy_loss` (`localize.sharded_cross_entropy`), input 0 (N, C, *):
  - classes (dim 1) sharded over mesh axis a (vocab parallel, Shoeybi et al. 2019 Sec. 3): forward
    three all-reduces over a, of the row maxima (a MAX through the float's order-preserving integer image,
    float32's for a 16-bit float: `collectives._max_by_order`), the row sums of exponentials and the target
    logits (SUMs in `sum_dtype` of the logits': float32 for float16 / bfloat16, `rewriter.vocab_parallel`), one
    element of `sum_itemsize` bytes per local row each; backward none (`collectives.all_reduce`'s backward is the
    identity, the max has no gradient). Three calls, priced as three: each pays its own latency and sync
    wait (priced as one call of 3 x the bytes before round 15; on 2 gloo ranks a 4 KiB all-reduce costs
    0.3-1 ms, nearly all of it per call, `benchmarks/RESULTS.md`, round 15 r15c);
  - with reduction "mean" and rows sharded over axis b: forward all-reduce over b of the denominator
    (one element of `sum_dtype`), no backward.
* `nll_loss_nd` (`localize.sharded_nll_loss`) with reduction "mean" and rows sharded over axis b: forward
  all-reduce over b of the denominator (one element of `sum_dtype`), no backward (not priced before round 25).
* `batch_norm` in training with the input sharded over axis a (`localize.sync_batch_norm`): forward
  all-reduces over a of the count (one element), the per-channel sums and the per-channel squared
  deviations (C elements each); backward the gradients of the two per-channel statistics (C each,
  `collectives.grad_all_reduce`); all in `sum_dtype` of the input (float32 for a 16-bit float: torch's
  kernels accumulate the statistics in `at::opmath_type`).

* `instance_norm` updating running statistics with the batch sharded over axis a
  (`localize.sync_instance_norm`): forward all-reduce over a of the batch sums of the per-instance means and
  variances (2 x C elements of `sum_dtype`, no gradient); the output itself needs none.

* `masked_scatter` with the batch (dim 0 of x) sharded over axis a (`localize.checked_masked_scatter`): forward
  all-reduce over a of one flag (a rank whose mask selects another count than its source rows hold), one element
  of `localize.MASK_CHECK_DTYPE` summed, no backward (the flag is detached). Not priced before round 26: a few
  bytes, but a call's latency and sync wait each step.

* views that merge or split an unevenly sharded dim (`localize.regrouped_view`, `core.layout.view_regroups`):
  each re-cut is an all-to-all of uneven pieces over its mesh axis in forward and the reverse one in backward,
  priced as an all-to-all whose per-rank buffer is n / (n - 1) x the most bytes one member sends (the cost
  model's all-to-all sends (n - 1) / n of its buffer, `cost_model.communication`), so what is priced is
  what the busiest member sends.

The width of every SUM above is `core.redistribute.sum_itemsize` of the input's priced dtype, the one function
the edges' sums are priced by (`costs.Pricer.steps`) and the dtype the runtime sums in (`sum_dtype`); before
round 25 these were priced at the input's itemsize (2 B for float16 / bfloat16: half of what the runtime moves).

Each entry is one call the rewriter emits (calls are never merged in the price: a collective's fixed
latency and sync wait are per call). Each collective is priced like an edge's (`Pricer.step_time_s`): its calibrated time on the axis plus the
device's `collective_sync_s`.
"""
from __future__ import annotations

import math

import torch
import torch.fx
from torch.distributed.tensor.placement_types import Shard

from ..core.layout import Layout, local_shape, view_regroups
from ..core.mesh import MeshSpec
from ..core.redistribute import sum_itemsize
from ..rewriter.localize import MASK_CHECK_DTYPE, VIEW_OPS

__all__ = ["OpCollective", "op_collectives"]

aten = torch.ops.aten

# (kind, bytes, mesh axis index, runs in backward)
OpCollective = tuple[str, int, int, bool]


def _arg(node: torch.fx.Node, index: int, name: str, default):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _sharded(layout: Layout, dims, mesh: MeshSpec) -> list[int]:
    """Mesh axes of more than one device whose placement on `layout` shards one of `dims`: the groups the runtime's
    local forms communicate over (`localize.Context.sharded_axes`; a size-1 axis runs no collective, where before
    round 26 each was priced its sync wait, `cost_model.communication.collective_wait_s`)."""
    return [a for a, p in enumerate(layout) if isinstance(p, Shard) and p.dim in dims and mesh.shape[a] > 1]


def op_collectives(node: torch.fx.Node, inputs: tuple[Layout, ...], output: Layout,
                   in_shapes: list[tuple[int, ...]], out_shape: tuple[int, ...] | None, mesh: MeshSpec,
                   dtype: torch.dtype) -> list[OpCollective]:
    """The collectives (kind, bytes, mesh axis index, backward?) the local form of `node` runs under input
    layouts `inputs` and output layout `output` on `mesh` (module docstring); [] for every other op.
    `in_shapes`, `out_shape`: global shapes of the tensor inputs and the (first) output; `dtype`: the op's
    first input's dtype as priced (`costs.Pricer.dtype`): data moves at its itemsize, sums at `sum_itemsize`."""
    if not inputs:
        return []
    itemsize, summed = dtype.itemsize, sum_itemsize(dtype)
    if node.target in VIEW_OPS:
        return _regroup_collectives(in_shapes[0], out_shape, inputs[0], output, mesh, itemsize) if out_shape else []
    packet = getattr(node.target, "overloadpacket", None)
    if packet is aten.masked_scatter:  # `localize.checked_masked_scatter`: the mismatch flag over the batch's axes
        return [("all_reduce", sum_itemsize(MASK_CHECK_DTYPE), a, False) for a in _sharded(inputs[0], {0}, mesh)]
    if packet not in (aten.cross_entropy_loss, aten.nll_loss_nd, aten.batch_norm, aten.instance_norm):
        return []
    in_local = [local_shape(sh, L, mesh) for sh, L in zip(in_shapes, inputs)]
    if packet is aten.cross_entropy_loss:
        nd = len(in_local[0])
        if nd < 2:
            return []
        rows = math.prod(in_local[1]) if len(in_local) > 1 else 1
        out = [("all_reduce", rows * summed, a, False) for a in _sharded(inputs[0], {1}, mesh) for _ in range(3)]
        if _arg(node, 3, "reduction", 1) == 1:
            out += [("all_reduce", summed, a, False) for a in _sharded(inputs[0], set(range(nd)) - {1}, mesh)]
        return out
    if packet is aten.nll_loss_nd:  # `localize.sharded_nll_loss`: a mean's denominator over batch-sharded rows
        nd = len(in_local[0])
        if nd < 2 or _arg(node, 3, "reduction", 1) != 1:
            return []
        return [("all_reduce", summed, a, False) for a in _sharded(inputs[0], set(range(nd)) - {1}, mesh)]
    if packet is aten.instance_norm:
        tracking = _arg(node, 5, "use_input_stats", True) and _arg(node, 3, "running_mean", None) is not None
        channels = in_local[0][1] if len(in_local[0]) > 1 else 1
        if not tracking:
            return []
        return [("all_reduce", 2 * channels * summed, a, False) for a in _sharded(inputs[0], {0}, mesh)]
    if packet is aten.batch_norm and _arg(node, 5, "training", False):
        nd = len(in_local[0])
        channels = in_local[0][1] if nd > 1 else 1
        out = []
        for a in _sharded(inputs[0], set(range(nd)) - {1}, mesh):
            out += [("all_reduce", summed, a, False), ("all_reduce", channels * summed, a, False),
                    ("all_reduce", channels * summed, a, False), ("all_reduce", channels * summed, a, True),
                    ("all_reduce", channels * summed, a, True)]
        return out
    return []


def _regroup_collectives(src: tuple[int, ...], dst: tuple[int, ...], inputs: Layout, output: Layout,
                         mesh: MeshSpec, itemsize: int) -> list[OpCollective]:
    """A re-cutting view's all-to-alls, forward and backward (module docstring)."""
    out = []
    for r in view_regroups(src, dst, inputs, output, mesh.shape):
        shape = local_shape(dst, output, mesh) if r.after else local_shape(src, inputs, mesh)
        row_bytes = math.prod(shape) // max(shape[r.dim], 1) * itemsize
        n = mesh.shape[r.axis]
        nbytes = -(-r.rows_sent() * row_bytes * n // (n - 1))
        out += [("all_to_all", nbytes, r.axis, False), ("all_to_all", nbytes, r.axis, True)]
    return out
