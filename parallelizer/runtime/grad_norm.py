"""Gradient-norm clipping over sharded parameters: the norm of the full gradient, as on one device.

`torch.nn.utils.clip_grad_norm_(pm.parameters(), ...)` would take the norm of this rank's LOCAL gradients:
a sharded parameter contributes only its shard (so every rank gets another, too small, norm) and each rank
then scales by its own factor, so replicated parameters drift apart. Here, as torchtitan does for DTensor
parameters (`clip_grad_norm_` over `DTensor.full_tensor()`-free partial norms):

- each parameter's local gradient gives sum(|g|^p) (the max |g| for p = inf), accumulated per class of
  parameters sharded over the same set of mesh axes (sizes > 1);
- each class's sum is all-reduced (SUM) over exactly the mesh axes that shard it, one axis after the other
  (summing over axis a and then b sums over the a x b sub-grid); over the other axes the gradient is
  replicated (synchronised by the program), so it is counted once; for p = inf a MAX over every axis;
- total = (sum over classes)^(1/p); a last MAX over every axis makes it bitwise equal on every rank, so
  every rank scales its local gradients by the same factor min(1, max_norm / (total + 1e-6)) (torch's).

Pipeline ranks (`PipelineModule.clip_grad_norm_`) hold different stages: each sums only the gradients it
`counted` (one copy of a parameter that several stages or BitPipe's twin copies hold, all equal after the
step's gradient sum), and the per-rank totals are then summed (max for inf) over `across` (the pp group of
ranks with the same (dp, tp) coordinates) before the root; the last MAX also runs over `across`.

Sums are accumulated in float64 and the total returned in the gradients' dtype, like torch's.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..core.layout import Layout, Shard
from ..core.mesh import MeshSpec
from ..rewriter import collectives


def clip_grad_norm_(params: Sequence[tuple[torch.Tensor, Layout]], mesh: MeshSpec, groups: dict[str, list[int]],
                    max_norm: float, norm_type: float = 2.0, *, error_if_nonfinite: bool = False,
                    foreach: bool | None = None, counted: Sequence[tuple[torch.Tensor, Layout]] | None = None,
                    across: Sequence[Sequence[int]] = ()) -> torch.Tensor:
    """Clip the gradients of local shards `params` (each with its stored layout on `mesh`) by their global
    norm; `groups` maps each mesh axis to this rank's group on it. Collective over the mesh (and `across`).

    Args:
        counted: the pairs whose gradients make up the norm (default: `params`); `params` are all scaled.
        across: further groups of global ranks (a pipeline's pp group) over which the per-rank totals are
            summed (module docstring); () for one mesh.

    Returns:
        The total norm of the full gradient (a scalar tensor in the gradients' dtype, float32 when none).
    Raises:
        ValueError: norm_type is not a positive number or inf.
        RuntimeError: the total is nan/inf and error_if_nonfinite (torch's behaviour and message sense).
    """
    del foreach  # accepted for signature parity with torch; the local work here is one pass per tensor
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}; the global norm is "
                         "built from per-shard sums of |g|^p (p > 0) or maxima (inf)")
    grads = [(p.grad, layout) for p, layout in (params if counted is None else counted) if p.grad is not None]
    scaled = [p.grad for p, _ in params if p.grad is not None]
    dtype = scaled[0].dtype if scaled else torch.float32
    axes = [(name, size) for name, size in zip(mesh.axis_names, mesh.shape) if size > 1]
    # one class per set of sharding axes, from every parameter (not only those with a gradient here), so
    # that every rank calls the same collectives on vectors of the same length
    classes = {_sharded_axes(layout, mesh): torch.zeros((), dtype=torch.float64) for p, layout in params
               if p.requires_grad or p.grad is not None}
    with torch.no_grad():
        for grad, layout in grads:
            g = grad.detach().double()
            if not g.numel():
                continue
            key = _sharded_axes(layout, mesh)
            if math.isinf(norm_type):
                classes[key] = torch.maximum(classes[key], g.abs().max())
            else:
                classes[key] = classes[key] + g.abs().pow(norm_type).sum()
        total = _reduce(classes, axes, groups, norm_type, across)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                               "so it cannot be clipped. To disable this error and scale the gradients by the "
                               "non-finite norm anyway, set `error_if_nonfinite=False`")
        coef = torch.clamp(max_norm / (total.to(dtype) + 1e-6), max=1.0)
        for grad in scaled:
            grad.mul_(coef)  # in the gradient's dtype, computed as torch does (a float32 factor)
    return total.to(dtype)


def _sharded_axes(layout: Layout, mesh: MeshSpec) -> tuple[str, ...]:
    return tuple(name for name, size, p in zip(mesh.axis_names, mesh.shape, layout)
                 if isinstance(p, Shard) and size > 1)


def _reduce(classes: dict[tuple[str, ...], torch.Tensor], axes: list[tuple[str, int]], groups: dict[str, list[int]],
            norm_type: float, across: Sequence[Sequence[int]] = ()) -> torch.Tensor:
    """The global total from per-class local sums (module docstring); the same value on every rank."""
    keys = sorted(classes)
    values = torch.stack([classes[k] for k in keys]) if keys else torch.zeros(1, dtype=torch.float64)
    if math.isinf(norm_type):
        for name, _ in axes:
            values = collectives.all_reduce_max(values, groups[name])
        total = values.max().reshape(1)
        for ranks in across:
            total = collectives.all_reduce_max(total, ranks)
    else:
        for name, _ in axes:
            rows = [i for i, k in enumerate(keys) if name in k]
            if rows:
                values[rows] = collectives.all_reduce(values[rows].contiguous(), groups[name])
        total = values.sum().reshape(1)
        for ranks in across:
            total = collectives.all_reduce(total, ranks)
        total = total.pow(1.0 / norm_type)
    for ranks in [groups[name] for name, _ in axes] + list(across):  # bitwise agreement, whatever the orders
        total = collectives.all_reduce_max(total, ranks)
    return total.reshape(())
