"""Rules of contractions: linear, addmm, mm/bmm/matmul, einsum, embedding, scaled_dot_product_attention.

A contraction is linear in each operand, so one Partial operand with the others Replicate gives a Partial
output; sharding a contracted dim on both operands gives a Partial output too. A bias inside the op
(aten.linear / addmm as a hand-made graph has them; the tracer splits them off) would be added once per
rank under a Partial output, so those options exist only without a bias.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor.placement_types import Shard

from .base import OUT, P, R, AxisOption, OpView, replicate, same_dims


def linear(v: OpView) -> list[AxisOption]:
    """x (..., C) @ W (O, C)^T [+ b (O)]: batch dims of x; column parallel (W S(0) -> out S(-1)); row
    parallel (x S(-1), W S(1) -> Partial) and Partial x (W Replicate -> Partial) without a bias."""
    k, bias = v.nd(), v.n_in == 3
    b = (lambda p: (p,) if bias else ())
    opts = [replicate(v)]
    opts += [AxisOption((Shard(d), R) + b(R), Shard(d)) for d in range(k - 1) if v.in_shapes[0][d] > 1]
    opts.append(AxisOption((R, Shard(0)) + b(Shard(0)), Shard(k - 1)))
    if not bias:
        opts += [AxisOption((Shard(k - 1), Shard(1)), P), AxisOption((P, R), P)]
    return opts


def bilinear(v: OpView) -> list[AxisOption]:
    """bilinear(x1 (..., I1), x2 (..., I2), W (O, I1, I2), b (O)?) -> (..., O), y_o = x1^T W_o x2 + b_o: shard
    a leading dim on x1 and x2 alike; the output features (W, b S(0) -> out S(-1)); without a bias a
    contracted feature (x1 S(-1), W S(1) or x2 S(-1), W S(2) -> Partial) and a Partial x1, x2 or W with the
    others Replicate (bilinear in x1 and x2, linear in W). Shards must be equal: torch's bilinear reshapes an
    empty shard to (-1, 0), which it rejects."""
    k, bias = v.nd(), v.n_in == 4
    if v.nd(1) != k:
        return [replicate(v)]
    b = (lambda p: (p,) if bias else ())
    opts = [replicate(v)] + [AxisOption((Shard(d), Shard(d), R) + b(R), Shard(d), (0, 1, OUT)) for d in range(k - 1)
                             if v.in_shapes[0][d] > 1 and v.in_shapes[1][d] == v.in_shapes[0][d]]
    opts.append(AxisOption((R, R, Shard(0)) + b(Shard(0)), Shard(k - 1), (2, OUT)))
    if not bias:
        opts += [AxisOption((Shard(k - 1), R, Shard(1)), P, (0, 2)), AxisOption((R, Shard(k - 1), Shard(2)), P, (1, 2)),
                 AxisOption((P, R, R), P), AxisOption((R, P, R), P), AxisOption((R, R, P), P)]
    return opts


def grouped_mm(v: OpView) -> list[AxisOption]:
    """transformers' `grouped_mm_fallback(x (S, K), W (E, K, N), offs (E,)) -> (S, N)`: row block g of x (rows
    offs[g-1]:offs[g], tokens sorted by expert) times W[g] (an MoE's experts; Mixtral and the transformers 5
    MoE families on CPU / float32). The output features (W S(2) -> out S(1)); the contracted features
    (x S(1), W S(1) -> Partial); a Partial x or W with the other Replicate (linear in each). Never the tokens or
    the experts: `offs` holds global row positions, which no shard's rows keep."""
    return [replicate(v), AxisOption((R, Shard(2), R), Shard(1)), AxisOption((Shard(1), Shard(1), R), P),
            AxisOption((P, R, R), P), AxisOption((R, P, R), P)]


def addmm(v: OpView) -> list[AxisOption]:
    """bias + m1 (N, C) @ m2 (C, O) (GPT-2's Conv1D as a hand-made graph has it; the tracer splits the bias
    off): shard rows of m1 or columns of m2, the bias broadcast to (N, O) alike."""
    bias_for = lambda d: same_dims(OpView(v.target, (), {}, v.in_shapes[:1], v.out_shapes), d)[0]
    return [replicate(v), AxisOption((bias_for(0), Shard(0), R), Shard(0)),
            AxisOption((bias_for(1), R, Shard(1)), Shard(1))]


def baddbmm(v: OpView) -> list[AxisOption]:
    """beta * self + alpha * b1 (B, N, C) @ b2 (B, C, O), `self` broadcast to (B, N, O) (attention scores
    plus a mask in torch's MultiheadAttention): shard the batch, the rows of b1 or the columns of b2, `self`
    alike where it has that dim. Never the contraction: `self` would be added once per summand."""
    if any(len(s) != 3 for s in v.in_shapes[1:]):
        return [replicate(v)]
    self_for = lambda d: same_dims(OpView(v.target, (), {}, v.in_shapes[:1], v.out_shapes), d)[0]
    return [replicate(v)] + [AxisOption((self_for(d),) + ab, Shard(d)) for d, ab in
                             ((0, (Shard(0), Shard(0))), (1, (Shard(1), R)), (2, (R, Shard(2)))) if v.out[d] > 1]


def distance(reduced: Callable[[OpView, tuple[int, ...]], int]) -> Callable[[OpView], list[AxisOption]]:
    """Rule of cosine_similarity(x1, x2, dim) / pairwise_distance(x1, x2, p, eps, keepdim): a reduction over
    one dim (`reduced(v, broadcast shape)`) of the broadcast inputs: shard any other dim, both inputs alike
    where they have it."""
    def rule(v: OpView) -> list[AxisOption]:
        full = tuple(torch.broadcast_shapes(*v.in_shapes))
        r = reduced(v, full)
        keep = len(v.out) == len(full)
        return [replicate(v)] + [AxisOption(same_dims(v, d, out=full), Shard(d if keep or d < r else d - 1))
                                 for d in range(len(full)) if d != r and full[d] > 1]
    rule.__name__ = f"distance({reduced.__name__})"
    rule.__doc__ = distance.__doc__
    return rule


def cosine_dim(v: OpView, full: tuple[int, ...]) -> int:
    return v.arg(2, "dim", 1) % len(full)


def last_dim(v: OpView, full: tuple[int, ...]) -> int:
    return len(full) - 1


def vecdot_dim(v: OpView, full: tuple[int, ...]) -> int:
    return v.arg(2, "dim", -1) % len(full)


def cross(v: OpView) -> list[AxisOption]:
    """linalg_cross(a, b, dim) (3-vectors along `dim`, broadcast like a pointwise op): shard any other dim of
    the broadcast shape, both inputs alike where they have it."""
    full = tuple(torch.broadcast_shapes(*v.in_shapes))
    r = v.arg(2, "dim", -1) % len(full)
    return [replicate(v)] + [AxisOption(same_dims(v, d, out=full), Shard(d)) for d in range(len(full)) if d != r and full[d] > 1]


def cdist(v: OpView) -> list[AxisOption]:
    """cdist(x1 (*, P, M), x2 (*, R, M)) -> (*, P, R): shard a batch dim on both, P on x1 or R on x2."""
    (a, b), out = v.in_shapes, v.out
    if len(a) != len(b):
        return [replicate(v)]
    opts = [replicate(v)] + [AxisOption((Shard(d), Shard(d)), Shard(d)) for d in range(len(a) - 2) if out[d] > 1]
    return opts + [AxisOption((Shard(len(a) - 2), R), Shard(len(out) - 2)),
                   AxisOption((R, Shard(len(b) - 2)), Shard(len(out) - 1))]


def matmul(v: OpView) -> list[AxisOption]:
    """mm / bmm / matmul (..., M, K) @ (..., K, N) with broadcast batch dims (both operands >= 2-D)."""
    (a, b), out = v.in_shapes, v.out
    if len(a) < 2 or len(b) < 2:
        return [replicate(v)]
    opts = [replicate(v)]
    for d in range(len(out) - 2):
        pa = same_dims(v, d, (a[:-2], b[:-2]), out[:-2])
        if any(isinstance(p, Shard) for p in pa) and out[d] > 1:
            opts.append(AxisOption(pa, Shard(d)))
    opts += [AxisOption((Shard(len(a) - 2), R), Shard(len(out) - 2)),
             AxisOption((R, Shard(len(b) - 1)), Shard(len(out) - 1)),
             AxisOption((Shard(len(a) - 1), Shard(len(b) - 2)), P),
             AxisOption((P, R), P), AxisOption((R, P), P)]
    return opts


def _einsum_terms(v: OpView) -> tuple[list[str], str] | None:
    """Operand and output subscripts of an einsum with '...' spelled out as letters; None if unparsable."""
    eq = v.arg(0, "equation").replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != v.n_in:
        return None
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    ell = max((len(s) - (len(t) - 3) for t, s in zip(ins, v.in_shapes) if "..." in t), default=0)
    fill = "".join(spare[:ell])
    terms = []
    for t, s in zip(ins, v.in_shapes):
        if "..." in t:
            n = len(s) - (len(t) - 3)
            t = t.replace("...", fill[ell - n:])
        if len(t) != len(s):
            return None
        terms.append(t)
    if not arrow:  # implicit output: letters used once, sorted
        letters = "".join(terms)
        out = "..." + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in fill))
    out = out.replace("...", fill)
    return terms, out


def einsum(v: OpView) -> list[AxisOption]:
    """einsum(equation, operands): shard a letter kept in the output on every operand that has it at the
    output's size (Replicate where it broadcasts); shard a summed letter on every operand that has it
    (-> Partial); one Partial operand with the others Replicate -> Partial (einsum is multilinear).
    Letters repeated inside one operand (diagonals) are never sharded."""
    parsed = _einsum_terms(v)
    if parsed is None:
        return [replicate(v)]
    terms, out = parsed
    opts = [replicate(v)]
    for c in dict.fromkeys("".join(terms)):
        if any(t.count(c) > 1 for t in terms) or out.count(c) > 1:
            continue
        sizes = [s[t.index(c)] for t, s in zip(terms, v.in_shapes) if c in t]
        if c in out:
            size = v.out[out.index(c)]
            if size == 1:
                continue
            ins = tuple(Shard(t.index(c)) if c in t and s[t.index(c)] == size else R for t, s in zip(terms, v.in_shapes))
            opts.append(AxisOption(ins, Shard(out.index(c))))
        elif len(set(sizes)) == 1 and sizes[0] > 1:
            opts.append(AxisOption(tuple(Shard(t.index(c)) if c in t else R for t in terms), P))
    if v.out_is_float:
        opts += [AxisOption(tuple(P if j == i else R for j in range(v.n_in)), P) for i in range(v.n_in)]
    return opts


def embedding(v: OpView) -> list[AxisOption]:
    """weight (V, C), indices (...): batch dims of the indices; column (C); vocab parallel (V -> Partial,
    Megatron's VocabParallelEmbedding: each rank looks up the ids of its own rows, the others read zeros;
    uneven vocabularies allowed) without scale_grad_by_freq / sparse.

    With scale_grad_by_freq the backward divides a row's gradient by the number of times its id occurs in
    ALL the indices, so the indices are never sharded (a shard would count only its own occurrences: a
    gradient 2x off for an id seen once on each of two ranks); the column split keeps every index."""
    k = len(v.out)
    freq = bool(v.arg(3, "scale_grad_by_freq", False))
    opts = [replicate(v)] + [AxisOption((R, Shard(d)), Shard(d)) for d in range(k - 1) if v.out[d] > 1 and not freq]
    opts.append(AxisOption((Shard(1), R), Shard(k - 1)))
    if not freq and not v.arg(4, "sparse", False):
        opts.append(AxisOption((Shard(0), R), P))
    return opts


def sdpa(v: OpView) -> list[AxisOption]:
    """q (*, H, L, E), k/v (*, Hkv, S, E), optional mask broadcast to (*, H, L, S): shard a leading dim (the
    batch, the heads, a group of heads), never L, S or E, which every output row reads whole (with
    grouped-query attention, H != Hkv, q and k/v heads must split evenly so that every local query head keeps
    its key/value head). The leading dims are all but the last two at any rank: a call on (B, L, E) (one head,
    no head dim) has only the batch. (Before round 16 (r16a) dims 0 and 1 were taken as batch and heads at
    every rank, so a 3-D call could shard L and S: each rank attended over its own keys only, outputs 21x off
    one device's in the rule harness, silently.)"""
    opts = [replicate(v)]
    nd = v.nd()
    heads = nd - 3
    gqa = heads >= 0 and v.in_shapes[0][heads] != v.in_shapes[1][heads]
    for d in range(nd - 2):
        if v.out[d] == 1 or any(len(s) != nd or (s[d] != v.out[d] and not (gqa and d == heads))
                                for s in v.in_shapes[:3]):
            continue
        pl = (Shard(d),) * 3
        if v.n_in > 3:
            m = v.in_shapes[3]
            k = d - (nd - len(m))
            pl += (Shard(k) if k >= 0 and m[k] == v.out[d] else R,) + (R,) * (v.n_in - 4)
        opts.append(AxisOption(pl, Shard(d), (0, 1, 2, OUT) if d == heads and gqa else ()))
    return opts
