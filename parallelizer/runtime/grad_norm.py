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

A user who swaps the model for the ParallelModule and keeps `torch.nn.utils.clip_grad_norm_(pm.parameters(),
...)` gets the same global norm: every ParallelModule registers its parameters with their layouts
(`register`), and the first registration replaces `torch.nn.utils.clip_grad_norm_` (and
`torch.nn.utils.clip_grad.clip_grad_norm_`) by `_clip_any_grad_norm_`, which sends registered parameters here
and any others to torch's own function (all the parameters of a `PipelineModule`: its
`clip_grad_norm_` over all stages). Before, that call silently clipped each rank by its local norm
(fsdp dp=2 / tp=2: norms 69-100 instead of 105, parameters 5e-3 off eager after 3 steps, replicas apart).
A name bound before the first ParallelModule existed (`from torch.nn.utils import clip_grad_norm_` at the top
of a script) still refers to torch's function: use `pm.clip_grad_norm_` there.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

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


class Owner(NamedTuple):
    """What a registered local parameter is: its stored layout on `mesh`, this rank's `groups`, the
    `PipelineModule` whose stage holds it (a weak reference; None outside pipelines) and its FQN."""

    layout: Layout
    mesh: MeshSpec
    groups: dict[str, list[int]]
    pipeline: weakref.ref | None
    fqn: str


_OWNERS = WeakIdKeyDictionary()  # local parameter -> its Owner
_TORCH_CLIP = torch.nn.utils.clip_grad.clip_grad_norm_


def register(params: Sequence[tuple[str, torch.Tensor, Layout]], mesh: MeshSpec, groups: dict[str, list[int]],
             pipeline=None) -> None:
    """Record each local parameter's (FQN, tensor, layout) so that `torch.nn.utils.clip_grad_norm_` over them
    takes the global norm (module docstring); installs `_clip_any_grad_norm_` in torch.nn.utils on first use.
    `pipeline`: the `PipelineModule` whose stages hold them (kept as a weak reference): clipping them clips
    that module by its norm over all stages (`PipelineModule.clip_grad_norm_`). `runtime.optimizer_check`
    reads the same record (`owner_of`)."""
    ref = None if pipeline is None else weakref.ref(pipeline)
    for fqn, p, layout in params:
        _OWNERS[p] = Owner(layout, mesh, groups, ref, fqn)
    if torch.nn.utils.clip_grad_norm_ is not _clip_any_grad_norm_:
        torch.nn.utils.clip_grad_norm_ = _clip_any_grad_norm_
        torch.nn.utils.clip_grad.clip_grad_norm_ = _clip_any_grad_norm_


def owner_of(p: torch.Tensor) -> Owner | None:
    """The Owner of a local parameter registered by a ParallelModule or PipelineModule, else None."""
    return _OWNERS.get(p)


def _clip_any_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                         foreach: bool | None = None) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` that knows ParallelModule shards: parameters registered by a
    ParallelModule are clipped by their global norm (`clip_grad_norm_`, collective over the mesh), all the
    parameters of a PipelineModule by its norm over all stages; others by torch's own function.

    Raises:
        ValueError: a mix of registered and other tensors, of two meshes or modules, or a part of a pipeline
            module's parameters (one global norm cannot be formed), with the remedy.
    """
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    owned = [_OWNERS.get(p) for p in params]
    if not any(o is not None for o in owned):
        return _TORCH_CLIP(params, max_norm, norm_type, error_if_nonfinite=error_if_nonfinite, foreach=foreach)
    pipelines = {o.pipeline() if o is not None and o.pipeline is not None else None for o in owned}
    if pipelines != {None}:
        pm = next(iter(pipelines))
        if len(pipelines) != 1 or pm is None or {id(p) for p in params} != {id(p) for p in pm.parameters()}:
            raise ValueError("torch.nn.utils.clip_grad_norm_: the parameters are not exactly those of one pipeline "
                             "module (a pipeline clips the norm of all its stages' gradients). Remedy: pass "
                             "pm.parameters(), or call pm.clip_grad_norm_(max_norm)")
        return pm.clip_grad_norm_(max_norm, norm_type, error_if_nonfinite=error_if_nonfinite, foreach=foreach)
    meshes = {(o.mesh, tuple(sorted((k, tuple(v)) for k, v in o.groups.items()))) if o is not None else None
              for o in owned}
    if len(meshes) != 1:
        raise ValueError("torch.nn.utils.clip_grad_norm_: the parameters mix shards of a ParallelModule with other "
                         "tensors (or shards of two meshes), so no global norm can be formed. Remedy: clip each "
                         "ParallelModule with pm.clip_grad_norm_(max_norm) and other parameters separately")
    mesh, groups = owned[0].mesh, owned[0].groups
    return clip_grad_norm_([(p, o.layout) for p, o in zip(params, owned)], mesh, groups, max_norm, norm_type,
                           error_if_nonfinite=error_if_nonfinite, foreach=foreach)
