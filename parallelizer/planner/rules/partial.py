"""Exact Partial semantics, in one place (DESIGN.md rule 9).

A `Partial("sum")` value x = sum_r x_r is held as one summand per rank of the mesh axis. An op f may run
on the summands and leave its output Partial only when f(sum_r x_r) = sum_r f(x_r) in floating point up to
reassociation: f is linear in that input, every other input being Replicate (or a Python scalar) and
entering f the same way on every rank. Anything else gets its input reduced first (the planner prices the
all-reduce or reduce-scatter that makes it Replicate or Shard):

| op                                                         | Partial input allowed          | output  |
|------------------------------------------------------------|--------------------------------|---------|
| add, sub of two tensors                                    | both inputs Partial            | Partial |
| add, sub with a Python scalar or a Replicate tensor        | no: the constant would be      |         |
|                                                            | added once per rank            |         |
| mul                                                        | one input, the other Replicate | Partial |
|                                                            | or a Python scalar             |         |
| div without rounding_mode                                  | the numerator; the denominator | Partial |
|                                                            | Replicate or a Python scalar   |         |
| neg, clone, contiguous, alias, detach, lift_fresh_copy     | yes                            | Partial |
| dropout (the mask is the same on every summand,            | yes                            | Partial |
|   `rewriter.localize.seeded_per_shard`)                    |                                |         |
| casts to the same dtype or an exactly wider float          | yes                            | Partial |
|   (bf16/fp16 -> fp32 -> fp64)                              |                                |         |
| casts to a narrower or another dtype (rounding)            | no                             |         |
| views, permute, transpose, expand, slice, select, split,   | yes (data movement)            | Partial |
|   cat, getitem, flip, roll, tril/triu, cumsum              |   (in their own rules)         |         |
| sum, mean over dims                                        | yes (`reduction` rule)         | Partial |
| mm, bmm, matmul, linear, einsum, conv without bias         | one operand, the others        | Partial |
|                                                            | Replicate                      |         |
| every other op: exp, abs, max, norms, softmax, where,      | no                             |         |
|   masked_fill, comparisons, rsqrt, pow, ...                |                                |         |

The rule harness (tests/rules) executes every Partial option of every rule on per-rank summands and
compares with the op on their sum, so an entry that breaks this table fails the suite.
"""
from __future__ import annotations

import torch
import torch.fx

from .base import P, R, AxisOption, OpView, aten

# pointwise packet -> how it may take Partial inputs ("all": every tensor input Partial; "one": any one
# input Partial, the others Replicate; "first": only the first input; "unary": the single tensor input)
_LINEAR_POINTWISE = {
    aten.add: "all", aten.sub: "all", aten.mul: "one", aten.div: "first",
    aten.neg: "unary", aten.clone: "unary", aten.contiguous: "unary", aten.alias: "unary",
    aten.detach: "unary", aten.lift_fresh_copy: "unary", aten.dropout: "unary",
}
_CASTS = {aten._to_copy, aten.to, aten.type_as}
_EXACT_WIDER = {torch.bfloat16: (torch.float32, torch.float64), torch.float16: (torch.float32, torch.float64),
                torch.float32: (torch.float64,)}


def exact_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """True when casting `src` values to `dst` rounds nothing (same dtype, or an exactly wider float)."""
    return src == dst or dst in _EXACT_WIDER.get(src, ())


def _scalar_operand(v: OpView) -> bool:
    """True when a binary pointwise op got a Python number as its other operand (`x + 10`)."""
    return v.n_in == 1 and any(isinstance(a, (int, float, bool)) for a in v.args[1:2])


def pointwise_partial_options(v: OpView) -> list[AxisOption]:
    """The Partial options of a pointwise op, per the module table (none for a non-float output)."""
    if not v.out_is_float or v.n_in == 0:
        return []
    if v.packet in _CASTS:
        return [AxisOption((P,) + (R,) * (v.n_in - 1), P)] if exact_cast(v.in_dtypes[0], v.out_dtypes[0]) else []
    kind = _LINEAR_POINTWISE.get(v.packet)
    if v.packet is aten.div and (v.kwargs.get("rounding_mode") is not None or v.overload.endswith("_mode")):
        return []  # floor / trunc division rounds
    if kind == "unary" and v.n_in == 1:
        return [AxisOption((P,), P)]
    if kind == "all":
        return [] if _scalar_operand(v) else [AxisOption((P,) * v.n_in, P)]
    if kind in ("one", "first"):
        if v.n_in == 1:  # x * 2, x / 2: scaling by a Python number (not 2 / x)
            return [AxisOption((P,), P)] if kind == "one" or isinstance(v.args[0], torch.fx.Node) else []
        opts = [AxisOption((P, R), P)]
        return opts + [AxisOption((R, P), P)] if kind == "one" else opts
    return []
