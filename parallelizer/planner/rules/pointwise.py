"""Rules of pointwise ops, creation ops, and ops that read positions along some dims.

Pointwise ops shard any output dim (inputs broadcast to it are Replicate there) and take Partial inputs as
`partial.py` allows. Ops that read positions along a dim (tril/triu, cumsum, flip, roll, sort, topk,
argmax, softmax, ...) are not elementwise along that dim: they are sharded only along the other dims,
except tril/triu, whose local form shifts the diagonal by the shard offsets (`rewriter.localize`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torch.distributed.tensor.placement_types import Shard

from .base import OUT, P, R, AxisOption, OpView, aten, dims_arg, replicate, same_dims
from .partial import pointwise_partial_options


def elementwise(v: OpView) -> list[AxisOption]:
    """Pointwise ops with broadcasting: shard any output dim of size > 1; Partial as `partial.py` says."""
    opts = [replicate(v)]
    opts += [AxisOption(same_dims(v, d), Shard(d)) for d in range(len(v.out)) if v.out[d] > 1]
    return opts + pointwise_partial_options(v)


def creation(v: OpView) -> list[AxisOption]:
    """arange, zeros, full, ..., new_zeros(x, size): a Replicate output (the rewriter creates it whole and
    slices it where a consumer wants a shard). A tensor input (new_*) only gives dtype and device, so it
    may come in any layout."""
    if v.n_in == 0:
        return [replicate(v)]
    return [replicate(v)] + [AxisOption((Shard(d),), R) for d in range(v.nd()) if v.in_shapes[0][d] > 1] + [
        AxisOption((P,), R)]


def constant_fill(v: OpView) -> list[AxisOption]:
    """zeros / ones / full / empty (size), and new_zeros / new_ones / new_full / new_empty (x, size): a constant
    of a given size may be created in any layout (each rank makes its local shard, `rewriter.localize`); x
    only gives dtype and device, so it may come in any layout."""
    outs = [R] + [Shard(d) for d in range(len(v.out)) if v.out[d] > 1]
    if v.n_in == 0:
        return [AxisOption((), p) for p in outs]
    ins = [R] + [Shard(d) for d in range(v.nd()) if v.in_shapes[0][d] > 1] + [P]
    return [AxisOption((i,), o) for i in ins for o in outs]


def like(v: OpView) -> list[AxisOption]:
    """zeros_like / ones_like / full_like / empty_like / fill, and rand_like / randn_like: the output has the
    input's layout (a shard of zeros is zeros); a Partial input gives a Replicate output (the fill value does
    not depend on the summands). Random fills draw per shard (`rewriter.localize.seeded_per_shard`)."""
    extra = (R,) * (v.n_in - 1)  # fill.Tensor's value
    opts = [replicate(v)] + [AxisOption((Shard(d),) + extra, Shard(d)) for d in range(v.nd()) if v.in_shapes[0][d] > 1]
    return opts + [AxisOption((P,) + extra, R)]


def along(read: Callable[[OpView], list[int]], linear: bool = False,
          single_input: bool = False, even: bool = False) -> Callable[[OpView], list[AxisOption]]:
    """Rule of an op that reads positions along the dims `read(v)` of its first input: shard the other
    dims (the output keeps the input's rank); Partial passes through when the op is `linear`. With
    `single_input`, a call with further tensor inputs (diff's prepend/append, shaped like the input) is
    only replicated. With `even`, shards must be equal (FFTs: MKL rejects an empty one)."""
    def rule(v: OpView) -> list[AxisOption]:
        if single_input and v.n_in > 1:
            return [replicate(v)]
        dims = set(read(v))
        extra = (R,) * (v.n_in - 1)
        opts = [replicate(v)] + [AxisOption((Shard(d),) + extra, Shard(d), (0, OUT) if even else ())
                                 for d in range(v.nd()) if d not in dims and v.in_shapes[0][d] > 1]
        return opts + [AxisOption((P,) + extra, P)] if linear and v.out_is_float else opts
    rule.__doc__ = f"Shards every dim except those read (`{read.__name__}`)" + ("; Partial passes." if linear else ".")
    rule.__name__ = f"along({read.__name__}{', linear' if linear else ''})"
    return rule


def dim_arg(index: int, name: str = "dim", default=0) -> Callable[[OpView], list[int]]:
    """The dims an op reads: its `dim` argument (positional `index`), else `default` (None: every dim)."""
    def read(v: OpView) -> list[int]:  # (a list default, fft2's [-2, -1], is read as given)
        d = v.arg(index, name, default)
        return list(range(v.nd())) if d is None or d == [] else sorted({x % v.nd() for x in d}) if isinstance(d, (list, tuple)) \
            else [d % max(v.nd(), 1)]
    read.__name__ = f"arg {index} '{name}'"
    return read


def roll_dims(v: OpView) -> list[int]:
    """roll(x, shifts, dims): the rolled dims (every dim when dims is empty: it rolls the flattened tensor)."""
    dims = v.arg(2, "dims", [])
    return list(range(v.nd())) if not dims else [d % v.nd() for d in dims]


def histogram(v: OpView) -> list[AxisOption]:
    """histc(x, bins, min, max): counts over every element, so a shard of any dim counts its own elements and
    the counts of the shards add up (Partial); the bins are the same on every rank only with a fixed range
    (min < max: with min == max torch takes each tensor's own min and max), else Replicate only. (MoE
    routers count tokens per expert with it: Mixtral, Qwen2-MoE.)"""
    opts = [replicate(v)]
    if v.arg(2, "min", 0) >= v.arg(3, "max", 0):
        return opts
    return opts + [AxisOption((Shard(d),), P) for d in range(v.nd()) if v.in_shapes[0][d] > 1]


def bucketize(v: OpView) -> list[AxisOption]:
    """bucketize(x, boundaries (K,)) and searchsorted(sorted (K,), x[, sorter=(K,)]): the bucket of each element
    of x against one sorted 1-D sequence (Replicate, as is searchsorted's `sorter`, the permutation that sorts
    it): shard any dim of x (MoE routers: Aria, OLMoE). A batched sorted sequence (searchsorted with a sorted
    tensor of rank > 1) stays replicated. (Before, a call with `sorter=` got options of two inputs for its
    three, and planning raised a raw IndexError.)"""
    x, seq = (0, 1) if v.packet is aten.bucketize else (1, 0)
    if len(v.in_shapes[seq]) != 1:
        return [replicate(v)]
    opts = [replicate(v)]
    for d in range(len(v.in_shapes[x])):
        if v.in_shapes[x][d] > 1:
            ins = [R] * v.n_in
            ins[x] = Shard(d)
            opts.append(AxisOption(tuple(ins), Shard(d)))
    return opts


def weight_norm(v: OpView) -> list[AxisOption]:
    """_weight_norm(v, g, dim) = g * v / ||v|| (the norm over every dim but `dim`; g has size 1 elsewhere):
    shard `dim` on both (wav2vec2 / HuBERT's positional conv, dim 2). A 0-d g (`weight_norm(m, dim=None)`:
    one norm over the whole weight, called with dim=-1) is Replicate only (before, planning raised a raw
    IndexError reading g's shape at `dim`)."""
    dim = v.arg(2, "dim", 0) % v.nd()
    if v.nd(1) != v.nd() or v.in_shapes[0][dim] == 1 or v.in_shapes[1][dim] != v.in_shapes[0][dim]:
        return [replicate(v)]
    return [replicate(v), AxisOption((Shard(dim), Shard(dim)), Shard(dim), (0, 1, OUT))]  # (an empty shard: SIGFPE)


def tril_triu(v: OpView) -> list[AxisOption]:
    """tril / triu (x (..., M, N), diagonal): shard any dim; along the last two the local form shifts the
    diagonal by (row offset - column offset) of the shard (`rewriter.localize`). Linear: Partial passes."""
    opts = [replicate(v)] + [AxisOption((Shard(d),), Shard(d)) for d in range(v.nd()) if v.in_shapes[0][d] > 1]
    return opts + [AxisOption((P,), P)]


def reduction(v: OpView) -> list[AxisOption]:
    """sum / mean over dims: shard kept dims; a shard of a reduced dim gives Partial(sum) (the local form
    of mean divides the local sum by the GLOBAL count, exact for uneven shards); Partial passes."""
    nd = v.nd()
    dims = dims_arg(v, 1, "dim", nd)
    keep = bool(v.arg(2, "keepdim", False))
    opts = [replicate(v)]
    for d in range(nd):
        if v.in_shapes[0][d] == 1:
            continue
        out = P if d in dims else Shard(d if keep else d - sum(x < d for x in dims))
        opts.append(AxisOption((Shard(d),), out))
    return opts + [AxisOption((P,), P)] if v.out_is_float else opts


def sum_to_size(v: OpView) -> list[AxisOption]:
    """sum_to_size(x, size): x summed over its leading dims (those size has not) and over each dim where size is 1
    and x is not (right-aligned, as broadcasting; `torch.Tensor.sum_to_size`). A shard of a summed dim gives
    Partial(sum), a shard of a kept dim stays a shard of the output (the local form passes this rank's output
    size, `rewriter.localize.SIZE_ARG`); Partial passes (a sum is linear)."""
    size = list(v.arg(1, "size", []))
    lead = v.nd() - len(size)
    opts = [replicate(v)]
    for d in range(v.nd()):
        if v.in_shapes[0][d] > 1:
            summed = d < lead or size[d - lead] == 1
            opts.append(AxisOption((Shard(d),), P if summed else Shard(d - lead)))
    return opts + [AxisOption((P,), P)] if v.out_is_float else opts


def leading_two(v: OpView) -> list[int]:
    """The dims after the first two (N, C, *): what feature_dropout / feature_alpha_dropout draw ONE mask entry
    across (a mask per sample and channel, `torch.nn.functional.dropout2d`), so a shard of them must not draw its
    own: the rule shards N and C only."""
    return list(range(2, v.nd()))


def kept_dims(dim_index: int = 1, keep_index: int | None = 2,
              default_dims: tuple[int, ...] | None = None) -> Callable[[OpView], list[AxisOption]]:
    """Rule of a non-linear reduction over dims (amax, argmax, max.dim, var, std, logsumexp, norms, any,
    all) whose dims are argument `dim_index` and keepdim argument `keep_index` (or the keyword): shard the
    kept dims only. An omitted dims argument means every dim, or `default_dims` (matrix_norm: (-2, -1))."""
    def rule(v: OpView) -> list[AxisOption]:
        nd = v.nd()
        omitted = default_dims is not None and v.arg(dim_index, "dim") is None
        dims = sorted(d % nd for d in default_dims) if omitted else dims_arg(v, dim_index, "dim", nd)
        keep = bool(v.arg(_keepdim_index(v, keep_index), "keepdim", False))
        opts = [replicate(v)]
        for d in range(nd):
            if d not in dims and v.in_shapes[0][d] > 1:
                out = Shard(d if keep else d - sum(x < d for x in dims))
                opts.append(AxisOption((Shard(d),) + (R,) * (v.n_in - 1), out))
        return opts
    rule.__doc__ = kept_dims.__doc__
    rule.__name__ = f"kept_dims({dim_index}, {keep_index})"
    return rule


def nonempty(base: Callable[[OpView], list[AxisOption]]) -> Callable[[OpView], list[AxisOption]]:
    """`base`'s options, those that shard made even (equal, so never empty, chunks): for a kernel that rejects
    an empty input (quantile: "input tensor must be non-empty")."""
    def rule(v: OpView) -> list[AxisOption]:
        return [o if all(p == R for p in o.inputs) else dataclasses.replace(o, even=(0, OUT)) for o in base(v)]
    rule.__doc__ = f"`{base.__name__}` with its sharded options even (the kernel rejects an empty shard)."
    rule.__name__ = f"nonempty({base.__name__})"
    return rule


def _keepdim_index(v: OpView, default: int | None) -> int:
    """Position of `keepdim` in the op's schema (overloads differ: var.dim/std.dim take it 4th, positionally;
    var.correction takes it as a keyword only), else `default`; len(args) when it is keyword-only."""
    schema = getattr(v.target, "_schema", None)
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.name == "keepdim":
                return len(v.args) if a.kwarg_only else i
    return len(v.args) if default is None else default


def inplace(base: Callable[[OpView], list[AxisOption]]) -> Callable[[OpView], list[AxisOption]]:
    """The rule of an in-place op (`add_`, `fill_`, `relu_`, `copy_`, `index_put_`, ...): its out-of-place
    rule's options in which the mutated first input keeps its layout (it is written where it lives: the
    planner also forbids any redistribution on the way to it, `edge_roles.mutation_edges`)."""
    def rule(v: OpView) -> list[AxisOption]:
        return [o for o in base(v) if o.inputs and o.inputs[0] == o.output]
    rule.__doc__ = f"In-place form of `{base.__name__}`: options where the mutated input keeps its layout."
    rule.__name__ = f"inplace({base.__name__})"
    return rule
