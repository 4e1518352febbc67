"""How close a sharded program's numbers must be to the single-device model's: dtype-aware tolerances.

The tolerances are torch.testing.assert_close's defaults for a dtype (float32: rtol 1.3e-6, atol 1e-5;
bfloat16: rtol 1.6e-2, atol 1e-5; float16: rtol 1e-3, atol 1e-5; float64: rtol 1e-7, atol 1e-7; exact for
integers and bool), taken for the LEAST precise floating dtype involved: the compared tensor's, or that of the
computation that reaches it (`runtime.reach.reach_dtypes`, per output, gradient and parameter: an fp32 model
whose values pass through a `torch.autocast(bfloat16)` region carry bfloat16 rounding in its fp32 outputs and
gradients; a float16 side branch rounds only what it reaches). `compute_dtype`, the least precise dtype of the
whole graph, is what `runtime.reach` falls back to for a value it does not map, and what decides whether a
float64 copy may judge a model (`rehearsal.wide_judged`).

How the bound applies:
- 32- and 64-bit floats, elementwise as assert_close: |a - b| <= atol + rtol * |b|;
- 16-bit floats, relative to the tensor's scale and for two computations: |a - b| <= 2 (atol + rtol max|b|).
  A 16-bit result is rounded at every step of its computation, so its error is a few units in the last
  place (2^-8 relative for bfloat16) of the terms it was formed from, not of itself: an element that is a
  small difference of large terms (a gradient summed over a batch, an output after LayerNorm) carries the
  absolute error of the large terms, which the tensor's largest magnitude stands for. And both sides are
  such computations: eager (one device) and the sharded program (bf16 partial sums reduced across ranks;
  the tracer's split of a linear layer's bias, which rounds the matmul before adding the bias instead of
  once after: one ulp, 0.0078 at magnitude 1-2) each lie within the dtype's tolerance of the exact value,
  so they lie within twice of each other. A real error (a missing, doubled or misplaced term) is of the
  size of the values themselves and stays far outside (measured, tests/distributed/test_precision.py: a
  bf16 MLP on dp=2 and tp=2 reaches 0.59 of this bound, after 3 AdamW steps; elementwise, its near-zero
  gradient elements exceed assert_close's bf16 bound up to 16 times).
"""
from __future__ import annotations

import torch

from ..tracer.graph import TracedGraph, as_real


def tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) of `torch.testing.assert_close` for `dtype` (torch's own table, read through the private
    `torch.testing._comparison.default_tolerances`, checked on torch 2.13.0)."""
    from torch.testing._comparison import default_tolerances

    return default_tolerances(dtype)


def loosest(*dtypes: torch.dtype | None) -> torch.dtype | None:
    """The dtype with the largest default rtol among `dtypes` (None entries ignored); None when there is none."""
    return max((d for d in dtypes if d is not None), key=lambda d: tolerances(d)[0], default=None)


def compute_dtype(traced: TracedGraph) -> torch.dtype | None:
    """The least precise floating dtype any node of `traced` computes (None when none is floating): the whole
    graph's; a compared tensor is judged at the dtype of what reaches it (`runtime.reach`). A leaf both sides
    hold identically (`fixed_leaves`) computes nothing: its dtype does not count."""
    fixed = fixed_leaves(traced)
    return loosest(*(t.dtype for name, info in traced.nodes.items() if name not in fixed
                     for t in info.outputs if t.dtype.is_floating_point))


def fixed_leaves(traced: TracedGraph) -> frozenset[str]:
    """The graph's leaves (placeholders, lifted constants) whose values the sharded program and one device hold
    identically at every step: the user's inputs, constants made in forward, buffers forward does not write and
    frozen parameters. No rounding happens at such a leaf, so a 16-bit one that forward only widens
    (RecurrentGemma's bfloat16 `normalizer`, cast to float32 before use) does not make the float32 computation
    after it a 16-bit one; before (round 25, r25f), it put the whole model at bfloat16's bound (rtol 1.6e-2
    instead of 1.3e-6). A 16-bit value computed from it is a node of its own and counts. Trainable parameters
    and written buffers are not fixed: after a step both sides hold values rounded in their dtype."""
    written = set(traced.mutated_state())
    fixed = set()
    for name, info in traced.nodes.items():
        if info.op not in ("placeholder", "get_attr"):
            continue
        owner = traced.param_of_placeholder(name)
        if owner is None or (owner.fqn not in written and (owner.is_buffer or not owner.requires_grad)):
            fixed.add(name)
    return frozenset(fixed)


def excess(actual: torch.Tensor, expected: torch.Tensor, compute: torch.dtype | None = None) -> float:
    """The largest |actual - expected| over its bound (module docstring), for the loosest of expected's dtype
    and `compute`: <= 1 is a match. Empty tensors match; a non-zero difference with a zero bound is inf."""
    if not expected.numel():
        return 0.0
    actual, expected = as_real(actual), as_real(expected)  # complex: both parts compared
    dtype = loosest(expected.dtype, compute) if expected.dtype.is_floating_point else expected.dtype
    rtol, atol = tolerances(dtype)
    a, b = actual.detach().double(), expected.detach().double()
    diff = (a - b).abs()
    if dtype.is_floating_point and dtype.itemsize <= 2:
        bound = 2 * (atol + rtol * b.abs().max())
    else:
        bound = atol + rtol * b.abs()
    ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / bound)
    return ratio.max().item()
