"""Parameters cast after wrapping (`pm.to(torch.bfloat16)`, `pm.half()`, `pm.double()`): a typed error, not torch's.

A ParallelModule's program is the model traced in the dtypes it had when wrapped: its explicit casts, `dtype=`
arguments of tensors made in forward and the dtypes its ops mix are fixed in it. Casting `pm` afterwards (what
users do for a low-precision evaluation or export after training) changes the tensors the program reads but not the
program. Where every op follows its inputs' dtype (an MLP in float64), it still runs, and equals the model cast;
otherwise torch raised, e.g. "mixed dtype (CPU): expect parameter to have scalar type of Float" from a LayerNorm on
every rank (transformers GPT-2 on tp=2, fsdp, trial r14c), and a pipeline, whose stage-to-stage buffers have the
traced dtypes, "[Stage 0] failed to run forward". `cast_tensors` lists what differs from the trace, `refuse` raises
PlanMismatchError naming it with the remedies.
"""
from __future__ import annotations

import torch

from ..errors import PlanMismatchError
from ..tracer.graph import TracedGraph


def cast_tensors(traced: TracedGraph, named: dict[str, torch.Tensor]) -> list[tuple[str, torch.dtype, torch.dtype]]:
    """(name, traced dtype, dtype now) of every tensor of `named` (FQN -> local tensor) whose dtype is not the
    traced one."""
    out = []
    for fqn, tensor in named.items():
        info = traced.parameters.get(fqn)
        if info is not None and info.dtype != tensor.dtype:
            out.append((fqn, info.dtype, tensor.dtype))
    return out


def refuse(what: str, changed: list[tuple[str, torch.dtype, torch.dtype]], cause: Exception | None = None) -> None:
    """Raise PlanMismatchError for tensors cast after wrapping (`changed` from `cast_tensors`; nothing when empty)."""
    if not changed:
        return
    fqn, was, now = changed[0]
    why = f" (torch: {str(cause).strip().splitlines()[0][:160]})" if cause is not None else ""
    raise PlanMismatchError(
        f"{what}: {len(changed)} tensor(s) were cast after wrapping, e.g. {fqn!r} {was} -> {now} (pm.to(dtype), "
        f"pm.half(), pm.bfloat16(), pm.double()), and the sharded program, traced in the dtypes the model had, cannot "
        f"run them{why}. Remedy: cast the model before auto_parallelize (model.to(dtype), then wrap it); compute in "
        "low precision with torch.autocast around pm's forward (the parameters stay as traced); for a low-precision "
        "export, cast the gathered weights: {k: v.to(dtype) for k, v in pm.full_state_dict().items()}; pm.to(" 
        f"{was}) restores the program's dtypes")
