"""THE rule table: for every op the planner may shard, its rule and the samples that verify it
(DESIGN.md rule 8). One row per op packet (or per overload where overloads differ in kind, e.g.
`max.dim` vs `max.other`). The rule harness (tests/rules/test_rule_harness.py) runs every strategy of
every row on its samples and fails on a row without samples, so a rule cannot land unverified.

Columns: `rule` (a function of `OpView`), `samples` (`samples.Sample` calls), `exact` (the sharded result
must equal the global one bit for bit: pure data movement and casts), `random` (random output: the
harness checks shapes and that replicas agree, not values).

Which rules are DTensor's and which are ours: every rule here is written for the ops torch.export's
training IR keeps (composites such as aten.linear, layer_norm, scaled_dot_product_attention, conv2d,
batch_norm, einsum, lstm, cross_entropy_loss stay whole; torch 2.13's DTensor table has no entry for them).
For the ops DTensor does cover, the harness also checks each of our per-axis options against DTensor's
own strategy for the same call where DTensor's placement vocabulary can express it
(tests/rules/test_dtensor_agreement.py), and `docs/rules.md` lists, per op, the rule, the number of
samples and whether DTensor has the op.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import linalg, nn_ops, pointwise, shape_ops
from .base import AxisOption, OpView, aten
from .samples import BINARY, POS_UNARY, UNARY, Sample, T, calls, ints, mask, pos, t

Rule = Callable[[OpView], list[AxisOption]]


@dataclass(frozen=True)
class RuleEntry:
    """One row of the table (module docstring)."""

    key: object            # an OpOverloadPacket, an OpOverload, or operator.getitem
    rule: Rule
    samples: tuple[Sample, ...]
    exact: bool = False
    random: bool = False

    @property
    def name(self) -> str:
        return getattr(self.key, "__name__", str(self.key)) if self.key is operator.getitem else str(self.key)


TABLE: dict[object, RuleEntry] = {}


def _add(keys, rule: Rule, samples: list[Sample] | Callable[[object], list[Sample]], *, exact: bool = False,
         random: bool = False) -> None:
    for key in keys:
        s = samples(key) if callable(samples) else samples
        TABLE[key] = RuleEntry(key, rule, tuple(s), exact, random)


def _default(packet):
    return packet.default


# --- pointwise ------------------------------------------------------------------------------------------------
_UNARY_OPS = ("relu", "silu", "tanh", "sigmoid", "neg", "exp", "erf", "abs", "sin", "cos", "square",
              "softplus", "mish", "elu", "hardswish", "hardsigmoid", "hardtanh", "leaky_relu", "sign", "floor",
              "ceil", "round", "trunc", "expm1", "atan", "logical_not", "bitwise_not", "clone", "contiguous",
              "alias", "detach", "lift_fresh_copy")
_POS_OPS = ("log", "sqrt", "rsqrt", "reciprocal", "log1p", "log2")
for _n in _UNARY_OPS:
    _p = getattr(aten, _n)
    _args = [(mask(3, 5),), (mask(2, 7, 3),)] if _n in ("logical_not", "bitwise_not") else UNARY
    _add([_p], pointwise.elementwise, calls(_p.default, *_args), exact=_n in ("clone", "contiguous", "alias",
                                                                              "detach", "lift_fresh_copy", "neg"))
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
_add([aten.rsub], pointwise.elementwise, calls(aten.rsub.Scalar, (t(3, 5), 1.0)))
_add([aten.pow.Tensor_Scalar], pointwise.elementwise, calls(aten.pow.Tensor_Scalar, (t(3, 5), 2), (pos(2, 7, 3), 0.5)))
_add([aten.pow.Tensor_Tensor], pointwise.elementwise, calls(aten.pow.Tensor_Tensor, (pos(3, 5), t(3, 5))))
for _n in ("maximum", "minimum", "atan2", "remainder", "floor_divide", "fmod"):
    _p = getattr(aten, _n)
    _ov = _p.Tensor if _n in ("remainder", "fmod") else _p.default
    _add([_p], pointwise.elementwise, calls(_ov, (t(3, 5), pos(3, 5)), (t(2, 3, 5), pos(5))))
_add([aten.max.other, aten.min.other], pointwise.elementwise, lambda o: calls(o, *BINARY))
for _n in ("eq", "ne", "le", "lt", "ge", "gt"):
    _p = getattr(aten, _n)
    _add([_p], pointwise.elementwise, [*calls(_p.Tensor, *BINARY), *calls(_p.Scalar, (t(3, 5), 0.1))])
for _n in ("logical_and", "logical_or", "__and__", "__or__", "bitwise_and", "bitwise_or"):
    _p = getattr(aten, _n)
    _add([_p], pointwise.elementwise, calls(_p.Tensor if hasattr(_p, "Tensor") else _p.default,
                                            (mask(3, 5), mask(3, 5)), (mask(2, 3, 5), mask(5))))
_add([aten.where], pointwise.elementwise, [*calls(aten.where.self, (mask(3, 5), t(3, 5), t(3, 5)),
                                                  (mask(2, 1, 5), t(3, 5), t(2, 3, 1))),
                                           *calls(aten.where.ScalarOther, (mask(3, 5), t(3, 5), 0.0)),
                                           *calls(aten.where.ScalarSelf, (mask(3, 5), 1.0, t(3, 5)))])
_add([aten.masked_fill], pointwise.elementwise, [*calls(aten.masked_fill.Scalar, (t(3, 5), mask(3, 5), -1.0),
                                                        (t(2, 3, 5), mask(3, 5), 0.0)),
                                                 *calls(aten.masked_fill.Tensor, (t(3, 5), mask(3, 5), t()))])
_add([aten.clamp], pointwise.elementwise, [*calls(aten.clamp.default, (t(3, 5), -0.5, 0.5), (t(3, 5), 0.0)),
                                           *calls(aten.clamp.Tensor, (t(3, 5), t(3, 5), None))])
_add([aten.clamp_min, aten.clamp_max], pointwise.elementwise, lambda p: calls(p.default, (t(3, 5), 0.1)))
_add([aten.addcmul, aten.addcdiv], pointwise.elementwise,
     lambda p: calls(p.default, (t(3, 5), t(3, 5), pos(3, 5)), value=0.5))
_add([aten.lerp], pointwise.elementwise, calls(aten.lerp.Scalar, (t(3, 5), t(3, 5), 0.3)))
_add([aten.dropout], pointwise.elementwise, calls(aten.dropout.default, (t(3, 5), 0.0, True), (t(2, 7, 3), 0.5, False)))
_add([aten.native_dropout], pointwise.elementwise, calls(aten.native_dropout.default, (t(3, 5), 0.0, False)))
_add([aten._to_copy], pointwise.elementwise, [
    *calls(aten._to_copy.default, (t(3, 5),), dtype=torch.bfloat16),
    *calls(aten._to_copy.default, (t(3, 5),), dtype=torch.float64),
    *calls(aten._to_copy.default, (t(3, 5, dtype=torch.bfloat16),), dtype=torch.float32),
    *calls(aten._to_copy.default, (t(3, 5),), dtype=torch.float32)], exact=True)
# (random=True rows: values undefined or random; the harness checks shapes, the semantics tests the RNG)
_add([aten.to], pointwise.elementwise, [*calls(aten.to.dtype, (t(3, 5), torch.float16), (t(3, 5), torch.float64),
                                               (t(2, 7, 3), torch.float32)),
                                        *calls(aten.to.device, (t(3, 5), torch.device("cpu"), torch.bfloat16))],
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
     calls(aten.argsort.default, (t(3, 7),), (t(5, 2, 3), 0)), exact=True)
_add([aten.topk], pointwise.along(pointwise.dim_arg(2, default=-1)),
     calls(aten.topk.default, (t(3, 7), 2), (t(5, 2, 3), 3, 0), (t(2, 7, 3), 1, 1, False)), exact=True)

# --- reductions -----------------------------------------------------------------------------------------------
_add([aten.sum], pointwise.reduction, [*calls(aten.sum.default, (t(3, 7),), (t(2, 5, 3),)),
                                       *calls(aten.sum.dim_IntList, (t(3, 7), [1]), (t(5, 2, 3), [0, 2], True),
                                              (t(2, 5, 3), [-1])),
                                       *calls(aten.sum.dim_IntList, (t(5, 3), [0]), dtype=torch.float64)])
_add([aten.mean], pointwise.reduction, [*calls(aten.mean.default, (t(3, 7),), (t(2, 5, 3),)),
                                        *calls(aten.mean.dim, (t(3, 7), [1]), (t(5, 2, 3), [0, 2], True),
                                               (t(2, 5, 3), [-1]), (t(9, 3), [0]))])
_add([aten.amax, aten.amin], pointwise.kept_dims(), lambda p: calls(p.default, (t(3, 7), [1]), (t(5, 2, 3), [0, 2], True)))
_add([aten.argmax, aten.argmin], pointwise.kept_dims(), lambda p: calls(p.default, (t(3, 7), 1), (t(5, 2, 3), 0, True)))
_add([aten.max.dim, aten.min.dim], pointwise.kept_dims(), lambda o: calls(o, (t(3, 7), 1), (t(5, 2, 3), 0, True)))
_add([aten.logsumexp], pointwise.kept_dims(), calls(aten.logsumexp.default, (t(3, 7), [1]), (t(5, 2, 3), [0], True)))
_add([aten.var, aten.std], pointwise.kept_dims(keep_index=None),
     lambda p: [*calls(p.correction, (t(3, 7), [1]), correction=1), *calls(p.correction, (t(5, 2, 3), [0, 2]), keepdim=True),
                *calls(p.dim, (t(3, 7), [1]))])
_add([aten.var_mean], pointwise.kept_dims(keep_index=None), calls(aten.var_mean.correction, (t(3, 7), [1]), correction=0))
_add([aten.linalg_vector_norm], pointwise.kept_dims(2, 3), calls(aten.linalg_vector_norm.default, (t(3, 7), 2, [1]),
                                                                 (t(5, 2, 3), 2.0, [0], True)))
_add([aten.prod.dim_int], pointwise.kept_dims(), calls(aten.prod.dim_int, (pos(3, 7), 1), (pos(5, 2, 3), 0, True)))
_add([aten.any, aten.all], pointwise.kept_dims(), lambda p: calls(p.dim, (mask(3, 7), 1), (mask(5, 2, 3), 0, True)))

# --- data movement --------------------------------------------------------------------------------------------
_add([aten.view, aten._unsafe_view, aten.reshape], shape_ops.reshape_like,
     lambda p: calls(p.default, (t(6, 5), [2, 3, 5]), (t(2, 3, 5), [6, 5]), (t(3, 4, 5), [3, 20]), (t(7, 5), [35]),
                     (t(4, 6), [4, 2, 3]), (t(5, 6), [5, 6])), exact=True)
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
_add([aten.expand], shape_ops.dim_map(shape_ops.expand_map), calls(aten.expand.default, (t(3, 1), [3, 5]),
                                                                    (t(5,), [2, 3, 5]), (t(3, 5), [-1, 5])), exact=True)
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
                                                  (t(7, 5, 3), [ints(7, 2)], t(3)), (t(7, 5), [mask(7)], t(1), True)))
_add([aten.pad], shape_ops.constant_pad, calls(aten.pad.default, (t(3, 5), [1, 2]), (t(3, 5, 4), [1, 1, 0, 2], "constant", 0.5)),
     exact=True)
_add([aten.constant_pad_nd], shape_ops.constant_pad, calls(aten.constant_pad_nd.default, (t(3, 5), [1, 2])), exact=True)

# --- contractions ---------------------------------------------------------------------------------------------
_add([aten.linear], linalg.linear, calls(aten.linear.default, (t(3, 5), t(7, 5)), (t(2, 3, 5), t(6, 5), t(6)),
                                         (t(2, 5, 3, 4), t(3, 4))))
_add([aten.addmm], linalg.addmm, calls(aten.addmm.default, (t(7), t(3, 5), t(5, 7)), (t(3, 1), t(3, 5), t(5, 6))))
_add([aten.mm], linalg.matmul, calls(aten.mm.default, (t(3, 5), t(5, 7))))
_add([aten.bmm], linalg.matmul, calls(aten.bmm.default, (t(3, 5, 4), t(3, 4, 7))))
_add([aten.matmul], linalg.matmul, calls(aten.matmul.default, (t(2, 3, 5), t(5, 7)), (t(2, 3, 5, 4), t(3, 4, 6))))
_add([aten.einsum], linalg.einsum, calls(aten.einsum.default, ("bij,bjk->bik", [t(3, 5, 4), t(3, 4, 7)]),
                                         ("ebd,edf->ebf", [t(3, 5, 4), t(3, 4, 6)]), ("bhld,bhsd->bhls", [t(2, 3, 5, 4), t(2, 3, 7, 4)]),
                                         ("ij,j->i", [t(5, 7), t(7)]), ("...d,de->...e", [t(2, 5, 3), t(3, 7)]),
                                         ("nchw,cd->nhwd", [t(2, 3, 5, 4), t(3, 6)]), ("ii->i", [t(5, 5)]),
                                         ("ij,kj", [t(3, 5), t(4, 5)])))
_add([aten.embedding], linalg.embedding, calls(aten.embedding.default, (t(11, 5), ints(11, 3, 4)), (t(13, 3), ints(13, 7)),
                                               (t(11, 5), ints(11, 3, 4), 2)))
_add([aten.scaled_dot_product_attention], linalg.sdpa, [
    *calls(aten.scaled_dot_product_attention.default, (t(3, 2, 5, 4), t(3, 2, 7, 4), t(3, 2, 7, 4))),
    *calls(aten.scaled_dot_product_attention.default, (t(2, 3, 5, 4), t(2, 3, 5, 4), t(2, 3, 5, 4)), is_causal=True),
    *calls(aten.scaled_dot_product_attention.default, (t(2, 3, 5, 4), t(2, 3, 6, 4), t(2, 3, 6, 4), t(5, 6))),
    *calls(aten.scaled_dot_product_attention.default, (t(2, 4, 5, 4), t(2, 2, 5, 4), t(2, 2, 5, 4)), enable_gqa=True)])

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
_add([aten.conv1d, aten.conv2d], nn_ops.convolution, lambda p: (
    calls(p.default, (t(3, 4, 9), t(6, 4, 3)), (t(3, 4, 9), t(6, 4, 3), t(6), [2], [1]), (t(5, 4, 7), t(4, 1, 3), t(4), [1], [1], [1], 4))
    if p is aten.conv1d else
    calls(p.default, (t(3, 4, 7, 6), t(5, 4, 3, 3)), (t(3, 4, 7, 6), t(5, 4, 3, 3), t(5), [1, 2], [1, 1]),
          (t(2, 6, 5, 5), t(6, 3, 3, 3), None, [1], [0], [1], 2))))
_add([aten.max_pool2d], nn_ops.pooling(False, 2), calls(aten.max_pool2d.default, (t(3, 4, 7, 6), [2, 2]), (t(3, 4, 7, 6), [3, 3], [2, 2], [1, 1])))
_add([aten.avg_pool2d], nn_ops.pooling(True, 2), calls(aten.avg_pool2d.default, (t(3, 4, 7, 6), [2, 2]), (t(3, 4, 7, 6), [3, 3], [2, 2], [1, 1])))
_add([aten.adaptive_avg_pool2d], nn_ops.pooling(True, 2), calls(aten.adaptive_avg_pool2d.default, (t(3, 4, 7, 6), [1, 1]), (t(3, 4, 7, 6), [3, 2])))
_add([aten.max_pool1d], nn_ops.pooling(False, 1), calls(aten.max_pool1d.default, (t(3, 4, 9), [2])))
_add([aten.avg_pool1d], nn_ops.pooling(True, 1), calls(aten.avg_pool1d.default, (t(3, 4, 9), [3])))
_add([aten.adaptive_avg_pool1d], nn_ops.pooling(True, 1), calls(aten.adaptive_avg_pool1d.default, (t(3, 4, 9), [2])))
_add([aten.cross_entropy_loss], nn_ops.cross_entropy, [
    *calls(aten.cross_entropy_loss.default, (t(7, 5), ints(5, 7)), (t(7, 5), ints(5, 7), None, 2), (t(7, 5), ints(5, 7), None, 0),
           (t(6, 5), ints(5, 6), None, 1, 2), (t(7, 5), ints(5, 7), pos(5, grad=False)), (t(7, 5), ints(5, 7), pos(5, grad=False), 1, 3, 0.1),
           (t(7, 5), ints(5, 7), None, 1, -100, 0.2), (t(3, 5, 4), ints(5, 3, 4)), (t(3, 5, 4), ints(5, 3, 4), None, 0),
           (t(7, 5), T((7, 5), "prob")), (t(7, 5), T((7, 5), "prob"), None, 2))])
_add([aten.lstm], nn_ops.lstm, calls(aten.lstm.input, (t(5, 3, 4), [t(1, 3, 6), t(1, 3, 6)],
                                                        [t(24, 4), t(24, 6), t(24), t(24)], True, 1, 0.0, True, False, False),
                                     (t(4, 5, 3), [t(2, 5, 4), t(2, 5, 4)],
                                      [t(16, 3), t(16, 4), t(16, 4), t(16, 4)], False, 2, 0.0, True, False, False),
                                     (t(3, 5, 4), [t(1, 3, 6), t(1, 3, 6)],
                                      [t(24, 4), t(24, 6), t(24), t(24)], True, 1, 0.0, True, False, True)))

# --- in-place forms: the out-of-place rule, the mutated input keeping its layout -------------------------------
_INPLACE = {
    aten.add_: [*calls(aten.add_.Tensor, *BINARY[:2]), *calls(aten.add_.Tensor, (t(3, 5), 1.0))],
    aten.mul_: calls(aten.mul_.Tensor, *BINARY[:2], (t(3, 5), 0.5)),
    aten.sub_: calls(aten.sub_.Tensor, *BINARY[:2]),
    aten.div_: calls(aten.div_.Tensor, (t(3, 5), pos(3, 5)), (t(3, 5), 2.0)),
    aten.relu_: calls(aten.relu_.default, *UNARY), aten.silu_: calls(aten.silu_.default, *UNARY),
    aten.gelu_: calls(aten.gelu_.default, *UNARY), aten.tanh_: calls(aten.tanh_.default, *UNARY),
    aten.sigmoid_: calls(aten.sigmoid_.default, *UNARY), aten.neg_: calls(aten.neg_.default, *UNARY),
    aten.exp_: calls(aten.exp_.default, *UNARY), aten.detach_: calls(aten.detach_.default, *UNARY),
    aten.hardtanh_: calls(aten.hardtanh_.default, *UNARY), aten.leaky_relu_: calls(aten.leaky_relu_.default, *UNARY),
    aten.clamp_: calls(aten.clamp_.default, (t(3, 5), -0.5, 0.5)),
    aten.clamp_min_: calls(aten.clamp_min_.default, (t(3, 5), 0.0)),
    aten.masked_fill_: calls(aten.masked_fill_.Scalar, (t(3, 5), mask(3, 5), 0.0)),
    aten.fill_: [*calls(aten.fill_.Scalar, (t(3, 5), 1.0)), *calls(aten.fill_.Tensor, (t(3, 5), t()))],
    aten.zero_: calls(aten.zero_.default, *UNARY),
    aten.copy_: calls(aten.copy_.default, (t(3, 5), t(3, 5)), (t(2, 3, 5), t(5))),
    aten.index_put_: calls(aten.index_put_.default, (t(7, 5), [ints(7, 3)], t(3, 5))),
}
_BASE = {aten.add_: aten.add, aten.mul_: aten.mul, aten.sub_: aten.sub, aten.div_: aten.div, aten.relu_: aten.relu,
         aten.silu_: aten.silu, aten.gelu_: aten.gelu, aten.tanh_: aten.tanh, aten.sigmoid_: aten.sigmoid,
         aten.neg_: aten.neg, aten.exp_: aten.exp, aten.detach_: aten.detach, aten.hardtanh_: aten.hardtanh,
         aten.leaky_relu_: aten.leaky_relu, aten.clamp_: aten.clamp, aten.clamp_min_: aten.clamp_min,
         aten.masked_fill_: aten.masked_fill, aten.fill_: aten.fill, aten.zero_: aten.zeros_like,
         aten.copy_: aten.maximum, aten.index_put_: aten.index_put}
for _p, _s in _INPLACE.items():
    _add([_p], pointwise.inplace(TABLE[_BASE[_p]].rule), _s, exact=_p in (aten.fill_, aten.zero_, aten.detach_, aten.copy_))


def rule_for(target: object) -> Rule | None:
    """The rule of an OpOverload (its own row, else its packet's row) or of operator.getitem; None when the
    table has none (the planner then replicates the node and records a fallback)."""
    entry = TABLE.get(target)
    if entry is None:
        entry = TABLE.get(getattr(target, "overloadpacket", None))
    return entry.rule if entry is not None else None
