"""Rules of neural-network ops: normalisations, convolutions, pooling, losses, recurrent layers.

Ops whose local form differs from the op itself (synchronised batch statistics, the cross-entropy
denominator, vocabulary-parallel cross-entropy) are emitted by `rewriter.localize`; every option here is
executed by the rule harness (tests/rules) against the op on global tensors.
"""
from __future__ import annotations

from torch.distributed.tensor.placement_types import Shard

from .base import OUT, P, R, AxisOption, OpView, replicate


def layer_norm(v: OpView) -> list[AxisOption]:
    """layer_norm / rms_norm: x (..., *normalized_shape), weight/bias Replicate: shard the leading dims."""
    m = len(v.arg(1, "normalized_shape"))
    extra = (R,) * (v.n_in - 1)
    return [replicate(v)] + [AxisOption((Shard(d),) + extra, Shard(d)) for d in range(v.nd() - m) if v.out[d] > 1]


def group_norm(v: OpView) -> list[AxisOption]:
    """group_norm(x (N, C, ...), groups, weight, bias): shard the batch."""
    extra = (R,) * (v.n_in - 1)
    return [replicate(v)] + ([AxisOption((Shard(0),) + extra, Shard(0))] if v.out[0] > 1 else [])


def batch_norm(v: OpView) -> list[AxisOption]:
    """batch_norm(x (N, C, *), weight, bias, running_mean, running_var, training, ...): shard any dim but
    the channels; in training the statistics are synchronised over the sharded axes (SyncBatchNorm: the
    per-channel counts, sums and squared deviations are all-reduced, `rewriter.localize.sync_batch_norm`),
    so the running buffers, updated in place, stay equal on every rank."""
    extra = (R,) * (v.n_in - 1)
    return [replicate(v)] + [AxisOption((Shard(d),) + extra, Shard(d)) for d in range(v.nd()) if d != 1 and v.out[d] > 1]


def convolution(v: OpView) -> list[AxisOption]:
    """conv1d/2d/3d (x (N, Cin, *), w (Cout, Cin/groups, *k), bias (Cout)?, ..., groups): batch parallel;
    with groups == 1 also output channels (w S(0) -> out S(1)), and without a bias input channels
    (x S(1), w S(1) -> Partial) and a Partial input (w Replicate -> Partial). Channel shards must be even:
    torch's conv rejects a weight with no output channel and mis-shapes an input with no channel."""
    groups = v.arg(6, "groups", 1)
    bias = v.n_in == 3
    b = (lambda p: (p,) if bias else ())
    if v.nd(0) != v.nd(1):  # unbatched input
        return [replicate(v)]
    opts = [replicate(v)] + ([AxisOption((Shard(0), R) + b(R), Shard(0))] if v.out[0] > 1 else [])
    if groups == 1:  # (torch's conv rejects an empty output-channel shard: even shards only)
        opts.append(AxisOption((R, Shard(0)) + b(Shard(0)), Shard(1), (1, OUT)))
        if not bias:  # (torch's conv returns a wrong shape for an empty channel shard: even shards only)
            opts += [AxisOption((Shard(1), Shard(1)), P, (0, 1)), AxisOption((P, R), P)]
    return opts


def pooling(linear: bool, spatial: int):
    """Rule of max/avg (adaptive) pooling over the trailing `spatial` dims: shard the leading dims (batch,
    channels); Partial passes through average pooling (`linear`)."""
    def rule(v: OpView) -> list[AxisOption]:  # (torch's pooling rejects empty non-batch dims: even there)
        opts = [replicate(v)] + [AxisOption((Shard(d),), Shard(d), () if d == 0 else (0, OUT))
                                 for d in range(v.nd() - spatial) if v.in_shapes[0][d] > 1]
        return opts + [AxisOption((P,), P)] if linear and v.out_is_float else opts
    rule.__name__ = f"{'avg' if linear else 'max'}_pooling_{spatial}d"
    rule.__doc__ = pooling.__doc__
    return rule


def cross_entropy(v: OpView) -> list[AxisOption]:
    """cross_entropy_loss(input (N, C, d1..) or (C,), target, weight, reduction, ignore_index, label_smoothing):
    shard N or a d_i on input and target alike; reduction "none" keeps the shard, "mean"/"sum" give Partial
    (the local form divides the local sum by the GLOBAL denominator: the count, or the sum of class weights,
    of the targets that are not ignored). With class-index targets of a 2-D input and no class weights or
    label smoothing, also vocabulary parallel: input S(1) (the classes), target Replicate -> Replicate
    (Megatron's vocab-parallel cross-entropy: max, sum of exponentials and target logit all-reduced)."""
    reduction = v.arg(3, "reduction", 1)
    if v.nd() < 2:
        return [replicate(v)]
    index_target = v.nd(1) == v.nd() - 1
    opts = [replicate(v)]
    extra = (R,) * (v.n_in - 2)
    for d in range(v.nd()):
        if d == 1 or v.in_shapes[0][d] == 1:
            continue
        t = d if d == 0 else (d - 1 if index_target else d)
        out = Shard(t) if reduction == 0 else P
        opts.append(AxisOption((Shard(d), Shard(t)) + extra, out))
    plain = v.arg(2, "weight") is None and not v.arg(5, "label_smoothing", 0.0)
    if index_target and v.nd() == 2 and plain and v.in_shapes[0][1] > 1:
        opts.append(AxisOption((Shard(1), R) + extra, R))
    return opts


def lstm(v: OpView) -> list[AxisOption]:
    """aten.lstm.input(x (L, N, H), [h0, c0] (layers*dirs, N, Hout), params, ..., batch_first=False):
    shard the batch N on x, h0, c0 and every output; weights Replicate. (The tracer rewrites batch_first
    models to this form, `tracer.normalize`.)"""
    if v.arg(8, "batch_first", False) or v.in_shapes[0][1] == 1 or v.nd() != 3:
        return [replicate(v)]
    return [replicate(v), AxisOption((Shard(1), Shard(1), Shard(1)) + (R,) * (v.n_in - 3), Shard(1))]
