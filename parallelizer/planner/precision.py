"""Which precision a plan is priced in (`PlanConfig.precision`, the device and the traced dtypes), and the dtype its
MFU is reported against. Moved out of `planner.costs` (round 25: that module passed 600 lines)."""
from __future__ import annotations

import torch

from cost_model.hardware import DeviceSpec

from ..errors import PrecisionError
from ..tracer import TracedGraph
from ..tracer.graph import carries_grad

__all__ = ["mfu_dtype", "priced_dtype", "resolve_precision", "traced_in_low_precision"]

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def priced_dtype(dtype: torch.dtype, autocast: bool) -> torch.dtype:
    """The dtype whose peak a trained parameter of `dtype` is measured against (`mfu_dtype`): fp32 -> bf16 when
    `autocast` (a graph traced in fp32 planned in "bf16": autocast runs its matmuls in bf16), else `dtype` itself.
    Each op's own dtypes under the recipe: `Pricer.node_dtypes`."""
    return torch.bfloat16 if autocast and dtype == torch.float32 else dtype


def traced_in_low_precision(traced: TracedGraph | None) -> bool:
    """True when a trained parameter of `traced` is bf16 or fp16 (the model was traced in low precision)."""
    if traced is None:
        return False
    return any(p.dtype in _LOW_PRECISION for p in traced.parameters.values() if not p.is_buffer)


def resolve_precision(precision: str | None, device: DeviceSpec, traced_low: bool = False) -> str:
    """The precision a plan is priced in: `precision` if given, else "bf16" for a graph traced in bf16/fp16
    (`traced_low`) or on a GPU (`DeviceSpec.kind`), "fp32" on a calibrated CPU.

    Raises:
        PrecisionError: "fp32" for a graph traced in low precision (its tensors are not fp32), or "bf16" on a
            device without a bf16 peak (a CPU profile measures fp32 only); each with its remedy.
    """
    resolved = precision or ("bf16" if traced_low or device.kind == "gpu" else "fp32")
    if resolved == "fp32" and traced_low:
        raise PrecisionError("precision='fp32' but the model was traced with bf16/fp16 parameters. Remedy: trace "
                             "the fp32 model (model.float()) or plan with precision='bf16'")
    if resolved == "bf16" and torch.bfloat16 not in device.peak_flops_per_s:
        have = ", ".join(sorted(str(d).removeprefix("torch.") for d in device.peak_flops_per_s))
        raise PrecisionError(f"precision='bf16' but device {device.name!r} has no bf16 peak (it has: {have}). "
                             "Remedy: plan with precision='fp32' (--precision fp32), or price on a GPU preset "
                             "(--cluster h100:1x8)")
    return resolved


def mfu_dtype(traced: TracedGraph, device: DeviceSpec, precision: str | None) -> torch.dtype:
    """The dtype whose peak FLOP/s a pipeline plan's MFU is reported against: the dtype the largest trained
    parameter is PRICED in (`precision` resolved as the Pricer does, `resolve_precision`: an fp32-traced model
    planned in "bf16" is priced, and so measured against, the bf16 peak), a complex one's real dtype, float32
    where the device has no peak for it.

    Before (trial r12a), the largest tensor of the state decided, buffers included, and the device's table was
    indexed with it: a model whose largest tensor was an FNO's cfloat spectral weight, or a bool causal-mask
    buffer, made every pipeline plan raise a raw KeyError (torch.complex64 / torch.bool) after the search had
    finished. Before round 18 the traced dtype decided: an fp32-traced Llama-2-7B planned in bf16 on h100:8x8
    reported "450.0 TFLOP/s per device = 671.7% MFU" (against the 67 TFLOP/s fp32 peak; 45.5% of the bf16
    989.5 TFLOP/s it was priced at).

    Raises:
        PrecisionError: as `resolve_precision` (a precision the device has no peak for).
    """
    trained = [p for p in traced.parameters.values() if not p.is_buffer and carries_grad(p.dtype)]
    if not trained:
        return torch.float32
    low = traced_in_low_precision(traced)
    autocast = resolve_precision(precision, device, low) == "bf16" and not low
    dtype = priced_dtype(max(trained, key=lambda q: q.numel).dtype, autocast).to_real()
    return dtype if dtype in device.peak_flops_per_s else torch.float32
