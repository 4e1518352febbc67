"""Local shards of parameters and buffers: cut them from full tensors, gather them back.

A stored layout never holds Partial. Sharding follows `core.layout`: a tensor dim sharded by several mesh
axes is split in mesh-axis order (the outer axis picks a chunk, the inner axis splits it).
"""
from __future__ import annotations

import torch

from ..core.layout import Layout, Partial, Shard, local_shape
from ..core.mesh import MeshSpec
from ..errors import PlanMismatchError
from . import collectives


def shard_tensor(full: torch.Tensor, layout: Layout, mesh: MeshSpec, coords: tuple[int, ...]) -> torch.Tensor:
    """This rank's local shard (a contiguous copy) of `full` placed by `layout`; no communication.

    Shapes: full (global shape) -> local_shape(shape, layout, mesh).
    Raises:
        PlanMismatchError: `layout` is Partial somewhere (a stored tensor cannot be Partial).
        IndivisibleShardError: a sharded dim does not divide.
    """
    _check_storable(layout, mesh)
    local_shape(tuple(full.shape), layout, mesh)
    out = full
    for axis, p in enumerate(layout):
        if isinstance(p, Shard):
            out = out.chunk(mesh.shape[axis], dim=p.dim)[coords[axis]]
    return out.contiguous().clone()


def gather_tensor(local: torch.Tensor, layout: Layout, mesh: MeshSpec, groups: dict[str, list[int]]) -> torch.Tensor:
    """The full tensor from every rank's `local` shard (all-gathers over the sharded axes, inner first).

    Must be called on every rank of the mesh (collective). Returns a tensor without autograd history.
    """
    _check_storable(layout, mesh)
    out = local.detach()
    with torch.no_grad():
        for axis in reversed(range(mesh.ndim)):
            p = layout[axis]
            if isinstance(p, Shard):
                out = collectives.all_gather(out, p.dim, groups[mesh.axis_names[axis]])
    return out


def _check_storable(layout: Layout, mesh: MeshSpec) -> None:
    if any(isinstance(p, Partial) for p in layout) or len(layout) != mesh.ndim:
        raise PlanMismatchError(f"stored layout {layout} on mesh {mesh} is not storable: give one Shard or "
                                "Replicate placement per mesh axis")
