"""A float64 copy of a model that runs even where its forward names a narrower dtype.

The rehearsal's second judge (`runtime.rehearsal.float64_excess`) needs the single-device model computed in
float64. `model.double()` converts parameters and buffers only: a forward that makes tensors of its own in the
default dtype (`torch.zeros(b, q, d)` for DAB-DETR's decoder queries), or names float32 (`torch.arange(n,
dtype=torch.float32)` for a sine position embedding, `pixel_mask.cumsum(1, dtype=torch.float32)`, `.float()`)
then mixes float32 into a float64 matmul and raises ("mat1 and mat2 must have the same dtype"), so no float64
judge ran and a plan whose gradients are a sum of large cancelling terms could only be judged by the plain
float32 bound (DAB-DETR: 5 plans reported NUMERICS DIFFER at 1.2-3.0x, round 15). Worse, a forward that
computes a step in float32 on purpose (`softmax(..., dtype=torch.float32).to(q.dtype)`: DAB-DETR, DETR and many
attention implementations) runs in a `.double()` copy without error but rounds there at float32, so the copy
was not the exact value the judge takes it for.

`as_float64(model)` converts the model with `.double()` and runs each of its forward calls in `widening()`:
the default dtype set to float64, and a TorchFunctionMode that reads every narrower floating dtype a call names
(`dtype=` of factories, reductions and casts; `.to(dtype)` / `.type(dtype)`; `.float()`, `.half()`,
`.bfloat16()`) as float64 (complex64 / complex32 as complex128). Bit reinterpretation (`.view(dtype)`) is left
as written. The copy is the model's own computation without rounding, which `rehearsal.same_computation`
still checks on its outputs before it judges anything.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

WIDE = {torch.float32: torch.float64, torch.float16: torch.float64, torch.bfloat16: torch.float64,
        torch.complex64: torch.complex128, torch.complex32: torch.complex128}
"""Each floating dtype narrower than 64 bits and what a float64 copy computes it in."""
NARROWING_METHODS = {"float": torch.Tensor.double, "half": torch.Tensor.double, "bfloat16": torch.Tensor.double,
                     "cfloat": torch.Tensor.cdouble, "chalf": torch.Tensor.cdouble}
"""Tensor methods that cast to a narrower floating dtype, and the float64 cast a float64 copy makes instead."""
POSITIONAL_DTYPE = ("to", "type")  # calls whose positional arguments may name the target dtype


class _Widening(TorchFunctionMode):
    """Reads every narrower floating dtype a torch call names as its 64-bit counterpart (`WIDE`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in NARROWING_METHODS:  # only Tensor methods bear these names in torch's namespace
            return NARROWING_METHODS[name](*args, **kwargs)
        if kwargs.get("dtype") in WIDE:
            kwargs = {**kwargs, "dtype": WIDE[kwargs["dtype"]]}
        if name in POSITIONAL_DTYPE:
            args = tuple(WIDE.get(a, a) if isinstance(a, torch.dtype) else a for a in args)
        return func(*args, **kwargs)


@contextlib.contextmanager
def widening():
    """Within: factories make float64 by default and every narrower floating dtype a call names is read as its
    64-bit counterpart (module docstring); the default dtype is restored on exit, also after an error."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with _Widening():
            yield
    finally:
        torch.set_default_dtype(before)


def as_float64(model: torch.nn.Module) -> torch.nn.Module:
    """`model` converted in place to float64 (parameters and floating buffers, `.double()`), each forward call of
    it run within `widening()` (a forward pre-hook enters it, a forward hook that runs also after an error leaves
    it). Returns `model`."""
    model.double()
    stack = []

    def enter(module, args):
        context = widening()
        context.__enter__()
        stack.append(context)

    def leave(module, args, output):
        stack.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
    return model
