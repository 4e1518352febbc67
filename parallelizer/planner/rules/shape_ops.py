"""Rules of data-movement ops: views, transposes, slicing, concatenation, indexing. All are linear, so a
Partial input stays Partial (except where the op reads values, e.g. a padding value that is not zero)."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torch.distributed.tensor.placement_types import Shard

from .base import OUT, P, R, AxisOption, OpView, aten, replicate, same_dims


def reshape_like(v: OpView) -> list[AxisOption]:
    """view / reshape / flatten / unflatten / unsqueeze / squeeze: a shard of input dim d maps to the output
    dim e with the same prefix product (the flattened blocks coincide). When d and e differ in size (d is
    merged with or split from its neighbours) both must split evenly; Partial passes through."""
    src, dst = v.in_shapes[0], v.out
    opts = [replicate(v)]
    for d in range(len(src)):
        if src[d] == 1:
            continue
        prefix = math.prod(src[:d])
        for e in range(len(dst)):
            if dst[e] > 1 and math.prod(dst[:e]) == prefix:
                opts.append(AxisOption((Shard(d),), Shard(e), regroup=() if src[d] == dst[e] else (0, OUT)))
                break
    return opts + [AxisOption((P,), P)]


def dim_map(mapping: Callable[[OpView, int], int | None], partial: bool = True) -> Callable[[OpView], list[AxisOption]]:
    """Rule of an op whose input dim d becomes output dim mapping(v, d) (None: d cannot be sharded); other
    tensor inputs Replicate; Partial passes through (`partial`)."""
    def rule(v: OpView) -> list[AxisOption]:
        extra = (R,) * (v.n_in - 1)
        opts = [replicate(v)]
        for d in range(v.nd()):
            e = mapping(v, d)
            if e is not None and v.in_shapes[0][d] > 1:
                opts.append(AxisOption((Shard(d),) + extra, Shard(e)))
        return opts + [AxisOption((P,) + extra, P)] if partial and v.out_is_float else opts
    rule.__name__ = f"dim_map({mapping.__name__})"
    rule.__doc__ = f"Input dim d -> output dim `{mapping.__name__}(d)`; Partial passes."
    return rule


def transpose_map(v: OpView, d: int) -> int:
    a, b = (x % v.nd() for x in (v.arg(1, "dim0", 0), v.arg(2, "dim1", 1)))
    return b if d == a else a if d == b else d


def permute_map(v: OpView, d: int) -> int:
    return [p % v.nd() for p in v.arg(1, "dims")].index(d)


def t_map(v: OpView, d: int) -> int:
    return 1 - d if v.nd() == 2 else d


def expand_map(v: OpView, d: int) -> int | None:
    off = len(v.out) - v.nd()
    return d + off if v.in_shapes[0][d] == v.out[d + off] else None


def broadcast(v: OpView) -> list[AxisOption]:
    """broadcast_tensors(tensors): every output has the broadcast shape; shard any dim of it, each input
    alike where it has that dim (Replicate where it is broadcast: its local expansion is the shard of the
    global one); Partial passes when every input is Partial (expansion is data movement). F.mse_loss,
    F.l1_loss, F.huber_loss, ... call it before their op."""
    opts = [replicate(v)] + [AxisOption(same_dims(v, d), Shard(d)) for d in range(len(v.out)) if v.out[d] > 1]
    return opts + [AxisOption((P,) * v.n_in, P)] if v.out_is_float else opts


def expand_as(v: OpView) -> list[AxisOption]:
    """expand_as(x, other): x expanded to other's shape (F.normalize divides by its norm expanded so); x's
    dims map as `expand_map`; the local op takes `other`'s LOCAL shape, so other must be sharded on the same
    output dim (a Replicate other would expand a shard to the whole shape); Partial x passes with other
    Replicate (data movement)."""
    off = len(v.out) - v.nd()
    opts = [replicate(v)]
    for d in range(v.nd()):
        if v.in_shapes[0][d] == v.out[d + off] > 1:
            opts.append(AxisOption((Shard(d), Shard(d + off)), Shard(d + off)))
    for e in range(len(v.out)):  # a dim x broadcasts: x Replicate, expanded to other's shard
        if v.out[e] > 1 and (e < off or v.in_shapes[0][e - off] == 1):
            opts.append(AxisOption((R, Shard(e)), Shard(e)))
    return opts + [AxisOption((P, R), P)] if v.out_is_float else opts


def leading_map(v: OpView, d: int) -> int | None:
    """Input dim d is output dim d (one_hot: the classes are a new trailing dim)."""
    return d


def masked_scatter(v: OpView) -> list[AxisOption]:
    """masked_scatter(x (B, ...), mask (x's shape), source (M, ...)): the k-th True position of x (row-major)
    takes source's k-th element (VLMs place image features into the text embeddings with it). The batch of
    all three may be sharded when source holds the same number of rows per sample (M a multiple of B) and
    every shard is even: a rank's source rows are then its own samples' rows, provided each sample's mask
    selects what its rows hold. That is data, so the local form checks it on every rank, all ranks raising
    together (`rewriter.localize.checked_masked_scatter`). A source whose rows per sample hold at least as many
    elements as a sample has positions (one shaped like x: `h.masked_scatter(m, values_like_h)`) could pass that
    check only with every mask element True, so it is replicated: under ddp the check refused every step of
    such a model, also of plans made without roles (trial r14a)."""
    x, mask, src = v.in_shapes
    if len(x) < 2 or mask != x or not src or x[0] < 2 or src[0] % x[0]:
        return [replicate(v)]
    if src[0] // x[0] * math.prod(src[1:]) >= math.prod(x[1:]):
        return [replicate(v)]
    return [replicate(v), AxisOption((Shard(0), Shard(0), Shard(0)), Shard(0), (0, 1, 2, OUT))]


def all_but_last_map(v: OpView, d: int) -> int | None:
    """view_as_complex (x (..., 2) -> (...)): every dim but the last (the real / imaginary pair) keeps its place;
    also linalg_vander (x (..., n) -> (..., n, N), N defaulting to n)."""
    return d if d < v.nd() - 1 else None


def numpy_t_map(v: OpView, d: int) -> int | None:
    """x.T (aten.numpy_T: every dim reversed; Falcon's rotary)."""
    return v.nd() - 1 - d


def copies(mapping: Callable[[OpView, int], int | None]) -> Callable[[OpView], list[AxisOption]]:
    """`dim_map(mapping)` plus, for expand / repeat, a Replicate input giving an output sharded along a dim the op
    fills with copies of the input (a new leading dim, or one of size 1 in the input): each rank makes its own
    slice of copies locally (the size / repeats argument localised to the rank's output, `rewriter.localize`), as
    `queries.weight.unsqueeze(0).repeat(B, 1, 1)` per sample on a batch-sharded plan (round 26: without it, a view
    that follows the copy in the same strategy group, MultiheadAttention's transpose, could not shard the batch)."""
    base = dim_map(mapping)

    def rule(v: OpView) -> list[AxisOption]:
        off = len(v.out) - v.nd()
        extra = tuple(AxisOption((R,) * v.n_in, Shard(e)) for e in range(len(v.out))
                      if v.out[e] > 1 and (e < off or v.in_shapes[0][e - off] == 1))
        return base(v) + list(extra)
    rule.__name__ = f"copies({mapping.__name__})"
    rule.__doc__ = copies.__doc__
    return rule


def repeat_map(v: OpView, d: int) -> int | None:
    """repeat(x, repeats): input dim d is output dim d + (len(repeats) - x.dim()), shardable where it is
    repeated once (a repeated dim holds copies of the whole dim: a shard of it is not a shard of the output)."""
    repeats = v.arg(1, "repeats")
    off = len(repeats) - v.nd()
    return d + off if repeats[d + off] == 1 else None


def dtype_view_map(v: OpView, d: int) -> int | None:
    """view(x, dtype) reinterprets bits: to a dtype of the same size every dim keeps its size; to another
    size the last dim is rescaled, so only the other dims may be sharded. Never Partial: the bits of a sum
    are not the sum of the bits (the rule is `dim_map(dtype_view_map, partial=False)`)."""
    same = v.in_dtypes[0].itemsize == v.out_dtypes[0].itemsize
    return d if same or d < v.nd() - 1 else None


def except_dim(index: int, default: int = 0) -> Callable[[OpView, int], int | None]:
    """Identity map except for the op's `dim` argument (positional `index`): slice, split, narrow."""
    def m(v: OpView, d: int) -> int | None:
        return None if d == v.arg(index, "dim", default) % v.nd() else d
    m.__name__ = f"all but arg {index} 'dim'"
    return m


def select_map(v: OpView, d: int) -> int | None:
    dim = v.arg(1, "dim") % v.nd()
    return None if d == dim else d if d < dim else d - 1


def unbind_map(v: OpView, d: int) -> int | None:
    return select_map(OpView(v.target, (v.args[0], v.arg(1, "dim", 0)), {}, v.in_shapes, v.out_shapes), d)


def stack_map(v: OpView, d: int) -> int:
    dim = v.arg(1, "dim", 0) % (v.nd() + 1)
    return d if d < dim else d + 1


def cat(v: OpView) -> list[AxisOption]:
    """cat(tensors, dim): shard another dim of every input alike; Partial inputs give a Partial output."""
    nd = len(v.out)
    same_rank = all(len(s) == nd for s in v.in_shapes)
    dim = v.arg(1, "dim", 0) % max(nd, 1)
    opts = [replicate(v)]
    if same_rank:
        opts += [AxisOption((Shard(d),) * v.n_in, Shard(d)) for d in range(nd) if d != dim and v.out[d] > 1]
    return opts + [AxisOption((P,) * v.n_in, P)] if v.out_is_float and same_rank else opts


def stack(v: OpView) -> list[AxisOption]:
    """stack(tensors, dim): shard a dim of every input alike (output dim shifted past the new one)."""
    opts = [replicate(v)]
    opts += [AxisOption((Shard(d),) * v.n_in, Shard(stack_map(v, d))) for d in range(v.nd()) if v.in_shapes[0][d] > 1]
    return opts + [AxisOption((P,) * v.n_in, P)] if v.out_is_float else opts


def getitem(v: OpView) -> list[AxisOption]:
    """operator.getitem of a multi-output op: the element has the op's output layout."""
    return [replicate(v)] + [AxisOption((Shard(d),), Shard(d)) for d in range(len(v.out)) if v.out[d] > 1] + [
        AxisOption((P,), P)]


def index_select(v: OpView) -> list[AxisOption]:
    """index_select(x, dim, index (K,)): shard x on another dim, or the index (output dim `dim`)."""
    dim = v.arg(1, "dim") % v.nd()
    opts = [replicate(v)] + [AxisOption((Shard(d), R), Shard(d)) for d in range(v.nd()) if d != dim and v.in_shapes[0][d] > 1]
    if v.in_shapes[1] and v.in_shapes[1][0] > 1:
        opts.append(AxisOption((R, Shard(0)), Shard(dim)))
    return opts + [AxisOption((P, R), P)] if v.out_is_float else opts


def gather(v: OpView) -> list[AxisOption]:
    """gather(x, dim, index): out[..i..][j] = x[..i..][index[..i..][j]] (along `dim`); output shape = index
    shape. Shard the index along `dim` with x Replicate (positions along `dim` are looked up by value), or x
    and index alike on another dim where their sizes agree; Partial x passes."""
    dim = v.arg(1, "dim") % v.nd()
    x, idx = v.in_shapes
    opts = [replicate(v)] + ([AxisOption((R, Shard(dim)), Shard(dim))] if idx[dim] > 1 else [])
    opts += [AxisOption((Shard(d), Shard(d)), Shard(d)) for d in range(len(idx)) if d != dim and idx[d] > 1 and x[d] == idx[d]]
    return opts + [AxisOption((P, R), P)] if v.out_is_float else opts


def index_write(linear: bool) -> Callable[[OpView], list[AxisOption]]:
    """index_add / index_copy (x, dim, index (K,), source), index_fill (x, dim, index, value), and scatter /
    scatter_add / scatter_reduce (x, dim, index, src or value; index and src of x's rank): positions along
    `dim` are written by value, so `dim` stays whole; shard x, a same-rank index and source alike on another
    dim where their sizes agree (scatter's index may be smaller than x there: then not), a 1-D index
    Replicate. `linear` (index_add, scatter_add): Partial x and source with a Replicate index give Partial.
    (pytorch#177414 registers DTensor strategies of this shape; before, these ran replicated, and under
    ddp a GNN's message sum gathered the batch, trial r14a.)"""
    def rule(v: OpView) -> list[AxisOption]:
        nd = v.nd()
        dim = v.arg(1, "dim") % nd
        shapes = v.in_shapes
        opts = [replicate(v)]
        for d in range(nd):
            if d == dim or shapes[0][d] <= 1:
                continue
            ins = []
            for i, sh in enumerate(shapes):
                if i > 0 and (len(sh) == 0 or len(sh) == 1 and nd > 1):
                    ins.append(R)            # index_*'s 1-D index, index_fill's 0-d value
                elif len(sh) == nd and sh[d] == shapes[0][d]:
                    ins.append(Shard(d))
                else:
                    break
            if len(ins) == len(shapes):
                opts.append(AxisOption(tuple(ins), Shard(d)))
        if linear and v.out_is_float and len(shapes) == 3:
            opts.append(AxisOption((P, R, P), P))
        return opts
    rule.__doc__ = index_write.__doc__
    rule.__name__ = f"index_write({'linear' if linear else ''})"
    return rule


def take(v: OpView) -> list[AxisOption]:
    """take(x, index): x read whole (flat positions, by value), the output shaped like the index: shard any
    dim of the index (x Replicate); Partial x passes."""
    opts = [replicate(v)] + [AxisOption((R, Shard(d)), Shard(d)) for d in range(len(v.in_shapes[1]))
                             if v.in_shapes[1][d] > 1]
    return opts + [AxisOption((P, R), P)] if v.out_is_float else opts


def _indexed_dims(v: OpView) -> list[int] | None:
    """The dims of x (tensor input 0) that the index tensors of `v.args[1]` cover, in order, or None when
    they are not one contiguous run. A boolean (or uint8) mask of k dims covers k dims of x (x[mask] with
    mask (B, T) on x (B, T, H) selects over B and T); an integer index tensor covers one. Counting one dim per
    index tensor (as before) let a rule shard x on a dim a mask covers: Wav2Vec2's SpecAugment
    `hidden[mask_time_indices] = masked_spec_embed` on a sequence-sharded hidden state raised IndexError
    (mask [4, 39] vs a local [4, 20, 32]) on every rank."""
    dims, at, j = [], 0, 1
    for t in v.args[1]:
        if t is None:
            at += 1
            continue
        dtype = v.in_dtypes[j] if j < len(v.in_dtypes) else torch.int64
        k = len(v.in_shapes[j]) if dtype in (torch.bool, torch.uint8) else 1
        dims += range(at, at + k)
        at, j = at + k, j + 1
    if not dims or dims != list(range(dims[0], dims[0] + len(dims))):
        return None
    return dims


def index(v: OpView) -> list[AxisOption]:
    """x[indices] (aten.index.Tensor) with the index tensors on contiguous dims k0 .. k0+c-1 (`_indexed_dims`:
    a boolean mask covers as many dims as it has): shard x on a dim it keeps (before or after them); index
    tensors Replicate. Partial x passes (selection is linear)."""
    covered = _indexed_dims(v)
    if covered is None:
        return [replicate(v)]
    k0, c = covered[0], len(covered)
    idx_nd = len(v.out) - (v.nd() - c)
    extra = (R,) * (v.n_in - 1)
    opts = [replicate(v)]
    for d in range(v.nd()):
        if k0 <= d < k0 + c or v.in_shapes[0][d] == 1:
            continue
        e = d if d < k0 else d - c + idx_nd
        opts.append(AxisOption((Shard(d),) + extra, Shard(e)))
    return opts + [AxisOption((P,) + extra, P)] if v.out_is_float else opts


def index_put(v: OpView) -> list[AxisOption]:
    """index_put(x, indices, values, accumulate) with index tensors on leading dims 0..c-1 (`_indexed_dims`:
    a boolean mask covers as many dims as it has): shard x on a trailing (not indexed) dim and `values` on the
    matching dim (Replicate where values broadcast); or, for one boolean mask and values that broadcast over
    the selection (`h[mask] = embed`), shard x and the mask alike on a dim the mask covers."""
    covered = _indexed_dims(v)
    if covered is None or covered[0] != 0:
        return [replicate(v)]
    x, vals = v.in_shapes[0], v.in_shapes[-1]
    n_idx = v.n_in - 2
    opts = [replicate(v)]
    for d in range(len(covered), len(x)):
        if x[d] == 1:
            continue
        k = len(vals) - (len(x) - d)
        pv = Shard(k) if k >= 0 and vals[k] == x[d] else R
        opts.append(AxisOption((Shard(d),) + (R,) * n_idx + (pv,), Shard(d)))
    mask = n_idx == 1 and v.in_dtypes[1] in (torch.bool, torch.uint8)
    broadcast_values = len(vals) <= len(x) - len(covered) or vals[0] == 1  # no dim enumerating the selection
    if mask and broadcast_values:  # x and the mask sharded alike on a dim the mask covers (a batch-sharded mask)
        opts += [AxisOption((Shard(d), Shard(d), R), Shard(d)) for d in covered if x[d] > 1]
    return opts


def constant_pad(v: OpView) -> list[AxisOption]:
    """constant_pad_nd(x, pad, value) and pad(x, pad, mode, value): shard a dim that is not padded; Partial
    passes for a constant pad of 0. The reflect / replicate / circular kernels reject an empty dim other than
    the batch (the first dim of an input with two more dims than it pads), so a shard of such a dim must be
    even (non-empty): stft's centring reflect-pads a (1, B, T) view of its (B, T) input, and a batch of 4 on
    dp=3 (2, 2, 0) left rank 2 a (1, 0, T) shard the kernel rejects (trial r14a)."""
    pad = list(v.arg(1, "pad"))
    padded = {v.nd() - 1 - i // 2 for i in range(len(pad)) if pad[i] != 0}
    constant = v.packet is aten.constant_pad_nd or v.arg(2, "mode", "constant") == "constant"
    batched = v.nd() == len(pad) // 2 + 2

    def even(d: int) -> tuple[int, ...]:
        return () if constant or (batched and d == 0) else (0, OUT)
    opts = [replicate(v)] + [AxisOption((Shard(d),), Shard(d), even(d)) for d in range(v.nd())
                             if d not in padded and v.in_shapes[0][d] > 1]
    value = v.arg(2, "value", 0) if v.packet is aten.constant_pad_nd else v.arg(3, "value", None)
    return opts + [AxisOption((P,), P)] if v.out_is_float and constant and not value else opts


def meshgrid(v: OpView) -> list[AxisOption]:
    """meshgrid(tensors (n_0,), (n_1,), ..., indexing) -> k tensors of shape (n_0, n_1, ...) ("ij"; "xy" swaps
    the first two dims): output j is tensor j broadcast along the other dims, so sharding tensor i (the
    others Replicate) shards every output on tensor i's dim; linear in each tensor: all Partial -> Partial."""
    if any(len(s) != 1 for s in v.in_shapes):
        return [replicate(v)]
    xy = v.arg(1, "indexing", "ij") == "xy" and v.n_in >= 2
    dim = (lambda i: {0: 1, 1: 0}.get(i, i) if xy else i)
    opts = [replicate(v)] + [AxisOption(tuple(Shard(0) if j == i else R for j in range(v.n_in)), Shard(dim(i)))
                             for i in range(v.n_in) if v.in_shapes[i][0] > 1]
    return opts + [AxisOption((P,) * v.n_in, P)] if v.out_is_float else opts


def diagonal_map(dim1: int, dim2: int) -> Callable[[OpView, int], int | None]:
    """diagonal(x, offset, dim1, dim2) (defaults `dim1`, `dim2`: 0, 1 for torch.diagonal, -2, -1 for
    torch.linalg.diagonal): the two dims read become one trailing dim (never sharded); every other dim keeps
    its order before it."""
    def mapping(v: OpView, d: int) -> int | None:
        nd = v.nd()
        read = {v.arg(2, "dim1", dim1) % nd, v.arg(3, "dim2", dim2) % nd}
        return None if d in read else d - sum(r < d for r in read)
    mapping.__name__ = f"diagonal_map({dim1}, {dim2})"
    return mapping
