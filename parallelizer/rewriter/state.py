"""Local shards of parameters and buffers: cut them from full tensors, gather them back.

A stored layout never holds Partial. Sharding follows `core.layout`: torch.chunk's split (uneven and empty
chunks allowed), and a tensor dim sharded by several mesh axes is split in mesh-axis order (the outer axis
picks a chunk, the inner axis splits it).
"""
from __future__ import annotations

import torch

from ..core.layout import Layout, Partial, Replicate, Shard, local_region, local_shape
from ..core.mesh import MeshSpec
from ..errors import PlanMismatchError
from . import collectives


def shard_tensor(full: torch.Tensor, layout: Layout, mesh: MeshSpec, coords: tuple[int, ...]) -> torch.Tensor:
    """This rank's local shard (a contiguous copy) of `full` placed by `layout`; no communication.

    Shapes: full (global shape) -> local_shape(shape, layout, mesh, coords).
    Raises:
        PlanMismatchError: `layout` is Partial somewhere (a stored tensor cannot be Partial).
        IndivisibleShardError: the layout does not fit the tensor.
    """
    _check_storable(layout, mesh)
    starts, lengths = local_region(tuple(full.shape), layout, mesh, coords)
    out = full
    for d, (start, length) in enumerate(zip(starts, lengths)):
        if length != full.shape[d]:
            out = out.narrow(d, start, length)
    return out.contiguous().clone()


def gather_tensor(local: torch.Tensor, layout: Layout, mesh: MeshSpec, groups: dict[str, list[int]],
                  shape: tuple[int, ...], coords: tuple[int, ...]) -> torch.Tensor:
    """The full tensor of global `shape` from every rank's `local` shard (all-gathers over the sharded axes,
    inner first; `coords` are this rank's mesh coordinates, which fix the chunk sizes of uneven shards).

    Must be called on every rank of the mesh (collective). Returns a tensor without autograd history.
    """
    _check_storable(layout, mesh)
    out = local.detach()
    with torch.no_grad():
        for axis in reversed(range(mesh.ndim)):
            p = layout[axis]
            if isinstance(p, Shard):
                outer = Layout(tuple(layout.placements[:axis]) + (Replicate(),) * (mesh.ndim - axis))
                size = local_shape(tuple(shape), outer, mesh, coords)[p.dim]
                out = collectives.all_gather(out, p.dim, groups[mesh.axis_names[axis]], size)
    return out


def _check_storable(layout: Layout, mesh: MeshSpec) -> None:
    if any(isinstance(p, Partial) for p in layout) or len(layout) != mesh.ndim:
        raise PlanMismatchError(f"stored layout {layout} on mesh {mesh} is not storable: give one Shard or "
                                "Replicate placement per mesh axis")


# --- deterministic initialisation of local shards (for models built on the meta device) -------------------

_MASK64 = (1 << 64) - 1


def init_local_shard(fqn: str, shape: tuple[int, ...], dtype: torch.dtype, layout: Layout, mesh: MeshSpec,
                     coords: tuple[int, ...], *, seed: int = 0, std: float = 0.02) -> torch.Tensor:
    """This rank's shard of a parameter initialised by a counter-based rule, without the full tensor.

    Every element is a function of (seed, fqn, its GLOBAL index) only, so the shards of all ranks put
    together equal `init_local_shard(..., Layout.replicate(...), ...)` on one device, bit for bit.
    Rule (GPT-2 / Megatron-style): names ending in "bias" -> 0; other 1-D tensors (norm weights) -> 1;
    everything else ~ Normal(0, std) (std = 0.02, Radford et al. 2019), drawn by Box-Muller from a
    splitmix64 hash of the global index (Steele et al. 2014, "Fast splittable pseudorandom number
    generators"). Memory: O(local elements).
    Shapes: returns local_shape(shape, layout, mesh, coords).
    """
    local = local_shape(tuple(shape), layout, mesh, coords)
    if fqn.endswith("bias"):
        return torch.zeros(local, dtype=dtype)
    if len(shape) <= 1:
        return torch.ones(local, dtype=dtype)
    index = _global_index(tuple(shape), layout, mesh, coords)
    key = _hash(torch.tensor(_fqn_key(fqn, seed), dtype=torch.int64))
    u1 = _uniform(_hash(index * 2 + key))
    u2 = _uniform(_hash(index * 2 + 1 + key))
    normal = torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2.0 * torch.pi * u2)
    return (normal * std).to(dtype)


def _global_index(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec, coords: tuple[int, ...]) -> torch.Tensor:
    """Row-major global linear index of every element of this rank's shard (int64, local shape)."""
    starts, lengths = local_region(shape, layout, mesh, coords)
    index = torch.zeros((), dtype=torch.int64)
    for d in range(len(shape)):
        rng = torch.arange(starts[d], starts[d] + lengths[d], dtype=torch.int64)
        index = index.unsqueeze(-1) * shape[d] + rng
    return index


def _fqn_key(fqn: str, seed: int) -> int:
    """A 63-bit key of (seed, fqn) computed with FNV-1a (stable across processes, unlike hash())."""
    h = 0xCBF29CE484222325
    for byte in f"{seed}:{fqn}".encode():
        h = ((h ^ byte) * 0x100000001B3) & _MASK64
    return h >> 1


def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 values taken as unsigned 64-bit."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _hash(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 tensors (wrapping arithmetic)."""
    x = x + _signed(0x9E3779B97F4A7C15)
    x = (x ^ _srl(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ _srl(x, 27)) * _signed(0x94D049BB133111EB)
    return x ^ _srl(x, 31)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _uniform(bits: torch.Tensor) -> torch.Tensor:
    """The top 53 bits as a float64 in [0, 1)."""
    return _srl(bits, 11).to(torch.float64) * (1.0 / (1 << 53))


def init_model_like_shards(model: torch.nn.Module, *, seed: int = 0, std: float = 0.02) -> torch.nn.Module:
    """Initialise a single-device (CPU) `model` in place with the rule of `init_local_shard`, so that it
    equals the sharded model built from the same architecture on `meta`. Returns `model`."""
    whole = MeshSpec(("single",), (1,))
    with torch.no_grad():
        for fqn, p in model.named_parameters():
            p.copy_(init_local_shard(fqn, tuple(p.shape), p.dtype, Layout.replicate(1), whole, (0,),
                                     seed=seed, std=std))
    return model
