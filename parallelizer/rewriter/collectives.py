"""Autograd-aware collectives of the sharded program, one function per redistribution step.

Every function acts on the LOCAL tensor of the calling rank over one group of ranks (the ranks along one
mesh axis), and has an explicit conjugate in backward (DESIGN.md rule 3). The group is given as a list of
global ranks, sorted ascending, e.g. `[0, 1]`, or as a process-group name string; both are plain values,
so a call prints readably in `print(gm.code)` of a torch.fx GraphModule and survives codegen/recompile:

    all_gather = parallelizer_rewriter_collectives_all_gather(x, 0, [0, 1])

The functions are registered with `torch.fx.wrap`, so `torch.fx.symbolic_trace` records them as
call_function nodes instead of tracing into them.

Semantics of gradients (this decides each backward). The program is SPMD: every rank runs it on its
local tensors, and the loss is the SUM of the ranks' local losses over the ranks that hold different data,
while ranks that hold the same replicated data run the same computation (counted once). Then:
- the gradient of a `Replicate` tensor is FULL and identical on every rank that computed it;
- the gradient of a `Shard(dim)` tensor is this rank's shard of the full gradient;
- the gradient of a `Partial` tensor (the value is the sum of the ranks' local tensors) is the FULL
  gradient of the sum, on every rank.

| function          | layout change          | forward                | backward                  |
|-------------------|------------------------|------------------------|---------------------------|
| `all_gather`      | Shard(dim) -> R        | all-gather             | local slice               |
| `all_gather_rs`   | Shard(dim) -> R*       | all-gather             | reduce-scatter (sum)      |
| `reduce_scatter`  | Partial -> Shard(dim)  | reduce-scatter (sum)   | all-gather                |
| `all_reduce`      | Partial -> R           | all-reduce (sum)       | identity (Megatron's g)   |
| `grad_all_reduce` | R -> R*                | identity               | all-reduce (sum) (Megatron's f) |
| `all_to_all`      | Shard(src) -> Shard(dst) | all-to-all           | all-to-all (dst -> src)   |
| `local_slice`     | R -> Shard(dim)        | local chunk, no comm   | all-gather                |

R* marks a replicated value that ranks then use on DIFFERENT data (batch shards), so each rank's gradient
is a partial contribution: the ZeRO-3/FSDP parameter all-gather (`all_gather_rs`) and the DDP gradient
sync of a replicated parameter (`grad_all_reduce`).

Communication uses the functional collectives of `torch.distributed._functional_collectives`, waited on
at once; a dtype gloo's kernels lack (complex, int16, unsigned, float8) travels as one they take (`_carried`). With a `hierarchy` rule (the plan's, `rewriter.hierarchical`), all-reduce, all-gather and
reduce-scatter over a group spanning nodes run two-level on sub-groups when the rule says so for their bytes;
every function that takes `hierarchy` passes it to each collective it runs, forward and backward.
The functional collectives' own autograd is not used: a functional all-reduce differentiates to an all-reduce
SUM, which would multiply the gradients of a replicated loss by the group size.

Private torch API: `find_group` reads torch.distributed's table of process groups
(`distributed_c10d._find_pg_by_ranks_and_tag`, `_resolve_process_group`); checked on torch 2.13.0.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial, wraps
from typing import Union

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.fx

from parallelizer.core.layout import chunk_range
from parallelizer.core.redistribute import NARROW_FLOATS, SUMMED_AS_IS, sum_dtype
from parallelizer.runtime.launch import DistributedError

from . import hierarchical
from .hierarchical import Hierarchy, Levels, uses_hierarchy

__all__ = [
    "Group", "all_gather", "all_gather_rs", "reduce_scatter", "all_reduce", "all_reduce_max", "grad_all_reduce",
    "all_to_all", "local_slice", "rechunk", "find_group", "group_index",
]

Group = Union[Sequence[int], str]
"""A group of ranks: global ranks sorted ascending (e.g. [0, 2]) or a process-group name."""


# ------------------------------------------------------------------------------- group resolution


@dataclass(frozen=True, slots=True)
class _GroupView:
    """A resolved group as seen by the calling rank: group name, member ranks, the caller's index; for a group
    with a hierarchical rule (`rewriter.hierarchical`) also the rule and the caller's sub-groups."""

    name: str
    ranks: tuple[int, ...]
    index: int
    hierarchy: Hierarchy | None = None
    levels: Levels | None = None

    def two_level(self, kind: str, nbytes: int) -> bool:
        """Whether a `kind` collective of `nbytes` (nccl-tests convention) runs two-level on this group."""
        return self.levels is not None and uses_hierarchy(self.hierarchy, kind, nbytes)

    @property
    def size(self) -> int:
        return len(self.ranks)


def find_group(ranks: Sequence[int]) -> dist.ProcessGroup | None:
    """The process group whose members are exactly `ranks` (global ranks), or None if none exists.

    Sub-groups must have been created on every rank beforehand (`parallelizer.runtime.create_groups`,
    `torch.distributed.new_group` or a DeviceMesh); the whole world is the default group.
    """
    return dist.distributed_c10d._find_pg_by_ranks_and_tag("", list(ranks))


def _resolve(group: Group, op: str, hierarchy: Hierarchy | None = None) -> _GroupView:
    """Check `group`, find its process group, and locate the calling rank in it; with a `hierarchy` rule also
    find the caller's intra- and inter-node sub-groups (`rewriter.hierarchical`; none for a group that lies in
    one node or has one member per node: it runs flat).

    Raises:
        DistributedError: torch.distributed is not initialised, or no process group has these ranks (or, with
            `hierarchy`, no sub-group with the ranks it needs).
        ValueError: ranks are not distinct ints sorted ascending, or the calling rank is not a member.
    """
    if not dist.is_initialized():
        raise DistributedError(
            f"{op}: torch.distributed is not initialised. Remedy: run under parallelizer.runtime.spawn or "
            "torchrun with parallelizer.runtime.init_from_env()."
        )
    me = dist.get_rank()
    if isinstance(group, str):
        try:
            pg = dist.distributed_c10d._resolve_process_group(group)
        except RuntimeError:
            raise DistributedError(
                f"{op}: no process group named {group!r} exists on rank {me}. Remedy: pass the name of a group "
                "this rank belongs to (ProcessGroup.group_name), or a list of ranks."
            ) from None
        ranks = tuple(dist.get_process_group_ranks(pg))
        name = group
    else:
        ranks = tuple(group)
        if not ranks or not all(isinstance(r, int) for r in ranks) or list(ranks) != sorted(set(ranks)):
            raise ValueError(
                f"{op}: group {list(ranks)} must be a non-empty list of distinct global ranks sorted ascending "
                "(torch.distributed orders a group's members that way)"
            )
        pg = None
    if me not in ranks:
        raise ValueError(f"{op}: rank {me} is not in group {list(ranks)}; call it only on the group's members")
    if pg is None and len(ranks) == 1:  # a group of one (a size-1 mesh axis): every collective is the identity
        return _GroupView(name="", ranks=ranks, index=0)
    if pg is None:
        pg = find_group(ranks)
        if pg is None:
            raise DistributedError(
                f"{op}: no process group with ranks {list(ranks)} exists on rank {me}. Remedy: create it on "
                "every rank first with parallelizer.runtime.create_groups([...]) (or torch.distributed.new_group)."
            )
        name = pg.group_name
    return _GroupView(name=name, ranks=ranks, index=ranks.index(me), hierarchy=hierarchy,
                      levels=_levels(ranks, me, hierarchy, op))


def _levels(ranks: tuple[int, ...], me: int, hierarchy: Hierarchy | None, op: str) -> Levels | None:
    """The caller's sub-groups of a hierarchical group (`rewriter.hierarchical.split_group`), or None."""
    if hierarchy is None:
        return None
    intra, inter = hierarchical.split_group(ranks, hierarchy[0])
    if not intra:
        return None
    mine = [next(s for s in subs if me in s) for subs in (intra, inter)]
    pgs = [find_group(s) for s in mine]
    if None in pgs:
        raise DistributedError(
            f"{op}: group {list(ranks)} runs hierarchical collectives but the sub-group {mine[pgs.index(None)]} "
            f"does not exist on rank {me}. Remedy: create the sub-groups on every rank first with "
            "parallelizer.runtime.create_groups(parallelizer.rewriter.spec.hierarchical_sub_groups(spec)).")
    return Levels(pgs[0], pgs[1], len(intra[0]), len(inter[0]), mine[0].index(me), mine[1].index(me))


def group_index(group: Group) -> int:
    """Index of the calling rank in `group` (0 .. size-1): which chunk of a sharded tensor it holds."""
    return _resolve(group, "group_index").index


# ---------------------------------------------------------------------------------- shape helpers


def _norm_dim(x: torch.Tensor, dim: int, op: str) -> int:
    """`dim` in [0, x.dim()); raises ValueError naming the op and shape when out of range."""
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"{op}: dim {dim!r} is out of range for local shape {tuple(x.shape)}")
    return dim % x.dim()


def _sizes(full: int, g: _GroupView) -> list[int]:
    """Chunk lengths of a dim of `full` elements over the group, torch.chunk style (`core.layout.chunk_range`)."""
    return [chunk_range(full, g.size, i)[1] for i in range(g.size)]


def _pad_to(x: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """`x` padded with zeros at the end of `dim` up to `length` (x itself when already that long)."""
    if x.shape[dim] == length:
        return x
    pad = list(x.shape)
    pad[dim] = length - x.shape[dim]
    return torch.cat([x, x.new_zeros(pad)], dim=dim)


def _chunk(x: torch.Tensor, dim: int, g: _GroupView) -> torch.Tensor:
    """This rank's chunk of `x` along `dim` (torch.chunk's split, possibly shorter or empty), in a storage of
    its own: a chunk along dim 0 of a contiguous tensor is already contiguous, and an op saving it for backward
    would keep the whole of `x` alive (twice the bytes priced for the chunk on 2 ranks; round 14, r14d)."""
    if g.size == 1:
        return x
    start, length = chunk_range(x.shape[dim], g.size, g.index)
    return x.narrow(dim, start, length).clone(memory_format=torch.contiguous_format)


# ------------------------------------------------------------------------------ communication steps
# Plain (non-autograd) steps; the autograd.Functions below pair them up as forward and backward. Uneven
# chunks are padded to the largest chunk for the collective and trimmed after it: with torch.chunk's
# split only trailing chunks are short, so the real data of a padded all-gather is its first `full` rows.


def _wait(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor of a functional collective's result, waited on."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


# dtypes gloo's kernels take (ProcessGroupGloo's GENERATE_ALL_TYPES, torch 2.13.0); any other raised a bare
# "Invalid scalar type" on every rank from a functional collective
_CARRIED = SUMMED_AS_IS | NARROW_FLOATS
_SAME_SIZE = {1: torch.uint8, 2: torch.float16, 4: torch.int32, 8: torch.int64}  # bit views for moves


def carried_view(x: torch.Tensor) -> torch.Tensor:
    """`x` as a tensor of a dtype gloo's kernels take, over the same bytes (a view: receiving into it fills `x`):
    complex as its real view ((re, im) pairs in a new last dim of 2), int16 / uint16-64 / float8 as a same-size
    bit view; other dtypes unchanged. For moves only (a sum of bit views is not the sum of the values:
    `_carried(sums=True)` widens instead). Used by every point-to-point and broadcast outside this module
    (checkpoint export, a pipeline's full state dict, BitPipe's transfers), where gloo raised "Invalid scalar
    type" for these dtypes."""
    if x.dtype in _CARRIED:
        return x
    if x.is_complex():
        return torch.view_as_real(x.resolve_conj())
    return x.view(_SAME_SIZE[x.element_size()])


def _carried(sums: bool):
    """Run a communication step (first argument: the local tensor; dims >= 0) on a dtype the backend carries.

    A complex tensor moves and sums as its real view ((re, im) pairs in a new last dim of 2; parts add apart,
    as `torch.distributed.all_reduce` itself reduces complex tensors): an FFT convolution's spectrum or a
    complex rotary's queries redistributed raised "Invalid scalar type" before (round 12, S4D on tp=2). Other
    dtypes gloo lacks (int16, uint16/32/64, float8) move as a bit view of the same size (exact) and, for a
    step that sums (`sums`), add in a wider dtype (int64, float32) cast back (integers wrap as in their own
    dtype; a float8 sum is rounded once). A float16 / bfloat16 sum runs in float32 too and is rounded once
    (`core.redistribute.sum_dtype`, priced at 4 B per element): summed in its own dtype it rounded after every
    member's addition and a float16 partial sum beyond 65504 became inf where one device's float32 accumulation
    is finite (round 24, r24b; torch's DDP and FSDP sum them in their own dtype unless a reduce dtype is set)."""
    def wrap(step):
        @wraps(step)
        def run(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            if sums and sum_dtype(x.dtype) != x.dtype:  # the one rule, priced by `core.redistribute.sum_itemsize`
                return run(x.to(sum_dtype(x.dtype)), *args, **kwargs).to(x.dtype)  # complex32: as complex64
            if x.dtype in _CARRIED:
                return step(x, *args, **kwargs)
            if x.is_complex():
                return torch.view_as_complex(step(carried_view(x.contiguous()), *args, **kwargs).contiguous())
            return step(carried_view(x.contiguous()), *args, **kwargs).view(x.dtype)
        return run
    return wrap


@_carried(sums=False)
def _gather(x: torch.Tensor, dim: int, g: _GroupView, full: int | None = None) -> torch.Tensor:
    """All-gather along `dim`: this rank's chunk -> the `full` elements (default: local size x group size)."""
    if g.size == 1:
        return x
    full = x.shape[dim] * g.size if full is None else full
    step = max(_sizes(full, g))
    if x.shape[dim] != _sizes(full, g)[g.index]:
        raise ValueError(f"all_gather: local shape {tuple(x.shape)} holds {x.shape[dim]} elements of dim {dim}, but "
                         f"chunk {g.index} of {full} over group {list(g.ranks)} has {_sizes(full, g)[g.index]}")
    padded = _pad_to(x, dim, step).contiguous()
    if g.two_level("all_gather", padded.numel() * padded.element_size() * g.size):
        out = hierarchical.all_gather(padded, dim, g.levels)
    else:
        out = _wait(funcol.all_gather_single(padded, dim, g.name))
    # contiguous like the single-device tensor it stands for: a trimmed view (uneven chunks along a dim > 0) or
    # a moved dim (two-level) has other strides, which `view` rejects and `as_strided` silently misreads
    return (out.narrow(dim, 0, full) if step * g.size != full else out).contiguous()


@_carried(sums=True)
def _reduce_scatter(x: torch.Tensor, dim: int, g: _GroupView) -> torch.Tensor:
    """Sum over the group, keep this rank's chunk along `dim`: (.., S, ..) -> (.., chunk of S, ..)."""
    if g.size == 1:
        return x
    full = x.shape[dim]
    step = max(_sizes(full, g))
    padded = _pad_to(x, dim, step * g.size).contiguous()
    if g.two_level("reduce_scatter", padded.numel() * padded.element_size()):
        out = hierarchical.reduce_scatter(padded, dim, g.levels)
    else:
        out = _wait(funcol.reduce_scatter_single(padded, "sum", dim, g.name))
    return out.narrow(dim, 0, _sizes(full, g)[g.index]).contiguous()  # as `_gather`'s result


@_carried(sums=True)
def _sum(x: torch.Tensor, g: _GroupView) -> torch.Tensor:
    """All-reduce (sum) over the group; shape unchanged."""
    if g.size == 1:
        return x
    if g.two_level("all_reduce", x.numel() * x.element_size()):
        flat = x.detach().reshape(-1).clone()
        return hierarchical.HierarchicalAllReduce(flat, g.levels).wait().view(x.shape)
    return _wait(funcol.all_reduce(x.contiguous(), "sum", g.name))


def _swap(send: list[torch.Tensor], shapes: list[list[int]], dim: int, g: _GroupView) -> torch.Tensor:
    """All-to-all of uneven pieces: `send[j]` goes to member j; the piece from member j has shape `shapes[j]`;
    the received pieces are concatenated along `dim` in group order."""
    flat = torch.cat([p.reshape(-1) for p in send])
    received = _wait(funcol.all_to_all_single(flat, [math.prod(s) for s in shapes], [p.numel() for p in send],
                                              g.name))
    pieces = received.split([math.prod(s) for s in shapes])
    return torch.cat([p.view(s) for p, s in zip(pieces, shapes)], dim=dim)


@_carried(sums=False)
def _exchange(x: torch.Tensor, src_dim: int, dst_dim: int, g: _GroupView, src_full: int) -> torch.Tensor:
    """All-to-all: shard of a tensor split on `src_dim` -> shard of the same tensor split on `dst_dim`.

    Local shapes: `src_dim` chunk of `src_full` -> `src_full`, `dst_dim` D -> chunk of D (uneven chunks
    allowed). Chunk j (along dst_dim) goes to the j-th member; the pieces received are concatenated along
    src_dim in group order.
    """
    if g.size == 1:
        return x
    send = [x.narrow(dst_dim, *chunk_range(x.shape[dst_dim], g.size, j)) for j in range(g.size)]
    mine = chunk_range(x.shape[dst_dim], g.size, g.index)[1]
    shapes = []
    for rows in _sizes(src_full, g):
        shape = list(x.shape)
        shape[src_dim], shape[dst_dim] = rows, mine
        shapes.append(shape)
    return _swap(send, shapes, src_dim, g)


@_carried(sums=False)
def _move_rows(x: torch.Tensor, dim: int, g: _GroupView, src: Sequence[int], dst: Sequence[int]) -> torch.Tensor:
    """Re-cut a dim split over the group in consecutive blocks of `src` elements (member j holds the j-th
    block) into blocks of `dst` elements: each member sends the overlap of its block with every member's new
    block (all-to-all with uneven splits; usually a few rows between neighbours)."""
    if g.size == 1 or list(src) == list(dst):
        return x
    s0 = [sum(src[:j]) for j in range(g.size)]
    d0 = [sum(dst[:j]) for j in range(g.size)]

    def overlap(j_src: int, j_dst: int) -> tuple[int, int]:
        """(offset inside j_src's block, length) of the rows j_src sends to j_dst."""
        lo, hi = max(s0[j_src], d0[j_dst]), min(s0[j_src] + src[j_src], d0[j_dst] + dst[j_dst])
        return (lo - s0[j_src], hi - lo) if hi > lo else (0, 0)

    me = g.index
    send = [x.narrow(dim, *overlap(me, j)) for j in range(g.size)]
    shapes = [[overlap(j, me)[1] if k == dim else n for k, n in enumerate(x.shape)] for j in range(g.size)]
    return _swap(send, shapes, dim, g)


# ------------------------------------------------------------------------------ autograd functions


class _Conjugate(torch.autograd.Function):
    """One collective step: `forward(x)` in forward, its conjugate `backward(grad)` in backward (the pairs
    are in the module docstring's table). Both are plain functions of one tensor (partials of the steps
    above), so each public function below is one line naming its pair."""

    @staticmethod
    def forward(ctx, x, forward, backward):  # type: ignore[override]
        ctx.step, ctx.conjugate = forward, backward
        return forward(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph (double backward): the conjugate is itself a step whose
            # backward is the forward step (the pairs are adjoint), so second derivatives cross the ranks
            # too; the collectives run outside autograd, which would take them for constants
            return _Conjugate.apply(grad, ctx.conjugate, ctx.step), None, None
        return ctx.conjugate(grad), None, None


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x.view_as(x)


# ------------------------------------------------------------------------------------- public API


def all_gather(x: torch.Tensor, dim: int, ranks: Group, size: int | None = None,
              hierarchy: Hierarchy | None = None) -> torch.Tensor:
    """Shard(dim) -> Replicate. Backward: this rank's slice of the (full, identical) gradient.

    Use it when every rank then runs the same replicated computation on the gathered tensor, so the
    gradient arriving at the output is the full gradient on each rank.

    Local shapes: (.., chunk of `size`, ..) -> (.., size, ..) along `dim`; chunks as torch.chunk splits
    `size` over n = len(ranks) members, in group order (uneven and empty chunks allowed). `size` defaults to
    the local length times n (even chunks).

    Raises:
        ValueError: dim out of range; this rank's length is not its chunk of `size`; ranks not
            sorted/distinct; calling rank not in `ranks`.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    g = _resolve(ranks, "all_gather", hierarchy)
    dim = _norm_dim(x, dim, "all_gather")
    return _Conjugate.apply(x, partial(_gather, dim=dim, g=g, full=size), partial(_chunk, dim=dim, g=g))


def all_gather_rs(x: torch.Tensor, dim: int, ranks: Group, size: int | None = None,
              hierarchy: Hierarchy | None = None) -> torch.Tensor:
    """Shard(dim) -> Replicate, for ZeRO-3/FSDP parameters. Backward: reduce-scatter (sum) of the gradient.

    Use it when ranks then use the gathered tensor on DIFFERENT data (e.g. batch shards), so each rank's
    gradient of the output is a partial contribution: the sum over ranks is the full gradient, and each
    rank keeps its shard of that sum.

    Local shapes: (.., chunk of `size`, ..) -> (.., size, ..) along `dim` (as `all_gather`); backward
    (.., size, ..) -> (.., chunk of size, ..).

    Raises:
        ValueError: dim out of range; this rank's length is not its chunk of `size`; bad or foreign `ranks`.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    g = _resolve(ranks, "all_gather_rs", hierarchy)
    dim = _norm_dim(x, dim, "all_gather_rs")
    return _Conjugate.apply(x, partial(_gather, dim=dim, g=g, full=size), partial(_reduce_scatter, dim=dim, g=g))


def reduce_scatter(x: torch.Tensor, dim: int, ranks: Group, hierarchy: Hierarchy | None = None) -> torch.Tensor:
    """Partial(sum) -> Shard(dim): sum the ranks' tensors, keep this rank's chunk along `dim`.

    Backward: all-gather of the gradient along `dim` (the gradient of a Partial input is the full one).

    Local shapes: (.., S, ..) -> (.., chunk of S, ..) along `dim` (torch.chunk's split over n = len(ranks)).

    Raises:
        ValueError: dim out of range; bad or foreign `ranks`.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    g = _resolve(ranks, "reduce_scatter", hierarchy)
    dim = _norm_dim(x, dim, "reduce_scatter")
    return _Conjugate.apply(x, partial(_reduce_scatter, dim=dim, g=g),
                            partial(_gather, dim=dim, g=g, full=x.shape[dim]))


def all_reduce(x: torch.Tensor, ranks: Group, hierarchy: Hierarchy | None = None) -> torch.Tensor:
    """Partial(sum) -> Replicate: sum over the group. Backward: identity (Megatron's g).

    Local shapes: unchanged.

    Raises:
        ValueError: bad `ranks`, or the calling rank is not in it.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    return _Conjugate.apply(x, partial(_sum, g=_resolve(ranks, "all_reduce", hierarchy)), _identity)


def all_reduce_max(x: torch.Tensor, ranks: Group) -> torch.Tensor:
    """Element-wise maximum over the group, without gradient (e.g. the row maxima that stabilise a
    vocab-parallel softmax: any common shift is exact there), with torch.amax's special values: NaN where any
    rank holds NaN (`_max_by_order`; +0.0 over -0.0, which torch.amax orders by position). Local shapes: unchanged.

    Raises:
        ValueError: bad `ranks`, or the calling rank is not in it.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    g = _resolve(ranks, "all_reduce_max")
    if g.size == 1:
        return x.detach()
    return _max_by_order(x.detach().contiguous(), g)


_ORDER_BITS = {torch.float32: (torch.int32, 0x7FFFFFFF, 0x7FC00000), torch.float64:
               (torch.int64, 0x7FFFFFFFFFFFFFFF, 0x7FF8000000000000)}  # (int view, magnitude mask, canonical NaN)


def _max_by_order(x: torch.Tensor, g: _GroupView) -> torch.Tensor:
    """MAX all-reduce of a float tensor through its order-preserving integer image, so that NaN wins as in
    torch.amax. gloo's MAX is `std::max` applied in member order, which keeps a NaN only when the group's first
    member holds it: a NaN gradient on any other rank's shard vanished from an inf-norm (`runtime.grad_norm`),
    so `clip_grad_norm_(norm_type=inf, error_if_nonfinite=True)` passed where one device raises, and clipped by
    a finite norm (r23g). The image: the float's bits as a signed integer, the magnitude bits flipped when the
    sign is set (then integer order is float order, -0.0 below +0.0), and every NaN first made the positive
    quiet NaN, whose image lies above +inf's. Same bytes as the float (float16 / bfloat16 travel as float32,
    exactly); integer and bool tensors reduce as they are."""
    if not x.is_floating_point():
        return _wait(funcol.all_reduce(x, "max", g.name))
    wide = x.float() if x.element_size() < 4 else x
    as_int, magnitude, nan_bits = _ORDER_BITS[wide.dtype]
    bits = wide.view(as_int)
    bits = torch.where(torch.isnan(wide), torch.full_like(bits, nan_bits), bits)
    image = torch.where(bits < 0, bits ^ magnitude, bits)  # an involution: the same step maps back
    top = _wait(funcol.all_reduce(image, "max", g.name))
    return torch.where(top < 0, top ^ magnitude, top).view(wide.dtype).to(x.dtype)


def grad_all_reduce(x: torch.Tensor, ranks: Group, hierarchy: Hierarchy | None = None) -> torch.Tensor:
    """Replicate -> Replicate used on different data. Forward: identity. Backward: all-reduce (sum).

    Megatron's f, and the DDP gradient sync of a replicated parameter feeding batch-sharded activations:
    each rank's gradient is a partial contribution, and the sum over the group is the full gradient.

    Local shapes: unchanged.

    Raises:
        ValueError: bad `ranks`, or the calling rank is not in it.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    return _Conjugate.apply(x, _identity, partial(_sum, g=_resolve(ranks, "grad_all_reduce", hierarchy)))


def all_to_all(x: torch.Tensor, src_dim: int, dst_dim: int, ranks: Group, size: int | None = None) -> torch.Tensor:
    """Shard(src_dim) -> Shard(dst_dim) of the same global tensor. Backward: the reverse all-to-all.

    Input: this rank's chunk of a global tensor split along `src_dim` into chunks of `size` elements in
    total (default: local length x n, even); output: this rank's chunk of the same tensor split along
    `dst_dim` (chunk index = position of the rank in `ranks`; torch.chunk's uneven split).

    Local shapes, n = len(ranks): `src_dim` chunk of `size` -> size and `dst_dim` D -> chunk of D, e.g.
    with src_dim=1, dst_dim=2, even: (B, T/n, H) -> (B, T, H/n).

    Raises:
        ValueError: a dim out of range, src_dim == dst_dim, or bad or foreign `ranks`.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    g = _resolve(ranks, "all_to_all")
    src = _norm_dim(x, src_dim, "all_to_all")
    dst = _norm_dim(x, dst_dim, "all_to_all")
    if src == dst:
        raise ValueError(f"all_to_all: src_dim and dst_dim are both {src}; the layout does not change")
    full = x.shape[src] * g.size if size is None else size
    return _Conjugate.apply(x, partial(_exchange, src_dim=src, dst_dim=dst, g=g, src_full=full),
                            partial(_exchange, src_dim=dst, dst_dim=src, g=g, src_full=x.shape[dst]))


def rechunk(x: torch.Tensor, dim: int, ranks: Group, src_sizes: Sequence[int], dst_sizes: Sequence[int]) -> torch.Tensor:
    """A dim split over the group in consecutive blocks of `src_sizes[j]` elements (member j holds block j)
    -> blocks of `dst_sizes[j]` (same total). Backward: the reverse rechunk.

    Used by views that merge or split an unevenly sharded dim: viewing rows (3, 3, 3, 1) of a (10, 7) tensor
    as (70,) leaves blocks of 21, 21, 21, 7 elements, while Shard(0) of 70 elements over 4 ranks is chunks of
    18, 18, 18, 16 (torch.chunk's split); rechunk moves the rows across the block boundaries.

    Raises:
        ValueError: dim out of range, sizes of the wrong length or totals, or this rank's local length is not
            src_sizes[its index]; bad or foreign `ranks`.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    g = _resolve(ranks, "rechunk")
    dim = _norm_dim(x, dim, "rechunk")
    src, dst = list(src_sizes), list(dst_sizes)
    if len(src) != g.size or len(dst) != g.size or sum(src) != sum(dst) or x.shape[dim] != src[g.index]:
        raise ValueError(f"rechunk: sizes {src} -> {dst} over group {list(g.ranks)} do not fit local shape "
                         f"{tuple(x.shape)} (dim {dim}, member {g.index}); give one size per member, equal totals")
    return _Conjugate.apply(x, partial(_move_rows, dim=dim, g=g, src=src, dst=dst),
                            partial(_move_rows, dim=dim, g=g, src=dst, dst=src))


def local_slice(x: torch.Tensor, dim: int, ranks: Group, hierarchy: Hierarchy | None = None) -> torch.Tensor:
    """Replicate -> Shard(dim): keep this rank's chunk along `dim`, no communication.

    Backward: all-gather of the gradient along `dim`, giving the full (identical) gradient of the
    replicated input on every rank.

    Local shapes: (.., S, ..) -> (.., chunk of S, ..) along `dim` (torch.chunk's split over n = len(ranks);
    the chunk index is the position of the calling rank in `ranks`).

    Raises:
        ValueError: dim out of range; bad or foreign `ranks`.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    g = _resolve(ranks, "local_slice", hierarchy)
    dim = _norm_dim(x, dim, "local_slice")
    return _Conjugate.apply(x, partial(_chunk, dim=dim, g=g), partial(_gather, dim=dim, g=g, full=x.shape[dim]))


# torch.fx.symbolic_trace records these as call_function nodes instead of tracing into them.
for _name in ("all_gather", "all_gather_rs", "reduce_scatter", "all_reduce", "all_reduce_max", "grad_all_reduce",
              "all_to_all", "local_slice", "rechunk"):
    torch.fx.wrap(_name)
del _name
