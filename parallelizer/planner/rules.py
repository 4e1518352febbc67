"""Per-op sharding rules on ONE mesh axis, written for the ops of torch.export's training IR.

Why our own rules and not DTensor's: torch 2.13's `DTensor._op_dispatcher.sharding_propagator.
op_strategy_funcs` has no entries for the composite ops this IR keeps whole (aten.linear, layer_norm,
scaled_dot_product_attention, cross_entropy_loss, embedding, gelu, add.Tensor, softmax.int, dropout are
absent; checked on torch 2.13.0+cpu), so an adapter would have to re-decompose them. The rules below are
DTensor's strategies restated for those ops.

A rule maps an `OpView` to a list of `AxisOption`s: for one mesh axis, the placement of every tensor input
(in `OpView.in_shapes` order) and of the output (shared by all outputs of a multi-output op). The all-
Replicate option is always first. `None` means "no rule": the planner replicates the node and records a
fallback. Multi-axis strategies are products of per-axis options (`strategies.py`).

Conventions the rewriter follows:
  * Partial("avg") is a mean of per-rank values (loss 'mean' over a batch-sharded dim).
  * An input that is Replicate on an axis where the output is Partial (a linear bias under row-parallel
    linear, the R operand of P*R) contributes once per rank: the rewriter divides it by the axis size
    (DTensor's Replicate->Partial partition), and its gradient is a partial sum (`grad_all_reduce`).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

import torch
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

aten = torch.ops.aten
R = Replicate()
P_SUM, P_AVG = Partial("sum"), Partial("avg")
AxisOption = tuple[tuple[Placement, ...], Placement]


@dataclass(frozen=True)
class OpView:
    """What a rule sees of a node: target, raw args/kwargs (fx Nodes inside), tensor input shapes (in
    order of appearance in args then kwargs), output shapes, and the mesh axis size."""

    target: object
    args: tuple
    kwargs: dict
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    out_is_float: bool

    @property
    def out(self) -> tuple[int, ...]:
        return self.out_shapes[0] if self.out_shapes else ()

    def arg(self, i: int, name: str, default=None):
        if len(self.args) > i:
            return self.args[i]
        return self.kwargs.get(name, default)


def _rep(v: OpView) -> AxisOption:
    return ((R,) * len(v.in_shapes), R)


def _bcast(v: OpView, d: int) -> tuple[Placement, ...]:
    """Placement of each input for output dim d under right-aligned broadcasting (R where broadcast)."""
    out, res = v.out, []
    for s in v.in_shapes:
        k = d - (len(out) - len(s))
        res.append(Shard(k) if k >= 0 and s[k] == out[d] else R)
    return tuple(res)


_LINEAR_PARTIAL = {aten.add.Tensor: "all", aten.sub.Tensor: "all", aten.mul.Tensor: "one",
                   aten.div.Tensor: "first"}
_PARTIAL_UNARY = {aten.neg, aten.clone, aten.contiguous, aten.alias, aten.detach, aten.dropout, aten._to_copy,
                  aten.to, aten.add, aten.sub, aten.mul, aten.div, aten.lift_fresh_copy}


def elementwise(v: OpView) -> list[AxisOption]:
    """Pointwise ops with broadcasting: shard any output dim of size > 1; Partial through linear ops."""
    opts = [_rep(v)]
    opts += [(_bcast(v, d), Shard(d)) for d in range(len(v.out)) if v.out[d] > 1]
    n = len(v.in_shapes)
    if not v.out_is_float or n == 0:
        return opts
    kind = _LINEAR_PARTIAL.get(v.target)
    if n == 1 and getattr(v.target, "overloadpacket", None) in _PARTIAL_UNARY:
        opts.append(((P_SUM,), P_SUM))
    elif kind == "all":
        opts.append(((P_SUM,) * n, P_SUM))
    elif kind in ("one", "first") and n == 2:
        opts.append(((P_SUM, R), P_SUM))
        if kind == "one":
            opts.append(((R, P_SUM), P_SUM))
    return opts


def reshape_like(v: OpView) -> list[AxisOption]:
    """view / reshape / flatten / unsqueeze / squeeze: a shard of input dim d maps to the output dim e with
    the same prefix product (the flattened blocks coincide); Partial passes through."""
    src, dst = v.in_shapes[0], v.out
    opts = [_rep(v)]
    for d in range(len(src)):
        if src[d] == 1:
            continue
        prefix = math.prod(src[:d])
        for e in range(len(dst)):
            if dst[e] > 1 and math.prod(dst[:e]) == prefix:
                opts.append(((Shard(d),), Shard(e)))
                break
    return opts + [((P_SUM,), P_SUM)] if v.out_is_float else opts


def _dim_map_rule(mapping: Callable[[OpView, int], int | None]) -> Callable[[OpView], list[AxisOption]]:
    def rule(v: OpView) -> list[AxisOption]:
        opts = [_rep(v)]
        extra = (R,) * (len(v.in_shapes) - 1)
        for d in range(len(v.in_shapes[0])):
            e = mapping(v, d)
            if e is not None and v.in_shapes[0][d] > 1:
                opts.append(((Shard(d),) + extra, Shard(e)))
        if v.out_is_float and getattr(v.target, "overloadpacket", None) is not aten.cat:
            opts.append(((P_SUM,) + extra, P_SUM))
        return opts
    return rule


def _nd(v: OpView) -> int:
    return len(v.in_shapes[0])


def _transpose_map(v: OpView, d: int) -> int:
    a, b = (x % _nd(v) for x in (v.arg(1, "dim0", 0), v.arg(2, "dim1", 1)))
    return b if d == a else a if d == b else d


def _permute_map(v: OpView, d: int) -> int:
    perm = [p % _nd(v) for p in v.arg(1, "dims")]
    return perm.index(d)


def _except_dim(index: int) -> Callable[[OpView, int], int | None]:
    """Identity map except for the op's `dim` argument (positional `index`, default 0)."""
    def m(v: OpView, d: int) -> int | None:
        return None if d == v.arg(index, "dim", 0) % _nd(v) else d
    return m


def _select_map(v: OpView, d: int) -> int | None:
    dim = v.arg(1, "dim") % _nd(v)
    return None if d == dim else d if d < dim else d - 1


def _expand_map(v: OpView, d: int) -> int | None:
    off = len(v.out) - _nd(v)
    return d + off if v.in_shapes[0][d] == v.out[d + off] else None


def _cat_rule(v: OpView) -> list[AxisOption]:
    dim = v.arg(1, "dim", 0) % len(v.out)
    opts = [_rep(v)]
    for d in range(len(v.out)):
        if d != dim and v.out[d] > 1 and all(len(s) == len(v.out) for s in v.in_shapes):
            opts.append(((Shard(d),) * len(v.in_shapes), Shard(d)))
    return opts


def _t_map(v: OpView, d: int) -> int:
    return 1 - d if _nd(v) == 2 else d


def reduction(v: OpView) -> list[AxisOption]:
    """sum / mean over dims: shard kept dims; a shard of a reduced dim gives Partial (sum) / Partial (avg)."""
    nd = _nd(v)
    dims = v.arg(1, "dim")
    dims = list(range(nd)) if dims is None or dims == [] else [x % nd for x in (dims if isinstance(dims, (list, tuple)) else [dims])]
    keep = bool(v.arg(2, "keepdim", False))
    reduced = P_AVG if v.target.overloadpacket is aten.mean else P_SUM
    opts = [_rep(v)]
    for d in range(nd):
        if v.in_shapes[0][d] == 1:
            continue
        if d in dims:
            opts.append(((Shard(d),), reduced))
        else:
            opts.append(((Shard(d),), Shard(d if keep else d - sum(x < d for x in dims))))
    return opts + [((P_SUM,), P_SUM)]


def softmax(v: OpView) -> list[AxisOption]:
    dim = v.arg(1, "dim") % _nd(v)
    return [_rep(v)] + [((Shard(d),), Shard(d)) for d in range(_nd(v)) if d != dim and v.out[d] > 1]


def linear(v: OpView) -> list[AxisOption]:
    """x (..., C) @ W (O, C)^T + b (O): batch dims of x; column (W S(0) -> out S(-1)); row (x S(-1), W S(1)
    -> Partial)."""
    k, bias = len(v.in_shapes[0]), len(v.in_shapes) == 3
    b = (lambda p: (p,) if bias else ())
    opts = [_rep(v)]
    opts += [((Shard(d), R) + b(R), Shard(d)) for d in range(k - 1)]
    opts.append(((R, Shard(0)) + b(Shard(0)), Shard(k - 1)))
    opts.append(((Shard(k - 1), Shard(1)) + b(R), P_SUM))
    return opts


def addmm(v: OpView) -> list[AxisOption]:
    """bias + m1 (N, C) @ m2 (C, O) (GPT-2 Conv1D); bias broadcast to (N, O)."""
    bias_n = lambda d: _bcast(OpView(v.target, (), {}, v.in_shapes[:1], v.out_shapes, True), d)[0]
    return [_rep(v), ((bias_n(0), Shard(0), R), Shard(0)), ((bias_n(1), R, Shard(1)), Shard(1)),
            ((R, Shard(1), Shard(0)), P_SUM)]


def matmul(v: OpView) -> list[AxisOption]:
    """mm / bmm / matmul (..., M, K) @ (..., K, N) with broadcast batch dims (both operands >= 2-D)."""
    (a, b), out = v.in_shapes, v.out
    if len(a) < 2 or len(b) < 2:
        return [_rep(v)]
    opts = [_rep(v)]
    for d in range(len(out) - 2):
        pa = _bcast(OpView(v.target, (), {}, (a[:-2], b[:-2]), (out[:-2],), True), d)
        if any(isinstance(p, Shard) for p in pa):
            opts.append((pa, Shard(d)))
    opts += [((Shard(len(a) - 2), R), Shard(len(out) - 2)), ((R, Shard(len(b) - 1)), Shard(len(out) - 1)),
             ((Shard(len(a) - 1), Shard(len(b) - 2)), P_SUM)]
    return opts


def layer_norm(v: OpView) -> list[AxisOption]:
    """x (..., *normalized_shape), weight/bias R: shard the leading (non-normalized) dims."""
    m = len(v.arg(1, "normalized_shape"))
    extra = (R,) * (len(v.in_shapes) - 1)
    return [_rep(v)] + [((Shard(d),) + extra, Shard(d)) for d in range(_nd(v) - m) if v.out[d] > 1]


def embedding(v: OpView) -> list[AxisOption]:
    """weight (V, C), indices (...): batch dims of the indices; column (C); vocab-parallel (V -> Partial,
    Megatron's VocabParallelEmbedding: out-of-shard ids read zeros)."""
    k = len(v.out)
    return ([_rep(v)] + [((R, Shard(d)), Shard(d)) for d in range(k - 1)]
            + [((Shard(1), R), Shard(k - 1)), ((Shard(0), R), P_SUM)])


def sdpa(v: OpView) -> list[AxisOption]:
    """q (B, H, L, E), k/v (B, Hkv, S, E), optional mask broadcast to (B, H, L, S): shard batch or heads."""
    opts = [_rep(v)]
    for d in (0, 1):
        pl = tuple(Shard(d) for _ in range(3))
        if len(v.in_shapes) > 3:
            m = v.in_shapes[3]
            k = d - (4 - len(m))
            pl += (Shard(k) if k >= 0 and m[k] == v.out[d] else R,) + (R,) * (len(v.in_shapes) - 4)
        opts.append((pl, Shard(d)))
    return opts


def cross_entropy(v: OpView) -> list[AxisOption]:
    """logits (N, C[, d...]), target (N[, d...]): batch-shard N; 'mean' -> Partial(avg) (exact when no
    ignore_index hits; else approximate), 'sum' -> Partial(sum), 'none' -> Shard(0)."""
    reduction_ = v.arg(3, "reduction", 1)
    out = {0: Shard(0), 1: P_AVG, 2: P_SUM}[reduction_]
    return [_rep(v), ((Shard(0), Shard(0)) + (R,) * (len(v.in_shapes) - 2), out)]


def creation(v: OpView) -> list[AxisOption]:
    return [_rep(v)]


def getitem(v: OpView) -> list[AxisOption]:
    opts = [_rep(v)] + [((Shard(d),), Shard(d)) for d in range(len(v.out)) if v.out[d] > 1]
    return opts + [((P_SUM,), P_SUM), ((P_AVG,), P_AVG)]


_ELEMENTWISE = ("add", "sub", "mul", "div", "gelu", "relu", "silu", "tanh", "sigmoid", "neg", "exp", "log",
                "rsqrt", "sqrt", "pow", "cos", "sin", "abs", "dropout", "clone", "contiguous", "alias",
                "detach", "to", "_to_copy", "type_as", "where", "masked_fill", "eq", "ne", "le", "lt", "ge", "gt",
                "__and__", "__or__", "bitwise_not", "logical_not", "maximum", "minimum", "clamp", "erf",
                "lift_fresh_copy", "native_dropout", "reciprocal", "square", "tril", "triu")
_RESHAPE = ("view", "reshape", "_unsafe_view", "flatten", "unflatten", "unsqueeze", "squeeze")
_CREATION = ("arange", "zeros", "ones", "full", "empty", "new_ones", "new_zeros", "new_full", "new_empty",
             "scalar_tensor", "zeros_like", "ones_like", "full_like", "empty_like", "rand", "randn")

RULES: dict[object, Callable[[OpView], list[AxisOption] | None]] = {
    **{getattr(aten, n): elementwise for n in _ELEMENTWISE},
    **{getattr(aten, n): reshape_like for n in _RESHAPE},
    **{getattr(aten, n): creation for n in _CREATION},
    aten.transpose: _dim_map_rule(_transpose_map), aten.permute: _dim_map_rule(_permute_map),
    aten.t: _dim_map_rule(_t_map), aten.expand: _dim_map_rule(_expand_map),
    aten.slice: _dim_map_rule(_except_dim(1)), aten.split: _dim_map_rule(_except_dim(2)),
    aten.split_with_sizes: _dim_map_rule(_except_dim(2)), aten.select: _dim_map_rule(_select_map),
    aten.cat: _cat_rule, aten.sum: reduction, aten.mean: reduction,
    aten.softmax: softmax, aten._softmax: softmax, aten.log_softmax: softmax, aten._log_softmax: softmax,
    aten.linear: linear, aten.addmm: addmm, aten.mm: matmul, aten.bmm: matmul, aten.matmul: matmul,
    aten.layer_norm: layer_norm, aten.embedding: embedding, aten.scaled_dot_product_attention: sdpa,
    aten.cross_entropy_loss: cross_entropy, operator.getitem: getitem,
}


def rule_for(target: object) -> Callable[[OpView], list[AxisOption] | None] | None:
    """The rule of an OpOverload (looked up by its packet) or of operator.getitem; None when there is none."""
    packet = getattr(target, "overloadpacket", target)
    rule = RULES.get(packet)
    if rule is elementwise and packet is aten.pow and getattr(target, "_overloadname", "") != "Tensor_Scalar":
        return None
    return rule
