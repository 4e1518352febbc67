"""Emit one op on local shards: localise shape arguments and handle ops whose local form differs.

Most ATen ops run unchanged on local shards once their inputs have the layouts the plan asks for. The
exceptions, each handled here:
- ops with a size argument (view, reshape, expand, new_zeros, ...): the size becomes the local output
  shape, computed from the global output shape and the output layout;
- a linear/addmm whose bias is still inside (the tracer splits them off, a hand-made graph may not) with a
  Partial output: the replicated bias is divided by the Partial axes' size so that it is added once;
- `aten.embedding` with the weight sharded on the vocabulary dim (vocab-parallel embedding, Megatron):
  each rank looks up the ids in its own vocabulary range, zeros the others; the output is Partial(sum);
- `aten.cross_entropy_loss` with reduction "mean" over a batch-sharded input whose output is Partial:
  the local loss is the local SUM divided by the GLOBAL count of non-ignored targets (an all-reduce of
  the count, no gradient), so that the sum over ranks is exactly the single-device mean;
- `aten.dropout`: the mask differs across shards and is the same on replicas (`sharded_dropout`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.fx

from ..core.layout import Layout, Partial, Shard, local_shape
from ..core.mesh import MeshSpec
from ..errors import UnsupportedOpError
from . import collectives

aten = torch.ops.aten
# op -> index of its size argument
_SIZE_ARG = {
    aten.view.default: 1, aten._unsafe_view.default: 1, aten.reshape.default: 1, aten.expand.default: 1,
    aten.new_zeros.default: 1, aten.new_ones.default: 1, aten.new_empty.default: 1, aten.new_full.default: 1,
    aten.zeros.default: 0, aten.ones.default: 0, aten.empty.memory_format: 0, aten.full.default: 0,
}


# op -> index of its bias argument (added once per output element)
_BIAS_ARG = {aten.linear.default: 2, aten.addmm.default: 0}


@dataclass(frozen=True)
class Context:
    """What `emit` needs to know about the node being rewritten."""

    node: torch.fx.Node
    mesh: MeshSpec
    groups: Mapping[str, list[int]]
    inputs: tuple[Layout, ...]        # layout of each tensor argument use, in map_arg order
    output: Layout
    out_shape: tuple[int, ...] | None  # global shape of the (first) output

    def input_layout(self, index: int) -> Layout:
        """Layout in which positional argument `index` (an fx node) is consumed."""
        uses: list = []
        torch.fx.node.map_arg(self.node.args[:index], uses.append)
        return self.inputs[len(uses)]


def emit(graph: torch.fx.Graph, ctx: Context, args: tuple, kwargs: dict) -> torch.fx.Node:
    """Append the local form of `ctx.node` (with already-redistributed `args`/`kwargs`) to `graph`."""
    target = ctx.node.target
    if target in _SIZE_ARG and ctx.out_shape is not None:
        i = _SIZE_ARG[target]
        args = args[:i] + (list(local_shape(ctx.out_shape, ctx.output, ctx.mesh)),) + args[i + 1:]
    elif target in _BIAS_ARG and len(args) > 2 and _partial_axes(ctx.output, ctx.mesh):
        args = _bias_once(graph, ctx, args)
    elif target is aten.embedding.default and _sharded_axes(ctx.input_layout(0), 0, ctx.mesh):
        return _vocab_parallel_embedding(graph, ctx, args, kwargs)
    elif target is aten.cross_entropy_loss.default and _partial_axes(ctx.output, ctx.mesh):
        return _sharded_cross_entropy(graph, ctx, args, kwargs)
    elif target is aten.dropout.default:
        groups = [ctx.groups[a] for a in _split_axes(ctx.output, ctx.mesh)]
        return graph.call_function(sharded_dropout, (*args, groups))
    return graph.call_function(target, args, kwargs)


def _bias_once(graph: torch.fx.Graph, ctx: Context, args: tuple) -> tuple:
    """Row-parallel linear with its bias inside: the output is Partial, so a bias Replicate on those axes
    is divided by their size (DTensor's Replicate -> Partial) and the sum over ranks adds it once."""
    i = _BIAS_ARG[ctx.node.target]
    layout = ctx.input_layout(i)
    n = 1
    for axis, (p_out, p_in) in enumerate(zip(ctx.output, layout)):
        if isinstance(p_out, Partial) and not isinstance(p_in, Partial):
            n *= ctx.mesh.shape[axis]
    if n == 1:
        return args
    bias = graph.call_function(aten.div.Scalar, (args[i], n))
    return args[:i] + (bias,) + args[i + 1:]


def _split_axes(layout: Layout, mesh: MeshSpec) -> list[str]:
    """Mesh axes (of size > 1) on which `layout` is a Shard."""
    return [mesh.axis_names[i] for i, p in enumerate(layout) if isinstance(p, Shard) and mesh.shape[i] > 1]


def sharded_dropout(x: torch.Tensor, p: float, train: bool, groups: list[list[int]]) -> torch.Tensor:
    """Dropout whose mask is the same on ranks holding the same data and different across shards.

    The seed comes from torch's default generator (which every rank advances identically, since all run
    the same program from the same seed), mixed with this rank's shard index on each axis in `groups`
    (the axes where the tensor is sharded). Replicas (and the summands of a Partial tensor) therefore
    draw the same mask, and shards independent ones. Shapes: x (...) -> (...).
    """
    if not train or p == 0.0:
        return x
    base = int(torch.randint(0, 2**62, (1,)).item())
    seed = base
    for ranks in groups:
        seed = (seed * 1_000_003 + collectives.group_index(ranks) + 1) % 2**62
    keep = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed)) >= p
    return x * keep.to(x.dtype) / (1.0 - p)


def _sharded_axes(layout: Layout, dim: int, mesh: MeshSpec) -> list[str]:
    """Mesh axes (of size > 1: on a size-1 axis every placement is a full copy) sharding tensor dim `dim`."""
    return [mesh.axis_names[i] for i, p in enumerate(layout)
            if isinstance(p, Shard) and p.dim == dim and mesh.shape[i] > 1]


def _partial_axes(layout: Layout, mesh: MeshSpec) -> list[str]:
    """Mesh axes (of size > 1) on which `layout` is Partial."""
    return [mesh.axis_names[i] for i, p in enumerate(layout) if isinstance(p, Partial) and mesh.shape[i] > 1]


def _vocab_parallel_embedding(graph: torch.fx.Graph, ctx: Context, args: tuple, kwargs: dict) -> torch.fx.Node:
    """embedding(W[V/n, C] local, ids) -> (.., C) Partial: ids outside [start, start + V/n) give zeros."""
    weight_layout = ctx.input_layout(0)
    axes = _sharded_axes(weight_layout, 0, ctx.mesh)
    if len(axes) != 1 or kwargs or any(a for a in args[3:]):  # scale_grad_by_freq / sparse
        raise UnsupportedOpError(f"vocab-parallel embedding {ctx.node.format_node()} on mesh {ctx.mesh}: "
                                 f"supported for the weight sharded on one axis, without scale_grad_by_freq "
                                 f"or sparse; got {weight_layout}. Remedy: re-plan with the embedding replicated")
    weight, ids = args[0], args[1]
    padding_idx = args[2] if len(args) > 2 else -1
    rows = local_shape(tuple(ctx.node.args[0].meta["val"].shape), weight_layout, ctx.mesh)[0]
    start = graph.call_function(shard_offset, (rows, ctx.groups[axes[0]]))
    return graph.call_function(masked_embedding, (weight, ids, start, rows, padding_idx))


def shard_offset(rows: int, ranks: list[int]) -> int:
    """First row of this rank's shard of a dim split in chunks of `rows` over the group `ranks`."""
    return collectives.group_index(ranks) * rows


def masked_embedding(weight: torch.Tensor, ids: torch.Tensor, start: int, rows: int,
                     padding_idx: int = -1) -> torch.Tensor:
    """Look up `ids` in the rows [start, start + rows) of a vocabulary held as `weight` (rows, C).

    Ids outside the range give zero vectors, so summing the ranks' outputs gives the full embedding;
    `padding_idx` (global, -1 for none) keeps its row's gradient at zero on the rank that holds it.
    Shapes: weight (rows, C), ids (...) int64 -> (..., C).
    """
    local = ids - start
    outside = (local < 0) | (local >= rows)
    local_pad = padding_idx - start if padding_idx >= 0 and 0 <= padding_idx - start < rows else None
    out = torch.nn.functional.embedding(local.masked_fill(outside, 0), weight, padding_idx=local_pad)
    return out.masked_fill(outside.unsqueeze(-1), 0.0)


def _sharded_cross_entropy(graph: torch.fx.Graph, ctx: Context, args: tuple, kwargs: dict) -> torch.fx.Node:
    params = dict(zip(("weight", "reduction", "ignore_index", "label_smoothing"), args[2:]))
    params.update(kwargs)
    if params.get("weight") is not None or params.get("label_smoothing", 0.0) or params.get("reduction", 1) != 1:
        raise UnsupportedOpError(f"{ctx.node.format_node()} on mesh {ctx.mesh} with output {ctx.output}: only "
                                 "reduction='mean' without class weights or label smoothing is supported on a "
                                 "batch-sharded input. Remedy: re-plan with the loss replicated")
    axes = _partial_axes(ctx.output, ctx.mesh)
    if len(axes) != 1:
        raise UnsupportedOpError(f"{ctx.node.format_node()} on mesh {ctx.mesh}: a loss Partial over several "
                                 f"mesh axes ({axes}) is not supported. Remedy: re-plan with the batch sharded "
                                 "over one axis")
    ranks = ctx.groups[axes[0]]
    avg = any(ctx.output[ctx.mesh.index(a)].reduce_op == "avg" for a in axes)
    return graph.call_function(batch_sharded_cross_entropy,
                               (args[0], args[1], params.get("ignore_index", -100), ranks, avg))


def batch_sharded_cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int,
                                ranks: list[int], avg: bool) -> torch.Tensor:
    """This rank's share of a mean cross-entropy over a batch sharded on the group `ranks`.

    Returns sum(local losses) / (global count of targets != ignore_index), times the group size when the
    result is consumed as Partial(avg). Shapes: logits (N_local, V), target (N_local,) -> ().
    """
    local_sum = torch.nn.functional.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum")
    count = (target != ignore_index).sum().to(logits.dtype)
    total = collectives.all_reduce(count.detach(), ranks)
    scale = len(ranks) if avg else 1
    return local_sum * scale / total
