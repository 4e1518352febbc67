"""How a rehearsal judges a plan's value against one device's (`runtime.rehearsal`, `runtime.pipeline_rehearsal`).

The loss a rehearsal backpropagates (`_loss`), the pairing of outputs (`_output_pairs`), and the three judges of a
(plan, one device[, exact]) pair, combined by `_max_diff`: the dtype-aware bound (`runtime.tolerance.excess`),
a float64 copy of the model (`float64_excess`, used only where that copy computes what the model does:
`same_computation`, `wide_judged`, `unused_float64`) and, under a mixed-precision recipe, the model run without
it (`recipe_excess`). `random_ops` names what makes a forward draw other numbers on each side. Split from
`runtime.rehearsal` (round 23); that module re-exports every name.
"""
from __future__ import annotations

import math

import torch
from torch.utils import _pytree as pytree

from ..tracer.graph import as_real, carries_grad
from ..tracer.node_facts import drawing_ops, op_label
from ..tracer.host_state import frozen_host_state
from ..tracer.leaves import pair_by_path
from ..tracer.watch import HOST_RNG_NOTE, HOST_RNG_SITES
from .tolerance import excess, tolerances
from .widen import as_float64


def _loss(output) -> torch.Tensor:
    """The model's scalar loss when its first output is one; else a weighted mean of squares of the first
    output, each index c of its last dim (of C) weighted 1 + c / C when it has >= 2 dims. The plain mean of
    squares of a LayerNorm output at its initial weights is ~1 whatever came before it, so the gradients of
    everything before the norm were below float32 rounding and a wrong one compared as a match (YolosModel:
    true gradients <= 1.8e-4, rounding 6.1e-4; trial 10f); the weights break that invariance and depend on the
    feature index only, so every batch and microbatch split gives the same loss."""
    first = next(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
    if first.ndim == 0:
        return first
    squares = first.float().pow(2)
    if first.ndim >= 2:
        size = first.shape[-1]
        squares = squares * (1 + torch.arange(size, dtype=squares.dtype, device=squares.device) / size)
    return squares.mean()


def _output_pairs(out, ref_outs: list) -> list[tuple]:
    """("output <key path>", the plan's tensor, each reference's) for every tensor leaf of the outputs, paired
    by key path (`tracer.leaves`: a ModelOutput may hold its fields in another order than the reference's);
    a structure with other paths pairs by position, and a different number of tensors is never a match."""
    paired = pair_by_path(out, *ref_outs)
    if paired is None:
        tensors = [tensor_leaves(o) for o in (out, *ref_outs)]
        if len({len(t) for t in tensors}) != 1:
            nan = torch.tensor(float("nan"))
            return [(f"output: {len(tensors[0])} tensors, the reference returned {len(tensors[1])}", nan,
                     torch.tensor(0.0), *([torch.tensor(0.0)] * (len(tensors) - 2)))]
        return [("output", *ts) for ts in zip(*tensors)]
    return [(f"output {path}", a, *bs) for path, a, *bs in paired if isinstance(a, torch.Tensor)]


def _max_diff(pairs, compute, judge=None) -> tuple[float, str, float]:
    """(largest |a - b|, name where it occurs, largest ratio to the bound) over (name, a, b) or
    (name, a, b, exact): the ratio is `tolerance.excess`'s at the dtype `compute(name)` (a callable: the dtype
    of the computation that reaches that tensor, `runtime.reach`; or one dtype for all), or with `exact` the smaller of it and
    `judge(a, b, exact)` (a match by either criterion): `recipe_excess` (the default) when `exact` is the
    reference's value without its mixed-precision recipe, `float64_excess` when it is a float64 copy's."""
    judge = judge or recipe_excess
    worst, ratio = (0.0, ""), 0.0
    for name, a, b, *exact in pairs:
        if not a.numel():
            continue
        odd = ~b.detach().isfinite()
        if not torch.equal(~a.detach().isfinite(), odd) or not torch.equal(a.detach()[odd].nan_to_num(nan=0.0),
                                                                            b.detach()[odd].nan_to_num(nan=0.0)):
            # NaN / inf on one side only, or an inf of the other sign: never a match (max() and `>` ignore NaN, and
            # inf / inf is NaN, so a difference at an inf the other side lacks read as 0: a silent "match", e.g.
            # one device's float16 loss overflowing to inf where the sharded program's local sums stay finite)
            worst, ratio = max(worst, (math.inf, name)), math.inf
            continue
        # equal NaN / inf on both sides are equal values (torch.testing's equal_nan): compared as zeros
        a, b = a.detach().masked_fill(odd, 0), b.detach().masked_fill(odd, 0)
        exact = [e.detach().masked_fill(odd, 0) for e in exact]
        diff = (as_real(a).double() - as_real(b).double()).abs().max().item()  # complex: both parts (`as_real`)
        worst = max(worst, (diff, name))
        dtype = compute(name) if callable(compute) else compute
        ratio = max(ratio, min([excess(a, b, dtype), *(judge(a, b, e) for e in exact)]))
    return worst[0], worst[1], ratio


SAME_COMPUTATION_RTOL = 1e-4  # `same_computation`: how far an fp32 reference's outputs may lie from float64's
LOW_PRECISION_SAME_FACTOR = 8  # `same_computation`: a 16-bit reference's, in units of its dtype's rtol
ORDER_FACTOR = 8  # `float64_excess`: rounding of another summation order, against the one-device model's
WIDE_JUDGED = (torch.float32, torch.bfloat16, torch.float16)  # compute dtypes `float64_excess` judges


def float64_excess(actual: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest |actual - exact| over atol + rtol |exact| + 8 max |expected - exact|, elementwise, where
    `exact` is the same tensor of a float64 copy of the single-device model and (rtol, atol) are
    `torch.testing.assert_close`'s for `expected`'s dtype (float32's for a float32 or non-floating one; a bf16
    model's tensors get bfloat16's). So an element may lie from the float64 value up to 8 times as far as the
    single-device model in its own dtype lies from it anywhere in the tensor: a gradient that is a sum of
    large terms cancelling to a small one (a bias feeding a BatchNorm: 9.4e-5 of fp32 rounding on one device,
    1.1e-4 sharded, MobileViT on tp=2; in a bf16 model 6.9 of rounding on one device against a true 0) is
    judged by the rounding its terms carry, which the plain bound (relative to the small result) is not. The
    factor 8: the sharded program sums in another order (per-rank partial sums then a reduction), and two
    orders of the same fp32 terms lie up to 5.7x as far from float64 as each other (measured: 400 random
    orders of 1024 cancelling terms of magnitude 100, whole and as two halves; median 2x). A wrong program (a
    missing or doubled term) is off by the size of the terms, orders of magnitude beyond their rounding, and
    stays outside. Used only when the two references are the same computation (`same_computation`)."""
    a, b, e = (as_real(t.detach()) for t in (actual, expected, exact))
    dtype = b.dtype if b.dtype.is_floating_point and b.dtype.itemsize <= 2 else torch.float32
    rtol, atol = tolerances(dtype)
    a, b, e = a.double(), b.double(), e.double()
    noise = (b - e).abs().max().item()
    diff = (a - e).abs()
    bound = atol + rtol * e.abs() + ORDER_FACTOR * noise
    return torch.where(diff == 0, torch.zeros_like(diff), diff / bound).max().item()


def wide_judged(compute: torch.dtype | None, traced) -> bool:
    """Whether a case computing in `compute` may be judged by a float64 copy (`float64_excess`): fp32, bf16 and
    fp16 programs; a 16-bit one only when its forward draws no random numbers (`random_ops`), since its outputs
    lie too far from float64's for `same_computation` to tell another dropout mask from rounding."""
    return compute in WIDE_JUDGED and (compute == torch.float32 or not random_ops(traced))


def same_computation(low: list[torch.Tensor], fp64: list[torch.Tensor], compute: torch.dtype | None) -> bool:
    """Whether a float64 copy computed what the model in its own dtypes did, computing in `compute`
    (`runtime.tolerance.compute_dtype`): the first forward's output tensors agree within 1e-4 of their largest
    magnitude + float32's atol when it computes in fp32, 8 rtol of the dtype in 16 bits (bf16: 12.8%, for a
    model that lies further from float64 on one device the float64 copy judges nothing). Not when the copy
    drew other random numbers (dropout masks, whose draws may depend on the dtype) or took another branch;
    then `float64_excess` is not used."""
    atol = tolerances(torch.float32)[1]
    low_precision = compute is not None and compute.itemsize <= 2
    rtol = LOW_PRECISION_SAME_FACTOR * tolerances(compute)[0] if low_precision else SAME_COMPUTATION_RTOL
    return len(low) == len(fp64) and all(
        a.shape == b.shape and (not carries_grad(a.dtype) or (as_real(a).double() - as_real(b).double()).abs().max()
                                .item() <= rtol * as_real(b).double().abs().max().item() + atol)
        for a, b in zip(low, fp64) if a.numel())


def tensor_leaves(tree) -> list[torch.Tensor]:
    """The tensors among the leaves of `tree` (a model's outputs, a call's inputs), in pytree order."""
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def widened(tree):
    """`tree` with float64 copies of its floating tensors (the inputs of a float64 copy of the model)."""
    return pytree.tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree)


def _float64_run(model: torch.nn.Module, inputs: tuple, kwargs: dict):
    """(output, (inputs, kwargs)) of `model` converted to float64 (`runtime.widen.as_float64`: parameters and
    floating buffers, and every tensor its forward makes or casts in a narrower floating dtype) on float64
    copies of the floating inputs; else the reason it cannot run in float64 (a str: the error's type and first
    line), and then the plain bound alone judges (`float64_excess`) and the report says why."""
    wide = widened((inputs, kwargs))
    as_float64(model)
    try:
        return model(*wide[0], **wide[1]), wide
    except (RuntimeError, TypeError, ValueError) as error:  # e.g. a custom op with a float32-only kernel
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"


def unused_float64(run64, outputs, compute: torch.dtype | None) -> str:
    """Why the float64 copy's run `run64` (`_float64_run`) cannot judge a model whose own outputs are `outputs`,
    computing in `compute`; "" when it can (`same_computation`). Said in the report of a case that differs, so
    that a reader knows only the plain bound judged it."""
    if isinstance(run64, str):
        return f"the float64 copy of the model did not run ({run64})"
    if not same_computation(tensor_leaves(outputs), tensor_leaves(run64[0]), compute):
        return ("the float64 copy of the model computed other outputs (another branch or other random draws; "
                "`same_computation`)")
    return ""


def recipe_excess(actual: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor) -> float:
    """max |actual - exact| / (2 max |expected - exact|): how far the sharded program under a mixed-precision
    recipe lies from the model run without it (`exact`, fp32), against how far the single-device model under
    the same recipe (`expected`) lies from it, on the same tensor. Both round the same computation at bf16 in
    different orders (per-rank partial sums, bf16 Partial reductions), so the sharded program may be as far
    from the fp32 values as the single-device recipe is, with a factor 2 of margin for its extra roundings (as
    `runtime.tolerance` allows two computations); a wrong program (a missing or doubled term) is off by the
    size of the values. Needed because bf16 rounding of a sum with cancellation (a weight gradient summed over
    tokens, split over data-parallel ranks) is large against the result, which a bound relative to the
    result's scale misses, and AdamW turns rounding noise in tiny gradients into steps of about lr on either
    side. <= 1 is a match; inf for a deviation where the recipe changes nothing (0 when neither deviates).
    `expected` is unused beyond its deviation; the direct comparison is `runtime.tolerance.excess`."""
    actual, expected, exact = (as_real(t.detach()).double() for t in (actual, expected, exact))
    diff = (actual - exact).abs().max().item()
    noise = (expected - exact).abs().max().item()
    return diff / (2 * noise) if noise else 0.0 if diff == 0 else float("inf")


def _grad_or_zeros(p: torch.Tensor) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def random_ops(traced) -> str:
    """The ops of the traced forward that draw random numbers (`tracer.graph.draws_random`: dropout p > 0,
    bernoulli, rand..., SDPA with dropout_p > 0), as 'node (op)' (the first 3), and the host generator draws the
    tracer noted (numpy / Python random: values frozen at trace time, e.g. LayerDrop or SpecAugment; traced with
    `allow_frozen_host_random`), each site named (function, file:line, module) with the remedy; '' if none."""
    found = [op_label(node) for node in drawing_ops(traced.graph_module)]
    text = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    host = next((n for n in traced.notes if n.startswith(HOST_RNG_NOTE)), None)
    if host is not None:
        text += ("; " if text else "") + "numpy / Python random in forward, FROZEN at trace time" + \
            (f" ({host.split(HOST_RNG_SITES, 1)[1]})" if HOST_RNG_SITES in host else "") + \
            (": the program repeats that one draw at every step while the model draws anew per call, so it trains "
             "differently, not only with other masks; switch the draw off (e.g. transformers' mask_time_prob=0, "
             "layerdrop=0) or draw with torch")
    if frozen := frozen_host_state(traced.notes):  # generator objects, counters, the clock, reseeding (round 22)
        text += ("; " if text else "") + frozen
    return text
