"""Rows of the rule table (`table.py`, DESIGN.md rule 8), part 1: pointwise ops, creation, ops that read along
some dims, reductions, data movement and contractions. Importing the module adds its rows to `registry.TABLE`."""
from __future__ import annotations

import operator

import torch

from . import linalg, pointwise, shape_ops
from .base import aten
from .registry import add_row as _add
from .samples import BINARY, POS_UNARY, UNARY, T, calls, ints, mask, pos, t

# --- pointwise ------------------------------------------------------------------------------------------------
_UNARY_OPS = ("relu", "silu", "tanh", "sigmoid", "neg", "exp", "erf", "abs", "sin", "cos", "square",
              "softplus", "mish", "elu", "hardswish", "hardsigmoid", "hardtanh", "leaky_relu", "sign", "floor",
              "ceil", "trunc", "expm1", "atan", "logical_not", "bitwise_not", "clone", "contiguous",
              "alias", "detach", "lift_fresh_copy")
_UNARY_OPS += ("selu", "celu", "log_sigmoid", "hardshrink", "softshrink", "special_i0", "special_i1e", "special_erfcx",
               "special_sinc", "special_log_ndtr")  # (ran replicated without a row)
_UNARY_OPS += ("frac", "relu6")  # (ran replicated without a row: straight-through quantisers, MobileNets; r14a)
_POS_OPS = ("log", "sqrt", "rsqrt", "reciprocal", "log1p", "log2", "special_digamma", "special_gammaln")
for _n in _UNARY_OPS:
    _p = getattr(aten, _n)
    _args = [(mask(3, 5),), (mask(2, 7, 3),)] if _n in ("logical_not", "bitwise_not") else UNARY
    _add([_p], pointwise.elementwise, calls(_p.default, *_args), exact=_n in ("clone", "contiguous", "alias",
                                                                              "detach", "lift_fresh_copy", "neg"))
_add([aten.nan_to_num], pointwise.elementwise, [*calls(aten.nan_to_num.default, *UNARY),
                                                *calls(aten.nan_to_num.default, (t(3, 5),), nan=0.0, posinf=1.0, neginf=-1.0)])
_add([aten.round], pointwise.elementwise, [*calls(aten.round.default, *UNARY), *calls(aten.round.decimals, (t(3, 5),), decimals=2)])
for _n in _POS_OPS:
    _add([getattr(aten, _n)], pointwise.elementwise, calls(getattr(aten, _n).default, *POS_UNARY))
_add([aten.gelu], pointwise.elementwise, [*calls(aten.gelu.default, *UNARY),
                                          *calls(aten.gelu.default, *UNARY, approximate="tanh")])

_add([aten.add, aten.sub], pointwise.elementwise, lambda p: [
    *calls(p.Tensor, *BINARY), *calls(p.Tensor, (t(3, 5), 2.5), (t(2, 3, 5), t(3, 5)), alpha=1),
    *calls(p.Tensor, (t(3, 5), t(3, 5)), alpha=2), *calls(p.Scalar, (t(3, 5), 1.5))])
_add([aten.mul], pointwise.elementwise, [*calls(aten.mul.Tensor, *BINARY, (t(3, 5), 2.5)),
                                         *calls(aten.mul.Scalar, (t(3, 5), -2.0))])
_add([aten.div], pointwise.elementwise, [*calls(aten.div.Tensor, (t(3, 5), pos(3, 5)), (t(2, 3, 5), pos(5)),
                                                (t(3, 5), 2.5)),
                                         *calls(aten.div.Tensor_mode, (t(3, 5), 0.3), rounding_mode="floor"),
                                         *calls(aten.div.Scalar, (t(3, 5), 3.0))])
_add([aten.rsub], pointwise.elementwise, [*calls(aten.rsub.Scalar, (t(3, 5), 1.0)), *calls(aten.rsub.Tensor, *BINARY[:2])])
_add([aten.threshold], pointwise.elementwise, calls(aten.threshold.default, (t(3, 5), 0.1, -2.0)))
_add([aten.special_xlogy], pointwise.elementwise, calls(aten.special_xlogy.default, (t(3, 5), pos(3, 5)), (t(2, 3, 5), pos(5))))
for _n in ("special_erfinv", "special_ndtri", "special_logit"):  # (inputs in (0, 1))
    _add([getattr(aten, _n)], pointwise.elementwise, calls(getattr(aten, _n).default, (T((3, 5), "prob"),)))
_add([aten.pow.Tensor_Scalar], pointwise.elementwise, calls(aten.pow.Tensor_Scalar, (t(3, 5), 2), (pos(2, 7, 3), 0.5)))
_add([aten.pow.Tensor_Tensor], pointwise.elementwise, calls(aten.pow.Tensor_Tensor, (pos(3, 5), t(3, 5))))
for _n in ("maximum", "minimum", "atan2", "remainder", "floor_divide", "fmod"):
    _p = getattr(aten, _n)
    _ov = _p.Tensor if _n in ("remainder", "fmod") else _p.default
    _add([_p], pointwise.elementwise, [*calls(_ov, (t(3, 5), pos(3, 5)), (t(2, 3, 5), pos(5))),
                                       *(calls(_p.Scalar, (t(3, 5), 0.7)) if _n in ("remainder", "fmod", "floor_divide") else [])])
_add([aten.max.other, aten.min.other], pointwise.elementwise, lambda o: calls(o, *BINARY))
for _n in ("eq", "ne", "le", "lt", "ge", "gt"):
    _p = getattr(aten, _n)
    _add([_p], pointwise.elementwise, [*calls(_p.Tensor, *BINARY), *calls(_p.Scalar, (t(3, 5), 0.1))])
for _n in ("logical_and", "logical_or", "logical_xor", "__and__", "__or__", "__xor__", "bitwise_and", "bitwise_or",
           "bitwise_xor"):  # (xor, integer bit fields and the Scalar overloads, `ids & 3`: ran replicated, r14a)
    _p = getattr(aten, _n)
    _add([_p], pointwise.elementwise, [*calls(_p.Tensor if hasattr(_p, "Tensor") else _p.default,
                                              (mask(3, 5), mask(3, 5)), (mask(2, 3, 5), mask(5)),
                                              *([] if _n.startswith("logical") else [(ints(9, 3, 5), ints(9, 5))])),
                                       *(calls(_p.Scalar, (ints(9, 3, 5), 3)) if hasattr(_p, "Scalar") else [])])
_add([aten.where], pointwise.elementwise, [*calls(aten.where.self, (mask(3, 5), t(3, 5), t(3, 5)),
                                                  (mask(2, 1, 5), t(3, 5), t(2, 3, 1))),
                                           *calls(aten.where.ScalarOther, (mask(3, 5), t(3, 5), 0.0)),
                                           *calls(aten.where.ScalarSelf, (mask(3, 5), 1.0, t(3, 5))),
                                           *calls(aten.where.Scalar, (mask(3, 5), 1.0, -2.0))])
_add([aten.masked_fill], pointwise.elementwise, [*calls(aten.masked_fill.Scalar, (t(3, 5), mask(3, 5), -1.0),
                                                        (t(2, 3, 5), mask(3, 5), 0.0)),
                                                 *calls(aten.masked_fill.Tensor, (t(3, 5), mask(3, 5), t()))])
_add([aten.clamp], pointwise.elementwise, [*calls(aten.clamp.default, (t(3, 5), -0.5, 0.5), (t(3, 5), 0.0)),
                                           *calls(aten.clamp.Tensor, (t(3, 5), t(3, 5), None), (t(3, 5), None, t(5)))])
_add([aten.clamp_min, aten.clamp_max], pointwise.elementwise, lambda p: [*calls(p.default, (t(3, 5), 0.1)),
                                                                          *calls(p.Tensor, (t(3, 5), t(5)))])
_add([aten.addcmul, aten.addcdiv], pointwise.elementwise,
     lambda p: calls(p.default, (t(3, 5), t(3, 5), pos(3, 5)), value=0.5))
_add([aten.lerp], pointwise.elementwise, [*calls(aten.lerp.Scalar, (t(3, 5), t(3, 5), 0.3)),
                                          *calls(aten.lerp.Tensor, (t(3, 5), t(3, 5), T((3, 5), "prob")))])
_add([aten.dropout], pointwise.elementwise, calls(aten.dropout.default, (t(3, 5), 0.0, True), (t(2, 7, 3), 0.5, False)))
# alpha dropout draws per element (elementwise) but adds a constant where it drops (not linear: no Partial); the
# feature dropouts draw one mask per (sample, channel): shard N and C only (round 20, r20f: no rows before, replicated)
_add([aten.alpha_dropout], pointwise.elementwise,
     calls(aten.alpha_dropout.default, (t(3, 5), 0.0, True), (t(2, 7, 3), 0.5, False)))
_add([aten.feature_dropout, aten.feature_alpha_dropout], pointwise.along(pointwise.leading_two),
     lambda p: calls(p.default, (t(3, 5, 4), 0.0, True), (t(2, 7, 3, 3), 0.5, False), (t(3, 5), 0.5, False)))
_add([aten.native_dropout], pointwise.elementwise, calls(aten.native_dropout.default, (t(3, 5), 0.0, False)))
_add([aten._to_copy], pointwise.elementwise, [
    *calls(aten._to_copy.default, (t(3, 5),), dtype=torch.bfloat16),
    *calls(aten._to_copy.default, (t(3, 5),), dtype=torch.float64),
    *calls(aten._to_copy.default, (t(3, 5, dtype=torch.bfloat16),), dtype=torch.float32),
    *calls(aten._to_copy.default, (t(3, 5),), dtype=torch.float32)], exact=True)
# (random=True rows: values undefined or random; the harness checks shapes, the semantics tests the RNG)
_add([aten.to], pointwise.elementwise, [*calls(aten.to.dtype, (t(3, 5), torch.float16), (t(3, 5), torch.float64),
                                               (t(2, 7, 3), torch.float32)),
                                        *calls(aten.to.device, (t(3, 5), torch.device("cpu"), torch.bfloat16)),
                                        *calls(aten.to.dtype_layout, (t(3, 5),), dtype=torch.float64),  # x.to(dtype=...)
                                        *calls(aten.to.other, (t(3, 5), t(1, dtype=torch.float64)))],
     exact=True)
_add([aten.type_as], pointwise.elementwise, calls(aten.type_as.default, (t(3, 5), t(1, dtype=torch.bfloat16)),
                                                  (t(3, 5), t(1, dtype=torch.float64))), exact=True)

# --- creation -------------------------------------------------------------------------------------------------
_add([aten.arange], pointwise.creation, [*calls(aten.arange.default, (7,), dtype=torch.float32),
                                         *calls(aten.arange.start, (2, 9)), *calls(aten.arange.start_step, (1, 10, 2))],
     exact=True)
_add([aten.zeros, aten.ones], pointwise.constant_fill, lambda p: calls(p.default, ([3, 5],), dtype=torch.float32),
     exact=True)
_add([aten.empty], pointwise.constant_fill, calls(aten.empty.memory_format, ([3, 5],), dtype=torch.float32), random=True)
_add([aten.full], pointwise.constant_fill, calls(aten.full.default, ([3, 5], 1.5)), exact=True)
_add([aten.eye], pointwise.creation, [*calls(aten.eye.default, (5,)), *calls(aten.eye.m, (3, 5))], exact=True)
_add([aten.linspace], pointwise.creation, calls(aten.linspace.default, (0.0, 1.0, 7)), exact=True)
_add([aten.scalar_tensor], pointwise.creation, calls(aten.scalar_tensor.default, (2.0,)), exact=True)
_add([aten.rand, aten.randn], pointwise.creation, lambda p: calls(p.default, ([3, 5],)), random=True)
_add([aten.new_zeros, aten.new_ones], pointwise.constant_fill, lambda p: calls(p.default, (t(3, 5), [2, 7])),
     exact=True)
_add([aten.new_empty], pointwise.constant_fill, calls(aten.new_empty.default, (t(3, 5), [2, 7])), random=True)
_add([aten.new_full], pointwise.constant_fill, calls(aten.new_full.default, (t(3, 5), [2, 7], 3.0)), exact=True)
_add([aten.zeros_like, aten.ones_like], pointwise.like, lambda p: calls(p.default, (t(3, 5),), (t(2, 7, 3),)), exact=True)
_add([aten.empty_like], pointwise.like, calls(aten.empty_like.default, (t(3, 5),), (t(2, 7, 3),)), random=True)
_add([aten.full_like], pointwise.like, calls(aten.full_like.default, (t(3, 5), 2.0), (t(2, 7, 3), -1.0)), exact=True)
_add([aten.fill], pointwise.like, [*calls(aten.fill.Scalar, (t(3, 5), 2.0)), *calls(aten.fill.Tensor, (t(3, 5), t()))],
     exact=True)
_add([aten.rand_like, aten.randn_like], pointwise.like, lambda p: calls(p.default, (t(3, 5),), (t(2, 7, 3),)),
     random=True)

# --- positions: ops that read along some dims -----------------------------------------------------------------
_add([aten.tril, aten.triu], pointwise.tril_triu,
     lambda p: calls(p.default, (t(5, 7),), (t(7, 5), 1), (t(3, 6, 6), -1), (t(2, 5, 3, 4), 2)), exact=True)
_add([aten.cumsum], pointwise.along(pointwise.dim_arg(1), linear=True),
     calls(aten.cumsum.default, (t(3, 7), 1), (t(5, 2, 3), 0), (t(2, 7, 3), -1)))
_add([aten.cumprod, aten.logcumsumexp], pointwise.along(pointwise.dim_arg(1)),
     lambda p: calls(p.default, (t(3, 7), 1), (t(5, 2, 3), 0)))
_add([aten.diff], pointwise.along(pointwise.dim_arg(2, "dim", -1), linear=True, single_input=True),
     calls(aten.diff.default, (t(3, 7),), (t(5, 2, 3), 1, 0), (t(4, 6), 2, 1), (ints(9, 3, 7),),
           (t(3, 4), 1, -1, t(3, 1)), (t(3, 4), 1, -1, t(3, 1), t(3, 2))))
_add([aten.flip], pointwise.along(pointwise.dim_arg(1, "dims"), linear=True),
     calls(aten.flip.default, (t(3, 7), [1]), (t(5, 2, 3), [0, 2])), exact=True)
_add([aten.roll], pointwise.along(pointwise.roll_dims, linear=True),
     calls(aten.roll.default, (t(3, 7), [2], [1]), (t(5, 3), [1]), (t(5, 2, 3), [1, -1], [0, 2])), exact=True)
for _p in (aten.softmax, aten.log_softmax):
    _add([_p], pointwise.along(pointwise.dim_arg(1)), calls(_p.int, (t(3, 7), 1), (t(2, 5, 3), 0), (t(2, 5, 3), -1)))
for _p in (aten._softmax, aten._log_softmax):
    _add([_p], pointwise.along(pointwise.dim_arg(1)), calls(_p.default, (t(3, 7), 1, False), (t(2, 5, 3), 0, False)))
_add([aten.sort], pointwise.along(pointwise.dim_arg(1, default=-1)),
     [*calls(aten.sort.default, (t(3, 7),), (t(5, 2, 3), 0, True)), *calls(aten.sort.stable, (t(3, 7),), stable=True, dim=0)],
     exact=True)
_add([aten.argsort], pointwise.along(pointwise.dim_arg(1, default=-1)),
     [*calls(aten.argsort.default, (t(3, 7),), (t(5, 2, 3), 0)), *calls(aten.argsort.stable, (t(3, 7),), stable=True, dim=0)],
     exact=True)
# Tensor.unfold(dim, size, step): windows along `dim` (read whole), the other dims kept, a window dim appended
# (sliding-window features; ran replicated without a row, r14a)
_add([aten.unfold], pointwise.along(pointwise.dim_arg(1), linear=True),
     calls(aten.unfold.default, (t(3, 9, 5), 1, 3, 2), (t(5, 2, 7), 2, 2, 1), (t(7, 4), 0, 7, 1)), exact=True)
_add([aten.cummax, aten.cummin], pointwise.along(pointwise.dim_arg(1)),
     lambda p: calls(p.default, (t(3, 7), 1), (t(5, 2, 3), 0)), exact=True)  # (ran replicated without a row, r14a)
_add([aten.topk], pointwise.along(pointwise.dim_arg(2, default=-1)),
     calls(aten.topk.default, (t(3, 7), 2), (t(5, 2, 3), 3, 0), (t(2, 7, 3), 1, 1, False)), exact=True)

_SORTED = T((6,), "sorted")
_add([aten.bucketize], pointwise.bucketize, [*calls(aten.bucketize.Tensor, (t(3, 5), _SORTED), (t(2, 7, 3), _SORTED)),
                                             *calls(aten.bucketize.Tensor, (t(3, 5), _SORTED), right=True, out_int32=True)], exact=True)
_add([aten.searchsorted], pointwise.bucketize, [*calls(aten.searchsorted.Tensor, (_SORTED, t(3, 5)), (_SORTED, t(2, 7, 3))),
                                                *calls(aten.searchsorted.Tensor, (_SORTED, t(3, 5)), right=True),
                                                *calls(aten.searchsorted.Tensor, (t(6), t(3, 5)), sorter=T((6,), "perm", grad=False), side="right")],
     exact=True)
# FFTs (FNet mixes tokens with fftn over (seq, hidden)) and complex views: shard the dims not transformed
_C = torch.complex64
for _p, _dims, _samples in ((aten.fft_fft, pointwise.dim_arg(2, default=-1), ((t(3, 6),), (t(4, 3, 5), None, 1))),
                            (aten.fft_ifft, pointwise.dim_arg(2, default=-1), ((t(3, 6, dtype=_C),), (t(4, 3, 5, dtype=_C), 4, 1))),
                            (aten.fft_rfft, pointwise.dim_arg(2, default=-1), ((t(3, 6),), (t(4, 3, 5), None, 1, "ortho"))),
                            (aten.fft_irfft, pointwise.dim_arg(2, default=-1), ((t(3, 4, dtype=_C),), (t(4, 3, 5, dtype=_C), 6, 1))),
                            (aten.fft_fftn, pointwise.dim_arg(2, "dim", None), ((t(4, 3, 5), None, [1, 2]), (t(3, 4, 2), None, [0]))),
                            (aten.fft_fft2, pointwise.dim_arg(2, "dim", None), ((t(4, 3, 5), None, [1, 2]),))):
    _add([_p], pointwise.along(_dims, even=True), calls(_p.default, *_samples))
_add([aten.real, aten.imag], pointwise.elementwise, lambda p: calls(p.default, (t(3, 5, dtype=_C),), (t(2, 7, 3, dtype=_C),)), exact=True)
_add([aten.view_as_complex], shape_ops.dim_map(shape_ops.all_but_last_map), calls(aten.view_as_complex.default, (t(3, 5, 2),),
                                                                                  (t(2, 3, 4, 2),)), exact=True)  # (Llama's reference rotary)
_add([aten.fft_fftshift, aten.fft_ifftshift], pointwise.along(pointwise.dim_arg(1, "dim", None), linear=True),
     lambda p: calls(p.default, (t(3, 6), [1]), (t(4, 3, 5), [1, 2])), exact=True)
_add([aten.fft_hfft], pointwise.along(pointwise.dim_arg(2, default=-1), even=True),
     calls(aten.fft_hfft.default, (t(3, 4, dtype=_C),), (t(4, 3, 5, dtype=_C), 6, 1)))
_add([aten.view_as_real], shape_ops.dim_map(shape_ops.leading_map), calls(aten.view_as_real.default, (t(3, 5, dtype=_C),)), exact=True)
_add([aten.complex], pointwise.elementwise, calls(aten.complex.default, (t(3, 5), t(3, 5)), (t(2, 3, 5), t(5))), exact=True)
_add([aten.histc], pointwise.histogram, calls(aten.histc.default, (t(5, 7), 4, -1.0, 1.0), (t(3, 4, 2), 3, 0.0, 0.0)))
_add([aten._weight_norm], pointwise.weight_norm, calls(aten._weight_norm.default, (t(6, 4, 3), T((1, 1, 3)), 2), (t(5, 3), T((5, 1))),
                                                      (t(5, 3), T(()), -1)))  # (weight_norm(dim=None): a 0-d g, r16a)

# --- reductions -----------------------------------------------------------------------------------------------
_add([aten.sum], pointwise.reduction, [*calls(aten.sum.default, (t(3, 7),), (t(2, 5, 3),)),
                                       *calls(aten.sum.dim_IntList, (t(3, 7), [1]), (t(5, 2, 3), [0, 2], True),
                                              (t(2, 5, 3), [-1])),
                                       *calls(aten.sum.dim_IntList, (t(5, 3), [0]), dtype=torch.float64)])
_add([aten.sum_to_size], pointwise.sum_to_size, calls(aten.sum_to_size.default, (t(5, 3, 7), [3, 1]), (t(3, 7), [1, 7]),
                                                     (t(2, 5, 3), [1, 5, 1]), (t(3, 5), [3, 5])))
_add([aten.mean], pointwise.reduction, [*calls(aten.mean.default, (t(3, 7),), (t(2, 5, 3),)),
                                        *calls(aten.mean.dim, (t(3, 7), [1]), (t(5, 2, 3), [0, 2], True),
                                               (t(2, 5, 3), [-1]), (t(9, 3), [0]))])
_add([aten.amax, aten.amin], pointwise.kept_dims(), lambda p: calls(p.default, (t(3, 7), [1]), (t(5, 2, 3), [0, 2], True)))
_add([aten.argmax, aten.argmin], pointwise.kept_dims(), lambda p: calls(p.default, (t(3, 7), 1), (t(5, 2, 3), 0, True)))
_add([aten.max.dim, aten.min.dim], pointwise.kept_dims(), lambda o: calls(o, (t(3, 7), 1), (t(5, 2, 3), 0, True)))
_add([aten.logsumexp], pointwise.kept_dims(), calls(aten.logsumexp.default, (t(3, 7), [1]), (t(5, 2, 3), [0], True)))
# (order statistics over a dim, e.g. hard-example mining over the batch: ran replicated without a row, r14a)
_add([aten.kthvalue], pointwise.kept_dims(2, 3, default_dims=(-1,)),
     calls(aten.kthvalue.default, (t(3, 7), 2), (t(5, 2, 3), 1, 0, True)), exact=True)
_add([aten.median.dim, aten.nanmedian.dim], pointwise.kept_dims(), lambda o: calls(o, (t(3, 7), 1), (t(5, 2, 3), 0, True)),
     exact=True)
_add([aten.mode], pointwise.kept_dims(1, 2, default_dims=(-1,)),
     calls(aten.mode.default, (ints(3, 3, 7),), (ints(3, 5, 2, 3), 0, True)), exact=True)
_add([aten.quantile.scalar], pointwise.nonempty(pointwise.kept_dims(2, 3)), calls(aten.quantile.scalar, (t(3, 7), 0.25, 1), (t(5, 2, 3), 0.75, 0, True)))
_add([aten.var, aten.std], pointwise.kept_dims(keep_index=None),
     lambda p: [*calls(p.correction, (t(3, 7), [1]), correction=1), *calls(p.correction, (t(5, 2, 3), [0, 2]), keepdim=True),
                *calls(p.dim, (t(3, 7), [1])), *calls(p.dim, (t(5, 2, 3), [0], True, True))])
_add([aten.var_mean], pointwise.kept_dims(keep_index=None), [*calls(aten.var_mean.correction, (t(3, 7), [1]), correction=0),
                                                              *calls(aten.var_mean.dim, (t(5, 2, 3), [0, 2], True, True))])
_add([aten.linalg_vector_norm], pointwise.kept_dims(2, 3), calls(aten.linalg_vector_norm.default, (t(3, 7), 2, [1]),
                                                                 (t(5, 2, 3), 2.0, [0], True)))
_add([aten.prod.dim_int], pointwise.kept_dims(), calls(aten.prod.dim_int, (pos(3, 7), 1), (pos(5, 2, 3), 0, True)))
_add([aten.any, aten.all], pointwise.kept_dims(), lambda p: [*calls(p.dim, (mask(3, 7), 1), (mask(5, 2, 3), 0, True)),
                                                              *calls(p.dims, (mask(5, 2, 3), [0, 2])),
                                                              *calls(p.default, (mask(3, 7),))])

# --- data movement --------------------------------------------------------------------------------------------
_add([aten.view, aten._unsafe_view, aten.reshape], shape_ops.reshape_like,
     lambda p: calls(p.default, (t(6, 5), [2, 3, 5]), (t(2, 3, 5), [6, 5]), (t(3, 4, 5), [3, 20]), (t(7, 5), [35]),
                     (t(4, 6), [4, 2, 3]), (t(5, 6), [5, 6])), exact=True)
_add([aten.view.dtype], shape_ops.dim_map(shape_ops.dtype_view_map, partial=False),
     calls(aten.view.dtype, (t(3, 6), torch.int32), (t(3, 6), torch.bfloat16), (t(3, 5, dtype=torch.bfloat16), torch.float16)),
     exact=True)
_add([aten.broadcast_tensors], shape_ops.broadcast, calls(aten.broadcast_tensors.default, ([t(3, 5), t(5)],), ([t(2, 1, 5), t(3, 1)],),
                                                           ([t(3, 5), t(3, 5)],)), exact=True)
_add([aten.expand_as], shape_ops.expand_as, calls(aten.expand_as.default, (t(3, 1), t(3, 5)), (t(5,), t(2, 3, 5)), (t(3, 5), t(3, 5))),
     exact=True)
_add([aten.one_hot], shape_ops.dim_map(shape_ops.leading_map, partial=False),
     calls(aten.one_hot.default, (ints(5, 3, 4), 5), (ints(4, 7), 4)), exact=True)  # (num_classes given: -1 reads the data)
_add([aten.masked_scatter], shape_ops.masked_scatter, calls(
    aten.masked_scatter.default, (t(4, 3, 2), T((4, 3, 2), "per_row", torch.bool, 2), t(4, 2)),
    (t(4, 5, 3), T((4, 5, 3), "per_row", torch.bool, 6), t(8, 3)), (t(4, 3), T((4, 3), "per_row", torch.bool, 1), t(4))), exact=True)
_add([aten.numpy_T], shape_ops.dim_map(shape_ops.numpy_t_map), calls(aten.numpy_T.default, (t(3, 5),), (t(2, 3, 5),)), exact=True)
_add([aten.repeat_interleave.self_int], pointwise.along(pointwise.dim_arg(2, default=None), linear=True),
     calls(aten.repeat_interleave.self_int, (t(3, 5), 2, 1), (t(2, 3, 4), 3, -1), (t(3, 4), 2)), exact=True)
_add([aten.repeat], shape_ops.copies(shape_ops.repeat_map), calls(aten.repeat.default, (t(3, 5), [1, 2]), (t(3, 5), [2, 1, 1]),
                                                                  (t(2, 3, 5), [1, 1, 1]), (t(1, 5), [4, 1]),
                                                                  (t(1, 3), [3, 5, 2])), exact=True)
_add([aten.flatten], shape_ops.reshape_like, calls(aten.flatten.using_ints, (t(3, 4, 5), 1), (t(6, 2, 3), 0, 1)), exact=True)
_add([aten.unflatten], shape_ops.reshape_like, calls(aten.unflatten.int, (t(3, 20), 1, [4, 5]), (t(6, 5), 0, [2, 3])), exact=True)
_add([aten.unsqueeze], shape_ops.reshape_like, calls(aten.unsqueeze.default, (t(3, 5), 1), (t(3, 5), 0)), exact=True)
_add([aten.squeeze], shape_ops.reshape_like, [*calls(aten.squeeze.dim, (t(3, 1, 5), 1)),
                                              *calls(aten.squeeze.dims, (t(3, 1, 5, 1), [1, 3])),
                                              *calls(aten.squeeze.default, (t(1, 7, 1),))], exact=True)
_add([aten.transpose], shape_ops.dim_map(shape_ops.transpose_map), calls(aten.transpose.int, (t(3, 5), 0, 1),
                                                                          (t(2, 5, 3), 1, -1)), exact=True)
_add([aten.permute], shape_ops.dim_map(shape_ops.permute_map), calls(aten.permute.default, (t(2, 5, 3), [2, 0, 1])), exact=True)
_add([aten.t], shape_ops.dim_map(shape_ops.t_map), calls(aten.t.default, (t(3, 5),)), exact=True)
_add([aten.expand], shape_ops.copies(shape_ops.expand_map), calls(aten.expand.default, (t(3, 1), [3, 5]),
                                                                   (t(5,), [2, 3, 5]), (t(3, 5), [-1, 5]),
                                                                   (t(1, 5), [7, -1])), exact=True)
_add([aten.slice], shape_ops.dim_map(shape_ops.except_dim(1)),
     calls(aten.slice.Tensor, (t(7, 5), 0, 1, 6), (t(3, 9), 1, 0, 9, 2), (t(2, 7, 3), -2, 2)), exact=True)
_add([aten.narrow], shape_ops.dim_map(shape_ops.except_dim(1)), calls(aten.narrow.default, (t(7, 5), 0, 1, 4)), exact=True)
_add([aten.select], shape_ops.dim_map(shape_ops.select_map), calls(aten.select.int, (t(7, 5), 0, 3), (t(3, 7, 5), 1, -1)),
     exact=True)
_add([aten.split, aten.split_with_sizes], shape_ops.dim_map(shape_ops.except_dim(2)),
     lambda p: calls(p.Tensor if p is aten.split else p.default, (t(7, 5), 3 if p is aten.split else [3, 4]),
                     (t(3, 9), 4 if p is aten.split else [4, 5], 1)), exact=True)
_add([aten.chunk], shape_ops.dim_map(shape_ops.except_dim(2)), calls(aten.chunk.default, (t(7, 5), 3), (t(3, 8), 2, 1)),
     exact=True)
# the unsafe_ twins return views like split / chunk without declaring them (`tracer.graph.UNDECLARED_ALIASES`);
# atleast_Nd adds size-1 dims (or returns the input itself) as unsqueeze does (r18h: no row, refused under ddp)
_add([aten.unsafe_split, aten.unsafe_split_with_sizes], shape_ops.dim_map(shape_ops.except_dim(2)),
     lambda p: calls(p.Tensor if p is aten.unsafe_split else p.default, (t(7, 5), 3 if p is aten.unsafe_split else [3, 4]),
                     (t(3, 9), 4 if p is aten.unsafe_split else [4, 5], 1)), exact=True)
_add([aten.unsafe_chunk], shape_ops.dim_map(shape_ops.except_dim(2)),
     calls(aten.unsafe_chunk.default, (t(7, 5), 3), (t(3, 8), 2, 1)), exact=True)
_add([aten.atleast_1d], shape_ops.reshape_like, calls(aten.atleast_1d.default, (t(),), (t(5),), (t(3, 5),)), exact=True)
_add([aten.atleast_2d], shape_ops.reshape_like, calls(aten.atleast_2d.default, (t(),), (t(5),), (t(3, 5),), (t(2, 3, 5),)),
     exact=True)
_add([aten.atleast_3d], shape_ops.reshape_like, calls(aten.atleast_3d.default, (t(),), (t(5),), (t(3, 5),), (t(2, 3, 5),),
                                                      (t(2, 3, 5, 4),)), exact=True)
_add([aten.unbind], shape_ops.dim_map(shape_ops.unbind_map), calls(aten.unbind.int, (t(3, 5),), (t(2, 3, 5), 1)),
     exact=True)
_add([aten.cat], shape_ops.cat, calls(aten.cat.default, ([t(3, 5), t(2, 5)],), ([t(3, 5), t(3, 2)], 1),
                                      ([t(2, 3, 5), t(2, 3, 5)], -1)), exact=True)
_add([aten.stack], shape_ops.stack, calls(aten.stack.default, ([t(3, 5), t(3, 5)],), ([t(3, 5), t(3, 5)], 2)),
     exact=True)
_add([operator.getitem], shape_ops.getitem, [], exact=True)  # verified through every multi-output op above
_add([aten.index_select], shape_ops.index_select, calls(aten.index_select.default, (t(7, 5), 0, ints(7, 4)),
                                                        (t(3, 7, 5), 1, ints(7, 3))), exact=True)
_add([aten.gather], shape_ops.gather, calls(aten.gather.default, (t(5, 7), 1, ints(7, 5, 3)),
                                            (t(5, 7), 0, ints(5, 3, 7))), exact=True)
_add([aten.index], shape_ops.index, calls(aten.index.Tensor, (t(7, 5), [ints(7, 3)]), (t(3, 7, 5), [None, ints(7, 4)]),
                                          (t(5, 6, 3), [ints(5, 2, 3), ints(6, 2, 3)])), exact=True)
_add([aten.index_put], shape_ops.index_put, calls(aten.index_put.default, (t(7, 5), [ints(7, 3)], t(3, 5)),
                                                  (t(7, 5, 3), [ints(7, 2)], t(3)), (t(7, 5), [mask(7)], t(1), True),
                                                  (t(7, 5, 3), [mask(7, 5)], t(3)), (t(7, 5, 3), [mask(7, 5)], t(1, 3), True)))
# index / scatter writes along a dim (GNN message sums, MoE dispatch masks; ran replicated without a row, r14a)
_add([aten.index_add], shape_ops.index_write(linear=True),
     [*calls(aten.index_add.default, (t(7, 5), 0, ints(7, 4), t(4, 5)), (t(3, 7, 5), 1, ints(7, 9), t(3, 9, 5))),
      *calls(aten.index_add.default, (t(7, 5), 1, ints(5, 3), t(7, 3)), alpha=2.0)])
_add([aten.index_copy], shape_ops.index_write(linear=False),
     calls(aten.index_copy.default, (t(7, 5), 0, T((3,), "perm"), t(3, 5)), (t(3, 7, 5), 1, T((2,), "perm"), t(3, 2, 5))), exact=True)
_add([aten.index_fill], shape_ops.index_write(linear=False),
     [*calls(aten.index_fill.int_Scalar, (t(7, 5), 0, ints(7, 3), 0.5), (t(3, 7, 5), -1, ints(5, 2), -1.0)),
      *calls(aten.index_fill.int_Tensor, (t(7, 5), 1, ints(5, 3), t()))], exact=True)
_add([aten.scatter], shape_ops.index_write(linear=False),
     [*calls(aten.scatter.value, (t(7, 5), 1, T((7, 3), "perm"), 1.0), (t(3, 7, 5), 2, T((3, 7, 2), "perm"), 0.0)),
      *calls(aten.scatter.src, (t(7, 5), 1, T((7, 3), "perm"), t(7, 3)), (t(7, 5), 0, ints(7, 2, 5), t(2, 5)))],
     exact=True)
_add([aten.scatter_add], shape_ops.index_write(linear=True),
     calls(aten.scatter_add.default, (t(7, 5), 1, ints(5, 7, 4), t(7, 4)), (t(3, 7, 5), 1, ints(7, 3, 9, 5), t(3, 9, 5))))
_add([aten.scatter_reduce.two], shape_ops.index_write(linear=False),
     [*calls(aten.scatter_reduce.two, (t(7, 5), 1, ints(5, 7, 4), t(7, 4), "amax"), (t(3, 7, 5), 0, ints(3, 4, 7, 5), t(4, 7, 5), "sum")),
      *calls(aten.scatter_reduce.two, (t(7, 5), 1, ints(5, 7, 4), t(7, 4), "mean"), include_self=False)])
_add([aten.take], shape_ops.take, calls(aten.take.default, (t(7, 5), ints(35, 3, 4)), (t(3, 5), ints(15, 6))), exact=True)
_add([aten.pad], shape_ops.constant_pad, calls(aten.pad.default, (t(3, 5), [1, 2]), (t(3, 5, 4), [1, 1, 0, 2], "constant", 0.5),
                                                (t(1, 5, 7), [2, 2], "reflect"), (t(5, 4), [1, 0], "replicate"),
                                                (t(3, 5, 4, 6), [1, 2, 1, 1], "reflect"), (t(3, 5, 4), [1, 1], "circular")),
     exact=True)
_add([aten.constant_pad_nd], shape_ops.constant_pad, calls(aten.constant_pad_nd.default, (t(3, 5), [1, 2])), exact=True)

# --- contractions ---------------------------------------------------------------------------------------------
_add([aten.linear], linalg.linear, calls(aten.linear.default, (t(3, 5), t(7, 5)), (t(2, 3, 5), t(6, 5), t(6)),
                                         (t(2, 5, 3, 4), t(3, 4))))
_add([aten.addmm], linalg.addmm, calls(aten.addmm.default, (t(7), t(3, 5), t(5, 7)), (t(3, 1), t(3, 5), t(5, 6))))
_add([aten.baddbmm], linalg.baddbmm, [*calls(aten.baddbmm.default, (t(3, 4, 5), t(3, 4, 2), t(3, 2, 5)), (t(4, 5), t(3, 4, 2), t(3, 2, 5))),
                                        *calls(aten.baddbmm.default, (t(3, 1, 5), t(3, 4, 2), t(3, 2, 5)), beta=0.5, alpha=2.0)])
_add([aten.cosine_similarity], linalg.distance(linalg.cosine_dim), calls(aten.cosine_similarity.default, (t(3, 5), t(3, 5)),
                                                                         (t(2, 3, 5), t(3, 5), -1), (t(4, 3, 2), t(4, 3, 2), 0)))
_add([aten.pairwise_distance], linalg.distance(linalg.last_dim), calls(aten.pairwise_distance.default, (t(3, 5), t(3, 5)),
                                                                       (t(2, 3, 5), t(2, 3, 5), 1.0, 1e-6, True)))
_add([aten.cdist], linalg.cdist, calls(aten.cdist.default, (t(2, 3, 4), t(2, 5, 4)), (t(3, 4), t(5, 4), 1.0)))
_add([aten.mm], linalg.matmul, calls(aten.mm.default, (t(3, 5), t(5, 7))))
_add([aten.bmm], linalg.matmul, calls(aten.bmm.default, (t(3, 5, 4), t(3, 4, 7))))
_add([aten.matmul], linalg.matmul, calls(aten.matmul.default, (t(2, 3, 5), t(5, 7)), (t(2, 3, 5, 4), t(3, 4, 6))))
_add([aten.einsum], linalg.einsum, calls(aten.einsum.default, ("bij,bjk->bik", [t(3, 5, 4), t(3, 4, 7)]),
                                         ("ebd,edf->ebf", [t(3, 5, 4), t(3, 4, 6)]), ("bhld,bhsd->bhls", [t(2, 3, 5, 4), t(2, 3, 7, 4)]),
                                         ("ij,j->i", [t(5, 7), t(7)]), ("...d,de->...e", [t(2, 5, 3), t(3, 7)]),
                                         ("nchw,cd->nhwd", [t(2, 3, 5, 4), t(3, 6)]), ("ii->i", [t(5, 5)]),
                                         ("ij,kj", [t(3, 5), t(4, 5)])))
_add([aten.embedding], linalg.embedding, calls(aten.embedding.default, (t(11, 5), ints(11, 3, 4)), (t(13, 3), ints(13, 7)),
                                               (t(11, 5), ints(11, 3, 4), 2), (t(5, 3), ints(3, 7, 4), -1, True)))
_add([aten.scaled_dot_product_attention], linalg.sdpa, [
    *calls(aten.scaled_dot_product_attention.default, (t(3, 2, 5, 4), t(3, 2, 7, 4), t(3, 2, 7, 4))),
    *calls(aten.scaled_dot_product_attention.default, (t(2, 3, 5, 4), t(2, 3, 5, 4), t(2, 3, 5, 4)), is_causal=True),
    *calls(aten.scaled_dot_product_attention.default, (t(2, 3, 5, 4), t(2, 3, 6, 4), t(2, 3, 6, 4), t(5, 6))),
    *calls(aten.scaled_dot_product_attention.default, (t(2, 4, 5, 4), t(2, 2, 5, 4), t(2, 2, 5, 4)), enable_gqa=True),
    # one head, no head dim (B, L, E) and its (L, S) mask; heads grouped (B, G, H, L, E) (r16a: the rule read
    # dims 0 and 1 as batch and heads at every rank, so a 3-D call sharded L and S: attention over local keys)
    *calls(aten.scaled_dot_product_attention.default, (t(3, 5, 4), t(3, 6, 4), t(3, 6, 4)), (t(3, 5, 4), t(3, 5, 4), t(3, 5, 4)),
           is_causal=True),
    *calls(aten.scaled_dot_product_attention.default, (t(3, 5, 4), t(3, 6, 4), t(3, 6, 4), t(5, 6))),
    *calls(aten.scaled_dot_product_attention.default, (t(2, 3, 2, 5, 4), t(2, 3, 2, 5, 4), t(2, 3, 2, 5, 4)), is_causal=True)])
