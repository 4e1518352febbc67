"""Emit one op on local shards: localise shape arguments and handle ops whose local form differs.

Most ATen ops run unchanged on local shards once their inputs have the layouts the plan asks for. The
exceptions, each handled here (every one is executed by the rule harness, tests/rules, against the op on
global tensors):
- ops with a size argument (view, reshape, expand, new_zeros, ...): the size becomes this rank's local
  output shape (repeat: its repeats, the local output over the local input) (shards may be uneven, `core.layout`); affine_grid_generator's size [N, C, H, W] takes the
  local batch N;
- `aten.embedding` with the weight sharded on the vocabulary dim (vocab-parallel embedding, Megatron):
  each rank looks up the ids in its own vocabulary rows and reads zeros for the others (Partial output);
- `aten.mean` over a sharded dim: the local SUM divided by the GLOBAL count (exact for uneven shards);
- `aten.cross_entropy_loss` on a sharded batch (or other non-class dim): the local sum divided by the
  global denominator (count, or sum of class weights, of the targets not ignored; all-reduced, no
  gradient); on sharded classes, Megatron's vocab-parallel cross-entropy;
- `aten.nll_loss_nd` on a sharded batch: as cross-entropy's, the mean over the global denominator;
- elementwise losses (`planner.rules.losses`: mse, l1, huber, BCE, KL, ...) and per-sample losses
  (multi-margin, multilabel-margin, cosine-embedding, triplet-margin) with reduction "mean" on sharded
  inputs: the local sum divided by the GLOBAL count of loss terms (`losses.mean_count`);
- `aten.masked_scatter` on a sharded batch: the op after a check that every rank's mask selects what its
  source rows hold (`checked_masked_scatter`);
- `aten.tril` / `aten.triu` sharded along its last two dims: the diagonal shifted by the shard offsets;
- `aten.batch_norm` in training on a sharded input: synchronised statistics (SyncBatchNorm semantics);
- `aten.instance_norm` updating running statistics on a batch shard: the buffers' update from the
  all-reduced batch sums of the per-instance statistics (`sync_instance_norm`);
- every op that draws from torch's generator (`tracer.graph.draws_random`: dropout, rand_like, bernoulli,
  SDPA with dropout_p > 0, RNN dropout, ...) on a sharded output runs with the generator seeded per shard
  (`seeded_per_shard`): draws differ across shards and agree on replicas and on the summands of a Partial
  value (so dropout stays linear in it).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.fx

from ..core.layout import Layout, Shard, local_region, local_shape, view_regroups
from ..core.mesh import MeshSpec
from ..core.redistribute import sum_dtype
from ..errors import UnsupportedOpError
from ..planner.rules.losses import ELEMENTWISE_LOSSES, PER_SAMPLE_LOSSES, mean_count, reduction_index
from ..tracer.graph import draws_random
from . import collectives
from .vocab_parallel import vocab_parallel_cross_entropy

aten = torch.ops.aten
# views: emitted as a view / reshape to this rank's local output shape (their size or dims arguments describe
# the global shape; squeeze without dims would also drop a dim whose local shard holds one element); a
# sharded dim they merge or split is regrouped when its chunks are uneven (`regrouped_view`)
VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.flatten.using_ints,
          aten.unflatten.int, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims}
# op -> index of its size argument
SIZE_ARG = {
    aten.view.default: 1, aten._unsafe_view.default: 1, aten.reshape.default: 1, aten.expand.default: 1,
    aten.new_zeros.default: 1, aten.new_ones.default: 1, aten.new_empty.default: 1, aten.new_full.default: 1,
    aten.zeros.default: 0, aten.ones.default: 0, aten.empty.memory_format: 0, aten.full.default: 0,
    aten.sum_to_size.default: 1,  # the sum's output size (round 20, r20f)
}
# op -> index of a size argument whose first entry is the output's batch dim 0 (the rest describe other dims)
BATCH_SIZE_ARG = {aten.affine_grid_generator.default: 1}


@dataclass(frozen=True)
class Context:
    """What `emit` needs to know about the node being rewritten on this rank."""

    node: torch.fx.Node
    mesh: MeshSpec
    groups: Mapping[str, list[int]]
    inputs: tuple[Layout, ...]        # layout of each tensor argument use, in map_arg order
    output: Layout
    out_shape: tuple[int, ...] | None  # global shape of the (first) output
    coords: tuple[int, ...] = ()      # this rank's mesh coordinates
    in_shapes: tuple[tuple[int, ...], ...] = ()  # global shape of each tensor argument use

    def input_index(self, index: int) -> int:
        """Index among the tensor arguments of positional argument `index` (an fx node)."""
        uses: list = []
        torch.fx.node.map_arg(self.node.args[:index], uses.append)
        return len(uses)

    def input_layout(self, index: int) -> Layout:
        """Layout in which positional argument `index` (an fx node) is consumed."""
        return self.inputs[self.input_index(index)]

    def sharded_axes(self, layout: Layout, dims, shape_len: int) -> list[str]:
        """Mesh axes (of size > 1) on which `layout` shards one of `dims` (non-negative)."""
        return [self.mesh.axis_names[i] for i, p in enumerate(layout) if isinstance(p, Shard)
                and p.dim % shape_len in dims and self.mesh.shape[i] > 1]


def emit(graph: torch.fx.Graph, ctx: Context, args: tuple, kwargs: dict) -> torch.fx.Node:
    """Append the local form of `ctx.node` (with already-redistributed `args`/`kwargs`) to `graph`."""
    target = ctx.node.target
    packet = getattr(target, "overloadpacket", None)
    if target in VIEW_OPS:
        return _local_view(graph, ctx, args)
    if target in SIZE_ARG and ctx.out_shape is not None:
        i = SIZE_ARG[target]
        args = args[:i] + (list(local_shape(ctx.out_shape, ctx.output, ctx.mesh, ctx.coords)),) + args[i + 1:]
    elif target in BATCH_SIZE_ARG and ctx.out_shape is not None:
        i = BATCH_SIZE_ARG[target]
        n = local_shape(ctx.out_shape, ctx.output, ctx.mesh, ctx.coords)[0]
        args = args[:i] + ([n, *args[i][1:]],) + args[i + 1:]
    elif packet is aten.repeat and ctx.out_shape is not None:  # each dim: the local output over the local input
        local_in = local_shape(ctx.in_shapes[0], ctx.inputs[0], ctx.mesh, ctx.coords)
        local_in = (1,) * (len(ctx.out_shape) - len(local_in)) + tuple(local_in)  # repeat's new leading dims
        local_out = local_shape(ctx.out_shape, ctx.output, ctx.mesh, ctx.coords)
        args = (args[0], [o // i if i else 1 for o, i in zip(local_out, local_in)], *args[2:])
    elif packet is aten.embedding and ctx.sharded_axes(ctx.input_layout(0), {0}, 2):
        return _vocab_parallel_embedding(graph, ctx, args, kwargs)
    elif packet is aten.mean and _mean_over_shards(ctx):
        return _mean_as_sum(graph, ctx, args, kwargs)
    elif packet is aten.cross_entropy_loss and len(ctx.in_shapes[0]) >= 2:
        return _cross_entropy(graph, ctx, args, kwargs)
    elif packet is aten.nll_loss_nd and len(ctx.in_shapes[0]) >= 2 and _batch_axes(ctx):
        return graph.call_function(sharded_nll_loss, (*_full_args(ctx, args, kwargs, 5),
                                                      [ctx.groups[a] for a in _batch_axes(ctx)]))
    elif packet is aten.masked_scatter and _batch_groups(ctx):
        return graph.call_function(checked_masked_scatter, (*args, _batch_groups(ctx)))
    elif (packet in ELEMENTWISE_LOSSES or packet in PER_SAMPLE_LOSSES) and _any_sharded(ctx):
        return _loss_mean_as_sum(graph, ctx, args, kwargs)
    elif packet in (aten.tril, aten.triu):
        args = _shift_diagonal(ctx, args, kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k != "diagonal"}
    elif packet is aten.batch_norm and _bn_axes(ctx):
        return graph.call_function(sync_batch_norm, (*_full_args(ctx, args, kwargs, 8),
                                                     [ctx.groups[a] for a in _bn_axes(ctx)]))
    elif packet is aten.instance_norm and _tracking_batch_groups(ctx):
        return graph.call_function(sync_instance_norm, (*_full_args(ctx, args, kwargs, 9), ctx.in_shapes[0][0],
                                                        _tracking_batch_groups(ctx)))
    elif draws_random(ctx.node) and _shard_groups(ctx):
        return graph.call_function(seeded_per_shard, (target, _shard_groups(ctx), *args), kwargs)
    return graph.call_function(target, args, kwargs)


def _full_args(ctx: Context, args: tuple, kwargs: dict, n: int) -> tuple:
    """The first `n` arguments of the op, positional or keyword, defaults from its schema."""
    schema = ctx.node.target._schema.arguments
    out = list(args[:n])
    for a in schema[len(out):n]:
        out.append(kwargs.get(a.name, a.default_value))
    return tuple(out)


def _shard_groups(ctx: Context) -> list[list[int]]:
    """Groups of the mesh axes (size > 1) on which the output is sharded."""
    return [ctx.groups[ctx.mesh.axis_names[i]] for i, p in enumerate(ctx.output)
            if isinstance(p, Shard) and ctx.mesh.shape[i] > 1]


# --- views ------------------------------------------------------------------------------------------------

def _local_view(graph: torch.fx.Graph, ctx: Context, args: tuple) -> torch.fx.Node:
    """A view to this rank's local output shape; an unevenly sharded dim it merges (rows -> rows x k) or
    splits is re-cut to torch.chunk's split of the new dim (`collectives.rechunk`; the planner allows it only
    when one mesh axis shards that dim, `AxisOption.regroup`)."""
    out_local = list(local_shape(ctx.out_shape, ctx.output, ctx.mesh, ctx.coords))
    before, after, mid = [], [], list(out_local)
    for r in view_regroups(ctx.in_shapes[0], ctx.out_shape, ctx.inputs[0], ctx.output, ctx.mesh.shape):
        ranks, me = ctx.groups[ctx.mesh.axis_names[r.axis]], ctx.coords[r.axis]
        if r.after:
            after.append((r.dim, ranks, list(r.have), list(r.want)))
            mid[r.dim] = r.have[me]
        else:
            before.append((r.dim, ranks, list(r.have), list(r.want)))
    if not before and not after:  # a reshape, not a view: the traced view was valid on the TRACED strides (e.g.
        # permute(0, 2, 1, 3).view(...) of an attention output whose CPU kernel returned the permuted layout, where
        # `.contiguous()` was a no-op and not recorded), but this rank's input may be a collective's fresh
        # contiguous result, on which view raised (Data2VecVision, tp=2); reshape is that view wherever one exists
        return graph.call_function(aten.reshape.default, (args[0], out_local))
    return graph.call_function(regrouped_view, (args[0], mid, before, after))


def regrouped_view(x: torch.Tensor, shape: list[int], before: list, after: list) -> torch.Tensor:
    """Rechunk (`collectives.rechunk`) along each (dim, ranks, sizes, new sizes) of `before`, reshape to
    `shape`, rechunk along each of `after`. Shapes: x (local input) -> the local output shape."""
    for dim, ranks, have, want in before:
        x = collectives.rechunk(x, dim, ranks, have, want)
    x = x.reshape(shape)
    for dim, ranks, have, want in after:
        x = collectives.rechunk(x, dim, ranks, have, want)
    return x


# --- empty shards ---------------------------------------------------------------------------------------

class _EmptyShardGuard(torch.autograd.Function):
    """Identity on `out`; in backward, zero gradients for `inputs` (added to whatever else reaches them)."""

    @staticmethod
    def forward(ctx, out, fresh, *inputs):  # type: ignore[override]
        ctx.specs = [(tuple(i.shape), i.dtype, i.device, i.requires_grad) for i in inputs]
        # fresh: a copy, for a value that is later written in place (through views): autograd forbids in-place
        # writes to a view made inside a custom Function
        return out.clone() if fresh else out.view_as(out)

    @staticmethod
    def backward(ctx, grad, *_):  # type: ignore[override]
        return (grad, None,
                *[torch.zeros(s, dtype=d, device=dev) if req else None for s, d, dev, req in ctx.specs])


def empty_shard_guard(out: torch.Tensor, *inputs: torch.Tensor, fresh: bool = False) -> torch.Tensor:
    """`out` unchanged (a copy of it with `fresh`, for a value the program later writes in place), with a
    (zero) gradient path to every input.

    On a rank whose shard of an op's input or output is empty, torch's kernels may drop the gradient path to
    an input altogether (scaled_dot_product_attention on an empty batch returns no gradient for its mask),
    and autograd then skips the backward of the collectives upstream (the gradient all-reduce of a
    Replicate input, the reduce-scatter of a gathered one) on this rank only: the other ranks of the group
    would wait forever. The rewriter wraps such ops in this guard on every rank of the mesh (whether its own
    shard is empty or not), so that every rank runs the same collectives in backward. Shapes: out (...) ->
    (...)."""
    return _EmptyShardGuard.apply(out, fresh, *inputs)


# --- random ops ---------------------------------------------------------------------------------------------

def _shard_seed(groups: list[list[int]]) -> int:
    """A seed from torch's default generator (advanced identically on every rank, which all run the same
    program from the same seed) mixed with this rank's shard index on each axis in `groups`."""
    seed = int(torch.randint(0, 2**62, (1,)).item())
    for ranks in groups:
        seed = (seed * 1_000_003 + collectives.group_index(ranks) + 1) % 2**62
    return seed


def seeded_per_shard(op, groups: list[list[int]], *args, **kwargs):
    """`op(*args, **kwargs)` for an op that draws from torch's default generator internally (the
    `nondeterministic_seeded` ops: dropout, rand_like, scaled_dot_product_attention with dropout_p > 0, the
    RNNs' inter-layer dropout, bernoulli / normal / uniform / ... on shards), run with that generator seeded by
    `_shard_seed(groups)` (the output's shard axes) inside `torch.random.fork_rng`: draws differ across shards
    and agree on replicas and on the summands of a Partial value. Run as is, every shard drew the same numbers
    (SDPA's attention dropout on tp=2: heads h and h + H/2 had one mask; on ddp, samples b and b + B/2); an op
    on a replicated or Partial output draws from the default generator as is, alike on every rank. The outer stream
    advances by `_shard_seed`'s one draw on every rank alike, whatever the local shapes; recomputation
    replays it (checkpoint restores the generator first)."""
    seed = _shard_seed(groups)
    devices = sorted({a.device for a in args if isinstance(a, torch.Tensor) and a.device.type != "cpu"}, key=str)
    with torch.random.fork_rng(devices=devices):  # the CPU generator, and that of an accelerator the op runs on
        torch.manual_seed(seed)
        return op(*args, **kwargs)


# --- position-dependent ops ---------------------------------------------------------------------------------

def _shift_diagonal(ctx: Context, args: tuple, kwargs: dict) -> tuple:
    """tril/triu keep element (i, j) by j - i against `diagonal`; a shard starting at global (r0, c0) keeps
    local (i, j) by j - i against diagonal + r0 - c0."""
    shape, layout = ctx.in_shapes[0], ctx.inputs[0]
    starts, _ = local_region(shape, layout, ctx.mesh, ctx.coords)
    diagonal = args[1] if len(args) > 1 else kwargs.get("diagonal", 0)
    return (args[0], diagonal + starts[-2] - starts[-1])


# --- reductions -------------------------------------------------------------------------------------------

def _reduced_dims(ctx: Context) -> list[int]:
    nd = len(ctx.in_shapes[0])
    dims = ctx.node.args[1] if len(ctx.node.args) > 1 else ctx.node.kwargs.get("dim")
    return list(range(nd)) if not dims else [d % nd for d in dims]


def _mean_over_shards(ctx: Context) -> bool:
    return bool(ctx.sharded_axes(ctx.inputs[0], set(_reduced_dims(ctx)), len(ctx.in_shapes[0])))


def _mean_as_sum(graph: torch.fx.Graph, ctx: Context, args: tuple, kwargs: dict) -> torch.fx.Node:
    """mean over dims of which some are sharded: the local sum divided by the global element count."""
    dims = _reduced_dims(ctx)
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    count = math.prod(ctx.in_shapes[0][d] for d in dims)
    return graph.call_function(sharded_mean, (args[0], dims, keepdim, count), {"dtype": kwargs.get("dtype")})


def sharded_mean(x: torch.Tensor, dims: list[int], keepdim: bool, count: int, dtype=None) -> torch.Tensor:
    """This rank's share of a mean over `dims` some of which are sharded: the local sum over `dims` divided
    by the GLOBAL number of elements reduced, `count`; the sum over ranks is the mean (Partial(sum))."""
    return torch.sum(x, dims, keepdim=keepdim, dtype=dtype) / count


# --- embedding ---------------------------------------------------------------------------------------------

def _vocab_parallel_embedding(graph: torch.fx.Graph, ctx: Context, args: tuple, kwargs: dict) -> torch.fx.Node:
    """embedding(W[rows] local, ids) -> (.., C) Partial: ids outside this rank's rows give zeros."""
    if kwargs or any(a for a in args[3:]):  # scale_grad_by_freq / sparse
        raise UnsupportedOpError(f"vocab-parallel embedding {ctx.node.format_node()} on mesh {ctx.mesh}: "
                                 f"supported without scale_grad_by_freq or sparse; got {ctx.input_layout(0)}. Remedy: "
                                 "re-plan (the planner keeps such embeddings off the vocabulary dim)")
    starts, lengths = local_region(ctx.in_shapes[0], ctx.input_layout(0), ctx.mesh, ctx.coords)
    padding_idx = args[2] if len(args) > 2 else -1
    return graph.call_function(masked_embedding, (args[0], args[1], starts[0], lengths[0], padding_idx,
                                                  ctx.in_shapes[0][0]))


def check_indices(index: torch.Tensor, size: int, what: str, ignore: int | None = None) -> None:
    """Raise IndexError, as the op on one device does, when an entry of `index` (other than `ignore`) is
    outside [0, size): the local form of an op indexing a dim sharded over ranks (a vocabulary) looks each
    index up in this rank's slice only, so an index outside every slice would silently read zeros (an
    embedding) or drop its target term (a cross-entropy's loss becomes the log-sum-exp alone; torchtitan#4297)."""
    bad = (index < 0) | (index >= size)
    if ignore is not None:
        bad &= index != ignore
    if bool(bad.any()):
        raise IndexError(f"{what}: index {int(index[bad][0])} is out of range for a dim of size {size} (sharded "
                         "over ranks here; on one device the op raises the same way)")


def masked_embedding(weight: torch.Tensor, ids: torch.Tensor, start: int, rows: int,
                     padding_idx: int = -1, total: int | None = None) -> torch.Tensor:
    """Look up `ids` in the rows [start, start + rows) of a vocabulary held as `weight` (rows, C).

    Ids outside the range give zero vectors, so summing the ranks' outputs gives the full embedding;
    `padding_idx` (global, -1 for none) keeps its row's gradient at zero on the rank that holds it. An id
    outside the whole vocabulary of `total` rows raises IndexError as torch's embedding does (`check_indices`).
    Shapes: weight (rows, C), ids (...) int64 -> (..., C).
    """
    if total is not None:
        check_indices(ids, total, "embedding (vocab-parallel)")
    local = ids - start
    outside = (local < 0) | (local >= rows)
    local_pad = padding_idx - start if padding_idx >= 0 and 0 <= padding_idx - start < rows else None
    out = torch.nn.functional.embedding(local.masked_fill(outside, 0), weight, padding_idx=local_pad) \
        if rows else weight.new_zeros((*ids.shape, weight.shape[1]))
    return out.masked_fill(outside.unsqueeze(-1), 0.0)


# --- batch norm -------------------------------------------------------------------------------------------

def _bn_axes(ctx: Context) -> list[str]:
    """Axes over which a training batch_norm's statistics must be synchronised (the input is sharded)."""
    training = _full_args(ctx, tuple(ctx.node.args), dict(ctx.node.kwargs), 6)[5]
    nd = len(ctx.in_shapes[0])
    return ctx.sharded_axes(ctx.inputs[0], set(range(nd)) - {1}, nd) if training else []


def sync_batch_norm(x: torch.Tensor, weight, bias, running_mean, running_var, training: bool, momentum: float,
                    eps: float, groups: list[list[int]]) -> torch.Tensor:
    """Batch norm with statistics over the whole sharded input (SyncBatchNorm semantics, uneven shards).

    Per channel: the element count and sum are all-reduced over `groups` (the mesh axes sharding the
    input), then the sum of squared deviations from the global mean; the mean and biased variance
    normalise, and the running buffers are updated in place with the unbiased variance, identically on
    every rank. Statistics that are Replicate but used on local shards get partial gradients, so each is
    followed by `collectives.grad_all_reduce` (Megatron's f). Shapes: x (N, C, *) -> (N, C, *).

    A float16 / bfloat16 input is reduced and normalised in float32 (`core.redistribute.sum_dtype`, ATen's `at::opmath_type`) and the output cast back,
    as torch's batch_norm kernels do (`aten/src/ATen/native/cpu/batch_norm_kernel.cpp`, `Normalization.cuh`:
    `opmath_t` / `accscalar_t` accumulation). torch's CPU kernel also rounds the mean and 1/std it normalises
    with to the input's dtype when no parameter or buffer is float32 (its `save_mean` / `save_invstd` take
    the parameters' dtype: a model cast whole to bf16), so that case rounds them too, which equals the
    one-device output bit for bit; under autocast (float32 weights) and on CUDA they stay float32. Before,
    count, sums and variance were held in the input's dtype: in float16 a count or a sum above 65504 became
    inf (outputs inf where one device is finite), in bfloat16 a count of 2312 was 2304 (rehearse: 102x the
    bound) and under autocast the statistics were rounded where one device keeps them float32.

    The running buffers are written through `.data`, so their version counters stay as they were: torch's
    batch_norm kernel updates them in place without a version bump, and its autograd node saves them (for
    eval-mode backward), so a module applied twice per forward (SwAV / SimCLR's encoder on two views) whose
    first call ran as aten.batch_norm (on an input no plan batch-shards) and second as this function raised
    "one of the variables needed for gradient computation has been modified by an inplace operation" on
    every rank in backward (round 13, r13b), where one device runs.
    """
    dims = [0] + list(range(2, x.dim()))
    view = [1, -1] + [1] * (x.dim() - 2)
    acc = sum_dtype(x.dtype)
    xa = x.to(acc)
    count = torch.tensor(float(x.numel() // max(x.shape[1], 1)), dtype=acc)

    def total(t: torch.Tensor) -> torch.Tensor:
        for ranks in groups:
            t = collectives.all_reduce(t, ranks)
        for ranks in groups:
            t = collectives.grad_all_reduce(t, ranks)
        return t

    n = total(count.detach())
    mean = total(xa.sum(dims)) / n
    centered = xa - mean.view(view)
    var = total((centered * centered).sum(dims)) / n
    invstd = torch.rsqrt(var + eps)
    if acc != x.dtype and x.device.type == "cpu" and not any(
            t is not None and t.dtype == torch.float32 for t in (weight, bias, running_mean, running_var)):
        centered = xa - mean.to(x.dtype).to(acc).view(view)  # torch's CPU kernel: statistics in the params' dtype
        invstd = invstd.to(x.dtype).to(acc)
    out = centered * invstd.view(view)
    if weight is not None:
        out = out * weight.to(acc).view(view)
    if bias is not None:
        out = out + bias.to(acc).view(view)
    if running_mean is not None:
        with torch.no_grad():  # `.data`: written as torch's kernel writes them, without bumping their versions
            running_mean.data.mul_(1 - momentum).add_(mean.detach() * momentum)
            running_var.data.mul_(1 - momentum).add_(var.detach() * (n / (n - 1).clamp(min=1)) * momentum)
    return out.to(x.dtype)


def _tracking_batch_groups(ctx: Context) -> list[list[int]]:
    """Groups of the axes sharding the batch of an instance_norm that updates running statistics ([] if none)."""
    full = _full_args(ctx, tuple(ctx.node.args), dict(ctx.node.kwargs), 6)
    return _batch_groups(ctx) if full[5] and full[3] is not None else []


def sync_instance_norm(x: torch.Tensor, weight, bias, running_mean: torch.Tensor, running_var: torch.Tensor,
                       use_input_stats: bool, momentum: float, eps: float, cudnn_enabled: bool, batch: int,
                       groups: list[list[int]]) -> torch.Tensor:
    """instance_norm on a batch shard x (N_local, C, *) that updates running statistics (C,) as one device
    does over the whole batch of `batch` samples: the output uses each instance's own statistics (no
    communication); torch updates the buffers with the per-instance means and unbiased variances averaged
    over the batch, running <- (1 - momentum) running + momentum * mean over N, so the local sums over
    instances are all-reduced over `groups` (the mesh axes sharding the batch) and divided by the global N;
    every rank writes the same buffers."""
    out = torch.ops.aten.instance_norm.default(x, weight, bias, None, None, True, momentum, eps, cudnn_enabled)
    with torch.no_grad():
        dims = list(range(2, x.dim()))
        xa = x.to(sum_dtype(x.dtype))  # (float32 statistics of a 16-bit input, as `sync_batch_norm`)
        stats = torch.stack([xa.mean(dims).sum(0), xa.var(dims, correction=1).sum(0)])  # (2, C): local sums over N
        for ranks in groups:
            stats = collectives.all_reduce(stats, ranks)
        running_mean.mul_(1 - momentum).add_(stats[0] / batch * momentum)
        running_var.mul_(1 - momentum).add_(stats[1] / batch * momentum)
    return out


# --- cross-entropy ---------------------------------------------------------------------------------------

def _cross_entropy(graph: torch.fx.Graph, ctx: Context, args: tuple, kwargs: dict) -> torch.fx.Node:
    """Route a cross_entropy_loss to its local form (module docstring)."""
    full = _full_args(ctx, args, kwargs, 6)
    nd = len(ctx.in_shapes[0])
    class_axes = ctx.sharded_axes(ctx.inputs[0], {1}, nd)
    batch_axes = _batch_axes(ctx)
    if not class_axes and (not batch_axes or full[3] == 0):
        return graph.call_function(ctx.node.target, args, kwargs)
    starts, _ = local_region(ctx.in_shapes[0], ctx.inputs[0], ctx.mesh, ctx.coords)
    return graph.call_function(sharded_cross_entropy, (*full, [ctx.groups[a] for a in batch_axes],
                                                       [ctx.groups[a] for a in class_axes], starts[1],
                                                       ctx.in_shapes[0][1]))


def sharded_cross_entropy(logits: torch.Tensor, target: torch.Tensor, weight, reduction: int, ignore_index: int,
                          label_smoothing: float, batch_groups: list[list[int]], class_groups: list[list[int]],
                          class_start: int, classes: int | None = None) -> torch.Tensor:
    """Cross-entropy of local shards: rows (and trailing dims) split over `batch_groups`, classes (dim 1)
    over `class_groups` starting at global class `class_start`.

    reduction 0 ("none") returns the local per-element losses; 2 ("sum") the local sum (a Partial over
    the batch groups); 1 ("mean") the local sum over the GLOBAL denominator: the count of targets that are
    not `ignore_index`, or the sum of their class weights, or for probability targets the number of rows
    (torch.nn.functional.cross_entropy's definitions), all-reduced without gradient. With sharded classes
    (class-index targets, no weight or label smoothing; Megatron's vocab-parallel cross-entropy, Shoeybi
    et al. 2019, Sec. 3): the row max (all-reduce max), the sum of exponentials and the target logit
    (all-reduce sum) are combined over the class groups, and the loss is Replicate there
    (`vocab_parallel.vocab_parallel_cross_entropy`: one autograd node saving the local softmax alone).
    `classes` (the global class count): a target outside [0, classes) other than `ignore_index` raises
    IndexError, as on one device (`check_indices`).
    Shapes: logits (N, C_local, *) , target (N, *) class ids or (N, C, *) probabilities -> per reduction.
    """
    names = {0: "none", 1: "mean", 2: "sum"}
    if not class_groups:
        loss = torch.nn.functional.cross_entropy(logits, target, weight, ignore_index=ignore_index,
                                                 reduction="none" if reduction == 0 else "sum",
                                                 label_smoothing=label_smoothing)
    else:
        if weight is not None or label_smoothing or target.is_floating_point():
            raise UnsupportedOpError("vocab-parallel cross-entropy supports class-index targets without class "
                                     "weights or label smoothing; re-plan (the planner does not choose it otherwise)")
        if classes is not None:  # a target in no rank's class slice: one device raises, not a log-sum-exp loss
            check_indices(target, classes, "cross_entropy (vocab-parallel) target", ignore_index)
        loss = vocab_parallel_cross_entropy(logits, target, ignore_index, class_groups, class_start)
        if reduction == 2 or reduction == 1:  # float16 / bfloat16: summed and divided in float32, rounded once,
            loss = loss.sum(dtype=sum_dtype(loss.dtype))  # as one device's nll_loss (its accumulate type)
    if names[reduction] != "mean":
        return loss.to(logits.dtype)
    return (loss / _mean_denominator(target, weight, ignore_index, batch_groups, sum_dtype(logits.dtype))
            ).to(logits.dtype)


def _mean_denominator(target: torch.Tensor, weight, ignore_index: int, batch_groups: list[list[int]],
                      dtype: torch.dtype) -> torch.Tensor:
    """The denominator of a cross-entropy / NLL "mean" over the whole sharded batch: the number of rows of
    probability targets, else the count (or the class-weight sum) of the targets that are not
    `ignore_index`; all-reduced over `batch_groups` without gradient."""
    if target.is_floating_point():
        local = torch.tensor(float(target.numel() // max(target.shape[1], 1)), dtype=dtype)
    else:
        valid = target != ignore_index
        local = (weight[target[valid]].sum() if weight is not None else valid.sum()).to(dtype)
    for ranks in batch_groups:
        local = collectives.all_reduce(local.detach(), ranks)
    return local


def _batch_axes(ctx: Context) -> list[str]:
    """Mesh axes sharding a loss input's non-class dims (every dim but 1)."""
    nd = len(ctx.in_shapes[0])
    return ctx.sharded_axes(ctx.inputs[0], set(range(nd)) - {1}, nd)


def sharded_nll_loss(logp: torch.Tensor, target: torch.Tensor, weight, reduction: int, ignore_index: int,
                     batch_groups: list[list[int]]) -> torch.Tensor:
    """nll_loss of a batch shard (log-probabilities (N_local, C, *), target (N_local, *)): "none" the local
    losses, "sum" the local sum (Partial), "mean" the local sum over the GLOBAL denominator
    (`_mean_denominator`, torch.nn.functional.nll_loss's definition)."""
    if reduction != 1:
        return torch.nn.functional.nll_loss(logp, target, weight, ignore_index=ignore_index,
                                            reduction="none" if reduction == 0 else "sum")
    # the local sum and the count in `sum_dtype` (float32 for float16 / bfloat16), divided, then rounded once, as
    # one device's kernel and `sharded_cross_entropy`: in float16 a local sum or a count past 65504 was inf (the
    # mean inf or NaN where one device's is finite) and a count past 2048 rounded (round 25)
    wide = sum_dtype(logp.dtype)
    loss = torch.nn.functional.nll_loss(logp, target, weight, ignore_index=ignore_index, reduction="none")
    return (loss.sum(dtype=wide) / _mean_denominator(target, weight, ignore_index, batch_groups, wide)).to(logp.dtype)


# --- masked_scatter ---------------------------------------------------------------------------------------

def _batch_groups(ctx: Context) -> list[list[int]]:
    """Groups of the mesh axes sharding dim 0 (the batch) of the op's first input."""
    return [ctx.groups[a] for a in ctx.sharded_axes(ctx.inputs[0], {0}, len(ctx.in_shapes[0]))]


MASK_CHECK_DTYPE = torch.float32
"""The dtype of `checked_masked_scatter`'s mismatch flag, all-reduced once per batch axis (`planner.op_comm` prices
one element of it)."""


def checked_masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor,
                           batch_groups: list[list[int]]) -> torch.Tensor:
    """masked_scatter on a batch shard (x, mask (B_local, ...), source (M_local, ...); `planner.rules.shape_ops
    .masked_scatter`): right only when this rank's mask selects exactly as many elements as its source rows
    hold, on every rank (then each rank's positions are the global ones its source rows fill). Checked here,
    the mismatch flags summed over `batch_groups` so every rank raises together.

    Raises:
        UnsupportedOpError: some rank's samples select another number of elements than their source rows
            hold (e.g. samples with different numbers of image tokens); names both counts and the remedy.
    """
    count = mask.sum()
    bad = (count != source.numel()).to(MASK_CHECK_DTYPE).reshape(1)
    for ranks in batch_groups:
        bad = collectives.all_reduce(bad.detach(), ranks)
    if bool(bad.item()):
        raise UnsupportedOpError(
            f"masked_scatter on a batch shard: this rank's mask selects {int(count)} elements and its source rows hold "
            f"{source.numel()} (mismatched on {int(bad.item())} rank(s)): the samples do not each select what their "
            "share of the source holds (e.g. different numbers of image tokens per sample), so the rows would land "
            "in other samples. Remedy: equal counts per sample, or plan with axis_roles that keep this op off "
            "the batch (re-plan with the batch gathered here)")
    return torch.ops.aten.masked_scatter.default(x, mask, source)


# --- elementwise losses ----------------------------------------------------------------------------------

def _any_sharded(ctx: Context) -> bool:
    return any(ctx.sharded_axes(layout, set(range(len(shape))), len(shape))
               for layout, shape in zip(ctx.inputs, ctx.in_shapes))


def _loss_mean_as_sum(graph: torch.fx.Graph, ctx: Context, args: tuple, kwargs: dict) -> torch.fx.Node:
    """An elementwise or per-sample loss on sharded inputs: with reduction "mean" its local sum over the
    global count; a per-sample loss in any reduction through `sharded_loss_mean`, which gives an empty batch
    shard its value (torch's margin-loss kernels return nan for the sum of no samples)."""
    i = reduction_index(ctx.node.target)
    full = list(_full_args(ctx, args, kwargs, i + 1))
    per_sample = getattr(ctx.node.target, "overloadpacket", None) in PER_SAMPLE_LOSSES
    if full[i] != 1 and not per_sample:
        return graph.call_function(ctx.node.target, args, kwargs)
    count = mean_count(getattr(ctx.node.target, "overloadpacket", None), ctx.in_shapes) if full[i] == 1 else 1
    full[i] = 0 if full[i] == 0 else 2
    rest = list(args[i + 1:])
    placed = {a.name for a in ctx.node.target._schema.arguments[:i + 1]}
    return graph.call_function(sharded_loss_mean, (ctx.node.target, count, *full, *rest),
                               {k: v for k, v in kwargs.items() if k not in placed})


def sharded_loss_mean(op, count: int, *args, **kwargs) -> torch.Tensor:
    """This rank's share of a loss's sum (count 1) or mean: `op(*args, **kwargs)` with reduction "sum" (set by
    the caller) divided by the GLOBAL number of loss terms `count`; the sum over ranks is the mean
    (Partial(sum)). On an empty batch shard (a per-sample loss over fewer samples than ranks) the local sum is
    0 (and reduction "none" the empty vector), connected to the input for autograd."""
    x = args[0]
    if x.dim() >= 2 and x.shape[0] == 0 and op.overloadpacket in PER_SAMPLE_LOSSES:
        empty = x.sum(-1) * 0.0
        i = reduction_index(op)
        return empty if args[i] == 0 else empty.sum()
    return op(*args, **kwargs) / count
