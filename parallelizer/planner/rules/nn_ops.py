"""Rules of neural-network ops: normalisations, convolutions, pooling, losses, recurrent layers.

Ops whose local form differs from the op itself (synchronised batch statistics, the cross-entropy
denominator, vocabulary-parallel cross-entropy) are emitted by `rewriter.localize`; every option here is
executed by the rule harness (tests/rules) against the op on global tensors.
"""
from __future__ import annotations

from torch.distributed.tensor.placement_types import Shard

from .base import OUT, P, R, AxisOption, OpView, aten, replicate


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
    return _conv(v, out_dim=0, in_dim=1)


def conv_transpose(v: OpView) -> list[AxisOption]:
    """conv_transpose1d/2d/3d (x (N, Cin, *), w (Cin, Cout/groups, *k), bias (Cout)?, stride, padding,
    output_padding, groups, dilation): as `convolution`, the weight's channel dims swapped (output channels
    are w's dim 1, input channels its dim 0). A decoder's upsampling (U-Nets, DETR-style heads, audio
    vocoders)."""
    return _conv(v, out_dim=1, in_dim=0)


def _conv(v: OpView, out_dim: int, in_dim: int) -> list[AxisOption]:
    groups = v.arg(6, "groups", 1)  # (conv: arg 6 after dilation; conv_transpose: arg 6 after output_padding)
    bias = v.n_in == 3
    b = (lambda p: (p,) if bias else ())
    if v.nd(0) != v.nd(1):  # unbatched input
        return [replicate(v)]
    opts = [replicate(v)] + ([AxisOption((Shard(0), R) + b(R), Shard(0))] if v.out[0] > 1 else [])
    if groups == 1:  # (torch's conv rejects an empty output-channel shard: even shards only)
        opts.append(AxisOption((R, Shard(out_dim)) + b(Shard(0)), Shard(1), (1, OUT)))
        if not bias:  # (torch's conv returns a wrong shape for an empty channel shard: even shards only)
            opts += [AxisOption((Shard(1), Shard(in_dim)), P, (0, 1)), AxisOption((P, R), P)]
    return opts


def leading_dims(linear: bool, spatial: int, even_batch: bool = False):
    """Rule of an op independent over the leading dims of its inputs (all but the trailing `spatial`):
    max/avg (adaptive) pooling, max pooling with indices and unpooling (the indices address positions
    inside one (batch, channel) plane), upsampling / interpolation of every mode, pixel (un)shuffle
    (channels and space mix: `spatial` = 3), im2col / col2im. Every tensor input is sharded alike; Partial
    passes through the ops linear in their single input (`linear`: average pooling, interpolation, data
    movement). `even_batch`: the batch shards must be equal too (on an empty batch shard torch 2.13's meta function
    of upsample_nearest1d raises TypeError and pixel_shuffle's backward returns a wrong shape)."""
    def rule(v: OpView) -> list[AxisOption]:  # (torch's pooling rejects empty non-batch dims: even there)
        if any(len(s) != v.nd() for s in v.in_shapes):
            return [replicate(v)]
        every = tuple(range(v.n_in))
        opts = [replicate(v)] + [AxisOption((Shard(d),) * v.n_in, Shard(d), () if d == 0 and not even_batch else every + (OUT,))
                                 for d in range(v.nd() - spatial) if v.in_shapes[0][d] > 1]
        return opts + [AxisOption((P,), P)] if linear and v.out_is_float and v.n_in == 1 else opts
    rule.__name__ = f"{'linear' if linear else 'nonlinear'}_leading_dims_{spatial}d"
    rule.__doc__ = leading_dims.__doc__
    return rule


def prelu(v: OpView) -> list[AxisOption]:
    """prelu(x (N, C, *), weight (C,), (1,) or () ): shard any dim of x; on the channel dim 1 a per-channel
    weight is sharded alike (a single shared slope, of shape (1,) or 0-d, stays Replicate; before, a 0-d
    slope made planning raise a raw IndexError)."""
    if v.nd() < 2:
        return [replicate(v)]
    per_channel = v.nd(1) == 1 and v.in_shapes[1][0] == v.in_shapes[0][1] and v.in_shapes[1][0] > 1
    return [replicate(v)] + [AxisOption((Shard(d), Shard(0) if d == 1 and per_channel else R), Shard(d))
                             for d in range(v.nd()) if v.in_shapes[0][d] > 1]


def instance_norm(v: OpView) -> list[AxisOption]:
    """instance_norm(x (N, C, *), weight, bias, running_mean, running_var (C,)?, use_input_stats, ...):
    statistics per (sample, channel), so the channel dim shards with every per-channel tensor alike, and
    the batch dim with them Replicate. When running statistics are updated (use_input_stats with running
    buffers: InstanceNorm(track_running_stats=True) in training) the update averages the per-instance
    statistics over the whole batch, and writes buffers that the schema does not mark as written
    (`tracer.graph.mutated_args` knows): only the batch shard, with the buffers Replicate and the batch sums
    of the statistics all-reduced before the update, so every rank writes what one device writes
    (`rewriter.localize.sync_instance_norm`); a channel shard would slice buffers written in place."""
    if v.nd() < 3:
        return [replicate(v)]
    tracking = v.arg(5, "use_input_stats", True) and v.arg(3, "running_mean") is not None
    per_channel = (R,) * (v.n_in - 1)
    opts = [replicate(v)]
    if v.in_shapes[0][0] > 1:
        opts.append(AxisOption((Shard(0),) + per_channel, Shard(0), (0, OUT)))  # (torch raises on an empty shard)
    if tracking:
        return opts
    if v.in_shapes[0][1] > 1:
        opts.append(AxisOption((Shard(1),) + (Shard(0),) * (v.n_in - 1), Shard(1), tuple(range(v.n_in)) + (OUT,)))
    return opts


def grid_sampler(v: OpView) -> list[AxisOption]:
    """grid_sampler(x (N, C, *in), grid (N, *out, k), mode, padding_mode, align_corners) -> (N, C, *out):
    shard the batch on both, or the channels of x (grid Replicate); Partial x passes (sampling is a fixed
    weighted sum of x's values for a given grid)."""
    opts = [replicate(v)]
    if v.in_shapes[0][0] > 1 and v.in_shapes[1][0] == v.in_shapes[0][0]:
        opts.append(AxisOption((Shard(0), Shard(0)), Shard(0)))
    if v.in_shapes[0][1] > 1:
        opts.append(AxisOption((Shard(1), R), Shard(1)))
    return opts + [AxisOption((P, R), P)]


def affine_grid(v: OpView) -> list[AxisOption]:
    """affine_grid_generator(theta (N, 2, 3) or (N, 3, 4), size [N, C, *spatial], align_corners) -> (N, *spatial,
    k): each sample's grid is its own theta applied to one base grid, so the batch shards (the size argument's N
    becomes the local batch, `rewriter.localize`), and the grid is linear in theta: Partial passes."""
    opts = [replicate(v)] + ([AxisOption((Shard(0),), Shard(0))] if v.in_shapes[0][0] > 1 else [])
    return opts + [AxisOption((P,), P)]


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


def cell(v: OpView) -> list[AxisOption]:
    """lstm_cell(x (N, I), [h, c] (N, H), w_ih, w_hh, b_ih, b_hh) and gru_cell / rnn_tanh_cell / rnn_relu_cell
    (x, h, weights...): one time step; shard the batch on x, the states and the outputs, weights
    Replicate. An unbatched call (x of rank 1) stays replicated."""
    if v.nd() != 2 or v.in_shapes[0][0] == 1:
        return [replicate(v)]
    states = 2 if v.packet is aten.lstm_cell else 1
    return [replicate(v), AxisOption((Shard(0),) * (1 + states) + (R,) * (v.n_in - 1 - states), Shard(0))]


def recurrent(v: OpView) -> list[AxisOption]:
    """lstm.input(x (L, N, H), [h0, c0], params, ..., batch_first=False) and gru / rnn_tanh / rnn_relu
    .input(x, h0, params, ...): h0, c0 (layers*dirs, N, Hout); shard the batch N on x, the states and every
    output; weights Replicate. A batch_first call (which the tracer rewrites to this form between transposes,
    `tracer.normalize` 10) stays replicated: its output has the batch on dim 0 and its states on dim 1, and
    one option gives every output one placement. Only the `.input` overloads:
    `.data` takes packed sequences (rows of every sequence concatenated)."""
    if v.arg(8, "batch_first", False) or v.in_shapes[0][1] == 1 or v.nd() != 3:
        return [replicate(v)]
    states = 2 if v.packet is aten.lstm else 1
    return [replicate(v), AxisOption((Shard(1),) * (1 + states) + (R,) * (v.n_in - 1 - states), Shard(1))]
