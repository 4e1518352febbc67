"""Rows of the rule table (`table.py`, DESIGN.md rule 8), part 2: neural-network ops, losses and the ops of
torch.nn / torch.linalg / torch.special / torch.fft that ran replicated before a row. Importing the module adds
its rows to `registry.TABLE`."""
from __future__ import annotations

import torch

from . import linalg, losses, matrix, nn_ops, pointwise, shape_ops
from .base import aten
from .registry import add_row as _add
from .samples import POS_UNARY, UNARY, Sample, T, calls, ints, pos, t

_C = torch.complex64

# --- neural-network ops ---------------------------------------------------------------------------------------
_add([aten.layer_norm], nn_ops.layer_norm, calls(aten.layer_norm.default, (t(3, 5), [5], t(5), t(5)), (t(2, 3, 5), [5]),
                                                 (t(2, 3, 5), [3, 5], t(3, 5), t(3, 5))))
_add([aten.rms_norm], nn_ops.layer_norm, calls(aten.rms_norm.default, (t(3, 5), [5], t(5), 1e-6), (t(2, 3, 5), [5]),
                                               (t(2, 3, 5), [3, 5], t(3, 5))))
_add([aten.group_norm], nn_ops.group_norm, calls(aten.group_norm.default, (t(3, 4, 5), 2, t(4), t(4)), (t(5, 6, 2, 3), 3)))
_add([aten.batch_norm], nn_ops.batch_norm, [
    *calls(aten.batch_norm.default, (t(7, 3, 5), t(3), t(3), t(3), pos(3), True, 0.1, 1e-5, False),
           (t(5, 4), t(4), t(4), t(4), pos(4), True, 0.3, 1e-5, False),
           (t(3, 4, 5, 3), None, None, t(4), pos(4), True, 0.1, 1e-5, False),
           (t(7, 3, 5), t(3), t(3), t(3), pos(3), False, 0.1, 1e-5, False))])
_SAME = {aten.conv1d: (t(3, 4, 9), t(6, 4, 3)), aten.conv2d: (t(3, 4, 7, 6), t(5, 4, 3, 2)),
         aten.conv3d: (t(2, 4, 4, 3, 3), t(6, 4, 2, 3, 1))}  # padding="same" (the `.padding` overloads)
_add([aten.conv1d, aten.conv2d, aten.conv3d], nn_ops.convolution, lambda p: calls(p.padding, (*_SAME[p], None, [1], "same"),
                                                                         (*_SAME[p], t(_SAME[p][1].shape[0]), [1], "valid")) + (
    calls(p.default, (t(3, 4, 9), t(6, 4, 3)), (t(3, 4, 9), t(6, 4, 3), t(6), [2], [1]), (t(5, 4, 7), t(4, 1, 3), t(4), [1], [1], [1], 4))
    if p is aten.conv1d else
    calls(p.default, (t(3, 4, 7, 6), t(5, 4, 3, 3)), (t(3, 4, 7, 6), t(5, 4, 3, 3), t(5), [1, 2], [1, 1]),
          (t(2, 6, 5, 5), t(6, 3, 3, 3), None, [1], [0], [1], 2))
    if p is aten.conv2d else  # conv3d: ViViT / VideoMAE tubelets ran replicated, whole batch on every rank
    calls(p.default, (t(3, 4, 4, 5, 3), t(6, 4, 2, 3, 3)), (t(3, 4, 4, 5, 3), t(5, 4, 2, 2, 2), t(5), [2, 2, 1]),
          (t(2, 6, 3, 4, 4), t(6, 3, 1, 3, 3), None, [1], [0], [1], 2))))
_add([aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d], nn_ops.conv_transpose, lambda p: (
    calls(p.default, (t(3, 4, 5), t(4, 6, 3)), (t(3, 4, 5), t(4, 3, 3), t(6), [2], [1], [1], 2))
    if p is aten.conv_transpose1d else
    calls(p.input, (t(3, 4, 4, 3), t(4, 5, 3, 3)), (t(3, 4, 4, 3), t(4, 5, 2, 2), t(5), [2, 2], [0], [1]))
    if p is aten.conv_transpose2d else
    calls(p.input, (t(3, 4, 3, 2, 3), t(4, 5, 2, 2, 2)), (t(2, 4, 2, 3, 2), t(4, 3, 1, 2, 2), t(6), [1], [0], [0], 2))))
_POOL = t(3, 4, 7, 6)
_add([aten.max_pool2d], nn_ops.leading_dims(False, 2), calls(aten.max_pool2d.default, (_POOL, [2, 2]), (_POOL, [3, 3], [2, 2], [1, 1])))
_add([aten.avg_pool2d], nn_ops.leading_dims(True, 2), calls(aten.avg_pool2d.default, (_POOL, [2, 2]), (_POOL, [3, 3], [2, 2], [1, 1])))
_add([aten.adaptive_avg_pool2d], nn_ops.leading_dims(True, 2), calls(aten.adaptive_avg_pool2d.default, (_POOL, [1, 1]), (_POOL, [3, 2])))
_add([aten.max_pool1d], nn_ops.leading_dims(False, 1), calls(aten.max_pool1d.default, (t(3, 4, 9), [2])))
_add([aten.avg_pool1d], nn_ops.leading_dims(True, 1), calls(aten.avg_pool1d.default, (t(3, 4, 9), [3])))
_add([aten.adaptive_avg_pool1d], nn_ops.leading_dims(True, 1), calls(aten.adaptive_avg_pool1d.default, (t(3, 4, 9), [2])))
# (the 3-D forms, the adaptive max forms and the forms that return indices ran replicated before, without a row)
_add([aten.max_pool3d], nn_ops.leading_dims(False, 3), calls(aten.max_pool3d.default, (t(3, 4, 5, 4, 3), [2, 2, 2])))
_add([aten.avg_pool3d], nn_ops.leading_dims(True, 3), calls(aten.avg_pool3d.default, (t(3, 4, 5, 4, 3), [2, 2, 2], [1, 1, 1])))
_add([aten.adaptive_avg_pool3d], nn_ops.leading_dims(True, 3), calls(aten.adaptive_avg_pool3d.default, (t(3, 4, 5, 4, 3), [2, 1, 3])))
for _k, _p in ((1, aten.adaptive_max_pool1d), (2, aten.adaptive_max_pool2d), (3, aten.adaptive_max_pool3d)):
    _add([_p], nn_ops.leading_dims(False, _k), calls(_p.default, (t(3, 4, *(5, 4, 3)[:_k]), [2] * _k)), exact=True)
for _k, _p in ((1, aten.max_pool1d_with_indices), (2, aten.max_pool2d_with_indices), (3, aten.max_pool3d_with_indices)):
    _add([_p], nn_ops.leading_dims(False, _k), calls(_p.default, (t(3, 4, *(5, 4, 3)[:_k]), [2] * _k)), exact=True)
_add([aten.max_unpool2d], nn_ops.leading_dims(True, 2), [Sample(aten.max_unpool2d.default, (t(3, 4, 2, 2), T((3, 4, 2, 2), "int", torch.int64, 16), [4, 4]))],
     exact=True)
# upsampling (F.interpolate, nn.Upsample) in every mode: independent over batch and channels, linear in x
_SCALE = {1: [2.0], 2: [2.0, 1.5], 3: [2.0, 1.0, 1.5]}
for _k, _p, _corners in ((1, aten.upsample_nearest1d, None), (2, aten.upsample_nearest2d, None), (3, aten.upsample_nearest3d, None),
                         (1, aten._upsample_nearest_exact1d, None), (2, aten._upsample_nearest_exact2d, None),
                         (3, aten._upsample_nearest_exact3d, None), (1, aten.upsample_linear1d, False),
                         (2, aten.upsample_bilinear2d, True), (2, aten._upsample_bilinear2d_aa, False),
                         (2, aten.upsample_bicubic2d, False), (2, aten._upsample_bicubic2d_aa, False),
                         (3, aten.upsample_trilinear3d, False)):
    _x = t(3, 4, *(5, 4, 3)[:_k])
    _vec = ((_x, None, _SCALE[_k]),) if _corners is None else ((_x, None, _corners, _SCALE[_k]),)
    _out = [7, 5, 4][:_k]
    _sized = (_x, _out, None) if _corners is None else (_x, _out, _corners, None)
    _add([_p], nn_ops.leading_dims(True, _k, even_batch=True), calls(_p.vec, *_vec, _sized), exact=_corners is None)  # (F.interpolate: .vec)
_add([aten.pixel_shuffle], nn_ops.leading_dims(True, 3, even_batch=True), calls(aten.pixel_shuffle.default, (t(3, 8, 2, 3), 2)), exact=True)
_add([aten.pixel_unshuffle], nn_ops.leading_dims(True, 3, even_batch=True), calls(aten.pixel_unshuffle.default, (t(3, 2, 4, 6), 2)), exact=True)
_add([aten.im2col], nn_ops.leading_dims(True, 3), calls(aten.im2col.default, (t(3, 2, 5, 4), [2, 2], [1, 1], [0, 0], [1, 1])))
_add([aten.col2im], nn_ops.leading_dims(True, 2), calls(aten.col2im.default, (t(3, 8, 12), [5, 4], [2, 2], [1, 1], [0, 0], [1, 1])))
_add([aten.channel_shuffle], pointwise.along(lambda v: [1], linear=True), calls(aten.channel_shuffle.default, (t(3, 6, 4), 2)),
     exact=True)
_add([aten.grid_sampler], nn_ops.grid_sampler, calls(aten.grid_sampler.default, (t(3, 4, 5, 6), T((3, 2, 3, 2), "prob"), 0, 0, False),
                                                     (t(3, 4, 5, 6), T((3, 2, 3, 2), "prob"), 1, 1, True)))
_add([aten.prelu], nn_ops.prelu, calls(aten.prelu.default, (t(3, 4, 5), pos(4)), (t(3, 4, 5, 2), pos(1)),
                                        (t(3, 4, 5), pos())))  # (a 0-d slope, r16a)
_add([aten.instance_norm], nn_ops.instance_norm, calls(aten.instance_norm.default,
                                                       (t(3, 4, 5), t(4), t(4), None, None, True, 0.1, 1e-5, False),
                                                       (t(3, 4, 5), None, None, T((4,), grad=False), pos(4, grad=False), False, 0.1, 1e-5, False),
                                                       (t(3, 4, 3, 2), None, None, None, None, True, 0.1, 1e-5, False),
                                                       # updating running statistics (InstanceNorm(track_running_stats=True) in training)
                                                       (t(6, 4, 5), t(4), t(4), T((4,), grad=False), pos(4, grad=False), True, 0.1, 1e-5, False),
                                                       (t(4, 3, 3, 2), None, None, T((3,), grad=False), pos(3, grad=False), True, 0.3, 1e-5, False)))
_add([aten.glu], pointwise.along(pointwise.dim_arg(1, default=-1)), calls(aten.glu.default, (t(3, 8),), (t(4, 6, 3), 1)))
_add([aten.cross_entropy_loss], nn_ops.cross_entropy, [
    *calls(aten.cross_entropy_loss.default, (t(7, 5), ints(5, 7)), (t(7, 5), ints(5, 7), None, 2), (t(7, 5), ints(5, 7), None, 0),
           (t(6, 5), ints(5, 6), None, 1, 2), (t(7, 5), ints(5, 7), pos(5, grad=False)), (t(7, 5), ints(5, 7), pos(5, grad=False), 1, 3, 0.1),
           (t(7, 5), ints(5, 7), None, 1, -100, 0.2), (t(3, 5, 4), ints(5, 3, 4)), (t(3, 5, 4), ints(5, 3, 4), None, 0),
           (t(7, 5), T((7, 5), "prob")), (t(7, 5), T((7, 5), "prob"), None, 2))])
# losses: elementwise ones shard any dim (reduction "none" keeps the shard; "sum"/"mean" give Partial, the
# mean's local form dividing the local sum by the GLOBAL element count, `rewriter.localize`)
_add([aten.mse_loss, aten.l1_loss, aten.smooth_l1_loss, aten.huber_loss], losses.elementwise,
     lambda p: calls(p.default, (t(3, 5), t(3, 5)), (t(2, 3, 5), t(2, 3, 5), 2), (t(4, 3), t(4, 3), 0)))
# (no broadcast samples: F.*_loss expands its operands first, and aten.mse_loss on unexpanded shapes returns a
# target gradient twice too large under "mean" in torch 2.13)
_add([aten.soft_margin_loss], losses.elementwise, calls(aten.soft_margin_loss.default, (t(3, 5), T((3, 5), "sign", grad=False)),
                                                        (t(2, 3, 5), T((2, 3, 5), "sign", grad=False), 2)))
_add([aten.kl_div], losses.elementwise, [*calls(aten.kl_div.default, (t(3, 5), T((3, 5), "prob")), (t(4, 3), T((4, 3), "prob"), 0)),
                                          *calls(aten.kl_div.default, (t(2, 3, 5), t(2, 3, 5), 1), log_target=True)])
_add([aten.binary_cross_entropy], losses.elementwise, calls(
    aten.binary_cross_entropy.default, (T((3, 5), "prob"), T((3, 5), "prob", grad=False)),
    (T((2, 3, 5), "prob"), T((2, 3, 5), "prob", grad=False), pos(5, grad=False), 2), (T((4, 3), "prob"), T((4, 3), "prob", grad=False), None, 0)))
_add([aten.binary_cross_entropy_with_logits], losses.elementwise, calls(
    aten.binary_cross_entropy_with_logits.default, (t(3, 5), T((3, 5), "prob")),
    (t(2, 3, 5), T((2, 3, 5), "prob"), pos(3, 5, grad=False), pos(5, grad=False), 2), (t(4, 3), T((4, 3), "prob"), None, pos(3, grad=False), 0)))
_add([aten.hinge_embedding_loss], losses.elementwise, calls(aten.hinge_embedding_loss.default, (t(3, 5), T((3, 5), "sign", grad=False)),
                                                            (t(2, 3, 5), T((2, 3, 5), "sign", grad=False), 0.5, 2)))
_add([aten.margin_ranking_loss], losses.elementwise, calls(aten.margin_ranking_loss.default, (t(3, 5), t(3, 5), T((3, 5), "sign", grad=False)),
                                                           (t(2, 3, 5), t(2, 3, 5), T((2, 3, 5), "sign", grad=False), 0.1, 0)))
_add([aten.poisson_nll_loss], losses.elementwise, calls(aten.poisson_nll_loss.default, (t(3, 5), pos(3, 5, grad=False), True, False, 1e-8, 1),
                                                        (pos(2, 3, 5), pos(2, 3, 5, grad=False), False, True, 1e-8, 2)))
_add([aten.nll_loss_nd], losses.nll_loss, calls(aten.nll_loss_nd.default, (t(7, 5), ints(5, 7)), (t(7, 5), ints(5, 7), pos(5, grad=False)),
                                               (t(6, 5), ints(5, 6), None, 1, 2), (t(3, 5, 4), ints(5, 3, 4), None, 0),
                                               (t(3, 5, 4), ints(5, 3, 4), pos(5, grad=False), 2)))
_add([aten.lstm], nn_ops.recurrent, calls(aten.lstm.input, (t(5, 3, 4), [t(1, 3, 6), t(1, 3, 6)],
                                                        [t(24, 4), t(24, 6), t(24), t(24)], True, 1, 0.0, True, False, False),
                                     (t(4, 5, 3), [t(2, 5, 4), t(2, 5, 4)],
                                      [t(16, 3), t(16, 4), t(16, 4), t(16, 4)], False, 2, 0.0, True, False, False),
                                     (t(3, 5, 4), [t(1, 3, 6), t(1, 3, 6)],
                                      [t(24, 4), t(24, 6), t(24), t(24)], True, 1, 0.0, True, False, True)))

_add([aten.gru, aten.rnn_tanh, aten.rnn_relu], nn_ops.recurrent, lambda p: calls(
    p.input, (t(5, 3, 4), t(1, 3, 6), [t(6 * (3 if p is aten.gru else 1), 4), t(6 * (3 if p is aten.gru else 1), 6),
                                     t(6 * (3 if p is aten.gru else 1)), t(6 * (3 if p is aten.gru else 1))],
              True, 1, 0.0, True, False, False)))

_add([aten.lstm_cell], nn_ops.cell, calls(aten.lstm_cell.default, (t(3, 4), [t(3, 6), t(3, 6)], t(24, 4), t(24, 6), t(24), t(24)),
                                          (t(5, 4), [t(5, 6), t(5, 6)], t(24, 4), t(24, 6))))
_add([aten.gru_cell, aten.rnn_tanh_cell, aten.rnn_relu_cell], nn_ops.cell, lambda p: calls(
    p.default, (t(3, 4), t(3, 6), t(6 * (3 if p is aten.gru_cell else 1), 4), t(6 * (3 if p is aten.gru_cell else 1), 6),
                t(6 * (3 if p is aten.gru_cell else 1)), t(6 * (3 if p is aten.gru_cell else 1)))))

# --- ops that ran replicated without a row (round 10 survey: torch.nn, torch.linalg / special / fft) ----------
# batched matrix functions: shard the batch dims only (`matrix`); odd batches (5 over 2, 3, 4 ranks) and a
# batch of 3 over 4 ranks (an empty shard) are sampled
_WC, _SPD = (lambda *s: T(s, "wellcond")), (lambda *s: T(s, "spd"))
for _p, _ov, _samples in (
        (aten.linalg_det, "default", [(_WC(5, 3, 3),), (_WC(2, 3, 4, 4),)]),
        (aten.linalg_slogdet, "default", [(_WC(5, 3, 3),)]),
        (aten.logdet, "default", [(_SPD(5, 3, 3),)]),
        (aten.linalg_inv, "default", [(_WC(5, 3, 3),), (_WC(2, 3, 4, 4),)]),
        (aten.linalg_inv_ex, "default", [(_WC(5, 3, 3),)]),
        (aten.linalg_cholesky, "default", [(_SPD(5, 3, 3),), (_SPD(2, 3, 4, 4),)]),
        (aten.linalg_cholesky_ex, "default", [(_SPD(5, 3, 3),)]),
        (aten.linalg_qr, "default", [(_WC(5, 3, 3),), (_WC(3, 4, 4), "complete")]),
        (aten.linalg_svd, "default", [(_WC(5, 3, 3),)]),
        (aten.linalg_svdvals, "default", [(_WC(5, 3, 3),), (_WC(2, 3, 4, 4),)]),
        (aten.linalg_eigh, "default", [(_SPD(5, 3, 3),), (_SPD(3, 4, 4), "U")]),
        (aten.linalg_eigvalsh, "default", [(_SPD(5, 3, 3),)]),
        (aten.linalg_lu_factor, "default", [(_WC(5, 3, 3),)]),
        (aten.linalg_lu, "default", [(_WC(5, 3, 3),)]),
        (aten.linalg_matrix_exp, "default", [(_WC(5, 3, 3),), (_WC(2, 3, 4, 4),)]),
        (aten.linalg_matrix_power, "default", [(_WC(5, 3, 3), 3), (_WC(5, 3, 3), -2)]),
        (aten.cholesky_inverse, "default", [(_SPD(5, 3, 3),)]),
        (aten.linalg_cond, "default", [(_WC(5, 3, 3),)])):
    _add([_p], matrix.batched(matrix.matrices), calls(getattr(_p, _ov), *_samples))
_add([aten.linalg_pinv], matrix.batched(matrix.matrix_dims_last),  # atol / rtol: one tolerance per matrix
     [*calls(aten.linalg_pinv.atol_rtol_tensor, (_WC(5, 3, 3),), (_WC(5, 3, 4),)),
      *calls(aten.linalg_pinv.atol_rtol_tensor, (_WC(5, 3, 4),), atol=pos(5, grad=False), rtol=pos(5, grad=False))])
_add([aten.linalg_solve], matrix.batched(matrix.solve_rhs, linear=1), [
    *calls(aten.linalg_solve.default, (_WC(5, 3, 3), t(5, 3, 2)), (_WC(5, 3, 3), t(5, 3)), (_WC(3, 3), t(4, 3, 2)),
           (_WC(2, 3, 4, 4), t(3, 4, 1))),
    *calls(aten.linalg_solve.default, (_WC(5, 3, 3), t(5, 2, 3)), left=False)])
_add([aten.linalg_solve_ex], matrix.batched(matrix.solve_rhs), calls(aten.linalg_solve_ex.default, (_WC(5, 3, 3), t(5, 3, 2))))
_add([aten.linalg_solve_triangular], matrix.batched(matrix.matrices, linear=1), [
    *calls(aten.linalg_solve_triangular.default, (_WC(5, 3, 3), t(5, 3, 2)), upper=False),
    *calls(aten.linalg_solve_triangular.default, (_WC(3, 3), t(4, 3, 2)), upper=True, left=True)])
_add([aten.cholesky_solve], matrix.batched(matrix.matrices, linear=0), calls(aten.cholesky_solve.default,
                                                                              (t(5, 3, 2), _WC(5, 3, 3)), (t(4, 3, 2), _WC(3, 3), True)))
_add([aten.triangular_solve], matrix.batched(matrix.matrices), calls(aten.triangular_solve.default, (t(5, 3, 2), _WC(5, 3, 3))))
_add([aten.linalg_lu_solve], matrix.batched(matrix.lu_solve, linear=2), calls(
    aten.linalg_lu_solve.default, (_WC(5, 3, 3), T((5, 3), "pivots", torch.int32), t(5, 3, 2))))
_add([aten.linalg_householder_product], matrix.batched(matrix.householder),
     calls(aten.linalg_householder_product.default, (t(5, 4, 3), t(5, 2))))
# matrix / vector norms of torch.linalg: non-linear reductions over their dims
_add([aten.linalg_matrix_norm], pointwise.kept_dims(2, 3, default_dims=(-2, -1)), [
    *calls(aten.linalg_matrix_norm.default, (t(5, 3, 4), 2), (t(5, 3, 4), 1, [0, 2], True), (t(4, 3, 5), -1)),
    *calls(aten.linalg_matrix_norm.str_ord, (t(5, 3, 4), "fro"), (t(5, 3, 4), "nuc"))])
_add([aten.linalg_norm], pointwise.kept_dims(2, 3), [*calls(aten.linalg_norm.default, (t(5, 3, 4), None, [2]), (t(5, 3, 4), 2, [1, 2], True),
                                                            (t(5, 3), 3, [-1])),
                                                     *calls(aten.linalg_norm.ord_str, (t(5, 3, 4), "fro", [1, 2]))])
_add([aten.linalg_matrix_rank], matrix.batched(matrix.matrix_dims_last),
     [*calls(aten.linalg_matrix_rank.atol_rtol_tensor, (_WC(5, 3, 3),), (t(5, 3, 4),)),
      *calls(aten.linalg_matrix_rank.atol_rtol_tensor, (t(5, 3, 4),), atol=pos(5, grad=False), rtol=pos(5, grad=False))])
_add([aten.linalg_vecdot], linalg.distance(linalg.vecdot_dim), [*calls(aten.linalg_vecdot.default, (t(5, 3), t(5, 3)), (t(2, 5, 3), t(5, 3))),
                                                                *calls(aten.linalg_vecdot.default, (t(5, 3, 4), t(5, 3, 4)), dim=1)])
_add([aten.linalg_cross], linalg.cross, [*calls(aten.linalg_cross.default, (t(5, 3), t(5, 3)), (t(2, 5, 3), t(1, 5, 3))),
                                         *calls(aten.linalg_cross.default, (t(5, 3, 4), t(5, 3, 4)), dim=1)])
# (vander's N defaults to the size of x's last dim: that dim is never sharded)
_add([aten.linalg_vander], shape_ops.dim_map(shape_ops.all_but_last_map, partial=False),
     [*calls(aten.linalg_vander.default, (t(5,),), (t(3, 5),)), *calls(aten.linalg_vander.default, (t(3, 5),), N=3)])
_add([aten.diagonal], shape_ops.dim_map(shape_ops.diagonal_map(0, 1)), calls(aten.diagonal.default, (t(5, 5),), (t(5, 3, 4), 1, 1, 2),
                                                                             (t(3, 4, 5), -1, 0, -1)), exact=True)
_add([aten.linalg_diagonal], shape_ops.dim_map(shape_ops.diagonal_map(-2, -1)),
     [*calls(aten.linalg_diagonal.default, (t(5, 3, 4),)), *calls(aten.linalg_diagonal.default, (t(5, 3, 4),), offset=1, dim1=0, dim2=2)],
     exact=True)
_add([aten.fft_fftfreq, aten.fft_rfftfreq], pointwise.creation, lambda p: calls(p.default, (7,), (6, 0.5)), exact=True)
_add([aten.max_unpool3d], nn_ops.leading_dims(True, 3),
     [Sample(aten.max_unpool3d.default, (t(3, 4, 2, 2, 2), T((3, 4, 2, 2, 2), "int", torch.int64, 64), [4, 4, 4], [2, 2, 2], [0, 0, 0]))],
     exact=True)
# torch.special aliases of rows above
for _n in ("special_expit", "special_exp2", "special_erfc", "special_i0e", "special_i1", "special_ndtr", "special_round",
           "special_bessel_j0", "special_bessel_j1", "special_entr"):
    _add([getattr(aten, _n)], pointwise.elementwise, calls(getattr(aten, _n).default, *UNARY))
for _n in ("special_psi", "special_log1p"):
    _add([getattr(aten, _n)], pointwise.elementwise, calls(getattr(aten, _n).default, *POS_UNARY))
_add([aten.special_polygamma], pointwise.elementwise, calls(aten.special_polygamma.default, (1, pos(3, 5)), (2, pos(2, 7, 3))))
_add([aten.special_multigammaln], pointwise.elementwise, calls(aten.special_multigammaln.default, (T((3, 5), "pos") , 1),))
_add([aten.special_xlog1py], pointwise.elementwise, calls(aten.special_xlog1py.default, (t(3, 5), pos(3, 5)), (t(2, 3, 5), pos(5))))
_add([aten.special_zeta], pointwise.elementwise, [*calls(aten.special_zeta.other_scalar, (pos(3, 5), 1.0)),
                                                  *calls(aten.special_zeta.default, (pos(3, 5), pos(3, 5)))])
_add([aten.special_softmax, aten.special_log_softmax], pointwise.along(pointwise.dim_arg(1)),
     lambda p: calls(p.default, (t(3, 7), 1), (t(2, 5, 3), 0)))
_add([aten.special_logsumexp], pointwise.kept_dims(), calls(aten.special_logsumexp.default, (t(3, 7), [1]), (t(5, 2, 3), [0], True)))
# FFTs the first rows lacked (the dims they transform are read whole; MKL rejects an empty shard: even)
for _p, _dims, _samples in ((aten.fft_ifft2, pointwise.dim_arg(2, "dim", [-2, -1]), ((t(4, 3, 5, dtype=_C),), (t(4, 3, 5, dtype=_C), None, [0, 2]))),
                            (aten.fft_rfft2, pointwise.dim_arg(2, "dim", [-2, -1]), ((t(4, 3, 5),),)),
                            (aten.fft_rfftn, pointwise.dim_arg(2, "dim", None), ((t(4, 3, 5), None, [1, 2]),)),
                            (aten.fft_irfftn, pointwise.dim_arg(2, "dim", None), ((t(4, 3, 3, dtype=_C), [3, 4], [1, 2]),)),
                            (aten.fft_ihfft, pointwise.dim_arg(2, default=-1), ((t(3, 6),), (t(4, 3, 5), None, 1)))):
    _add([_p], pointwise.along(_dims, even=True), calls(_p.default, *_samples))
# per-sample losses: the batch shards (`losses.per_sample`; "mean" over the GLOBAL number of samples)
_add([aten.multi_margin_loss], losses.per_sample, calls(aten.multi_margin_loss.default, (t(7, 5), ints(5, 7)),
                                                        (t(7, 5), ints(5, 7), 2, 0.5, pos(5, grad=False)), (t(7, 5), ints(5, 7), 1, 1.0, None, 0),
                                                        (t(5, 4), ints(4, 5), 1, 1.0, None, 2), (t(3, 4), ints(4, 3), 1, 1.0, None, 0),
                                                        (t(3, 4), ints(4, 3)), (t(3, 4), ints(4, 3), 1, 1.0, None, 2)))
_add([aten.multilabel_margin_loss], losses.per_sample, calls(aten.multilabel_margin_loss.default, (t(7, 5), T((7, 5), "int", torch.int64, 5)),
                                                             (t(7, 5), T((7, 5), "int", torch.int64, 5), 0),
                                                             (t(5, 4), T((5, 4), "int", torch.int64, 4), 2),
                                                             (t(3, 4), T((3, 4), "int", torch.int64, 4), 1)))
_add([aten.cosine_embedding_loss], losses.per_sample, calls(aten.cosine_embedding_loss.default, (t(7, 5), t(7, 5), T((7,), "sign", grad=False)),
                                                            (t(7, 5), t(7, 5), T((7,), "sign", grad=False), 0.2, 0),
                                                            (t(5, 4), t(5, 4), T((5,), "sign", grad=False), 0.0, 2),
                                                            (t(3, 4), t(3, 4), T((3,), "sign", grad=False))))
_add([aten.triplet_margin_loss], losses.per_sample, calls(aten.triplet_margin_loss.default, (t(7, 5), t(7, 5), t(7, 5)),
                                                          (t(7, 5), t(7, 5), t(7, 5), 0.5, 1.0, 1e-6, True, 0),
                                                          (t(5, 4), t(5, 4), t(5, 4), 1.0, 2.0, 1e-6, False, 2), (t(3, 4), t(3, 4), t(3, 4))))
_add([aten.affine_grid_generator], nn_ops.affine_grid, calls(aten.affine_grid_generator.default, (t(5, 2, 3), [5, 1, 3, 4], False),
                                                             (t(3, 3, 4), [3, 2, 2, 3, 4], True)))
_add([aten.meshgrid], shape_ops.meshgrid, [*calls(aten.meshgrid.indexing, ([t(5), t(3)],), indexing="ij"),
                                           *calls(aten.meshgrid.indexing, ([t(5), t(3), t(4)],), indexing="xy"),
                                           *calls(aten.meshgrid.default, ([t(5), t(3)],))], exact=True)
_add([aten.bilinear], linalg.bilinear, calls(aten.bilinear.default, (t(5, 3), t(5, 4), t(6, 3, 4), t(6)), (t(5, 3), t(5, 4), t(6, 3, 4)),
                                             (t(2, 5, 3), t(2, 5, 4), t(7, 3, 4))))
