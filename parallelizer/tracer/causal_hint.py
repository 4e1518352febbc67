"""torch.nn.TransformerEncoder / TransformerDecoder (and nn.Transformer through them) given a mask without
`is_causal=` traced with the mask applied as given.

With `is_causal=None` (their default) and a mask, torch's `_detect_is_causal_mask` compares the mask with a
causal mask and reads the answer as a Python bool (`bool((mask == causal).all())`), which torch.export cannot
trace: every model written as pytorch/examples' word_language_model `TransformerModel` (a causal mask from
`generate_square_subsequent_mask`, no `is_causal=`) was refused with a TraceError on every mesh (trial r16b;
the same export failure: pytorch/pytorch#134616). The answer is only a hint for a faster kernel (torch's
docstring: `is_causal=False` with a causal mask "may lead to reduced performance"): with False every layer
applies the mask itself (`scaled_dot_product_attention(attn_mask=mask)`), with True the causal kernel
computes the same values. So inside tracing the hint answers False when it was not given (noted); a given
`is_causal` is used as it is.
"""
from __future__ import annotations

import contextlib

from torch.nn.modules import transformer as _transformer


@contextlib.contextmanager
def causal_mask_hint_as_given(notes: list[str]):
    """Inside, `torch.nn.modules.transformer._detect_is_causal_mask(mask, None, ...)` answers False (the mask
    applied as given: the same values, module docstring) instead of reading the mask's values."""
    original = _transformer._detect_is_causal_mask
    answered: list[bool] = []

    def detect(mask, is_causal=None, size=None):
        if is_causal is None and mask is not None:
            answered.append(True)
            return False
        return original(mask, is_causal, size)

    _transformer._detect_is_causal_mask = detect
    try:
        yield
    finally:
        _transformer._detect_is_causal_mask = original
    if answered:
        notes.append("nn.TransformerEncoder / TransformerDecoder were given a mask without is_causal=: traced "
                     "with the mask applied as given (is_causal=False; torch's causal-mask detection reads the "
                     "mask's values, which export cannot trace, and only picks a faster kernel for the same values)")
