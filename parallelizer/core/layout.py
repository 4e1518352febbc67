"""Placements and layouts: DTensor's placement types with short string forms, and local shapes.

Vocabulary (DESIGN.md): a *placement* says how a tensor lives along ONE mesh axis:
`Shard(d)` ("S(d)": split evenly along tensor dim d), `Replicate()` ("R": full copy), `Partial("sum")`
("P": every rank holds a summand; "P(avg)" for a mean). A *layout* is one placement per mesh axis, written
by concatenation, e.g. "S(0)R" on mesh (dp, tp) = batch-sharded over dp, replicated over tp.

When several mesh axes shard the same tensor dim (e.g. "S(0)S(0)"), the dim is split in mesh-axis order:
the outer axis picks a chunk, the inner axis splits that chunk (DTensor's default, row-major).
Only even splits are allowed: a dim must be divisible by the product of the axis sizes that shard it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from ..errors import ParallelizerError
from .mesh import MeshSpec

__all__ = ["Shard", "Replicate", "Partial", "Placement", "Layout", "placement_str", "parse_placement",
           "local_shape", "fits", "IndivisibleShardError", "R", "P"]

R = Replicate()
P = Partial("sum")
_TOKEN = re.compile(r"S\((-?\d+)\)|R|P\((sum|avg)\)|P")


class IndivisibleShardError(ParallelizerError, ValueError):
    """A tensor dim is not divisible by the mesh axes that shard it (or the layout does not fit the tensor).

    Attributes: shape, layout (str), mesh (MeshSpec), dim, axis (the name of the offending mesh axis).
    """

    def __init__(self, message: str, shape: tuple[int, ...], layout: str, mesh: MeshSpec, dim: int | None,
                 axis: str | None) -> None:
        super().__init__(message)
        self.shape, self.layout, self.mesh, self.dim, self.axis = shape, layout, mesh, dim, axis


def placement_str(p: Placement) -> str:
    """Short form: Shard(1) -> "S(1)", Replicate() -> "R", Partial("sum") -> "P", Partial("avg") -> "P(avg)"."""
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else f"P({p.reduce_op})"
    raise ValueError(f"unsupported placement {p!r}; use Shard(d), Replicate() or Partial('sum'|'avg')")


def parse_placement(text: str) -> Placement:
    """Inverse of `placement_str`. Raises ValueError naming the accepted forms."""
    layout = Layout.parse(text)
    if len(layout) != 1:
        raise ValueError(f"{text!r} is not one placement; use S(d), R, P or P(avg)")
    return layout[0]


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """One placement per mesh axis. `str(layout)` is the JSON form, e.g. "S(0)R"; `Layout.parse` inverts it.
    Equality and hashing go through the string form (cached: layouts are dictionary keys in the planner)."""

    placements: tuple[Placement, ...]
    _text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "placements", tuple(self.placements))
        object.__setattr__(self, "_text", "".join(placement_str(p) for p in self.placements))  # validates

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self._text == other._text

    def __hash__(self) -> int:
        return hash(self._text)

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Parse "S(0)R" / "RP" / "S(1)P(avg)". Raises ValueError on anything else."""
        pos, out = 0, []
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"cannot parse layout {text!r} at {text[pos:]!r}; "
                                 "use one of S(d), R, P, P(avg) per mesh axis, e.g. 'S(0)R'")
            if m.group(1) is not None:
                out.append(Shard(int(m.group(1))))
            elif m.group(0) == "R":
                out.append(R)
            else:
                out.append(Partial(m.group(2) or "sum"))
            pos = m.end()
        if not out:
            raise ValueError("empty layout string; use one placement per mesh axis, e.g. 'S(0)R'")
        return cls(tuple(out))

    @classmethod
    def replicate(cls, ndim: int) -> "Layout":
        return cls((R,) * ndim)

    def __len__(self) -> int:
        return len(self.placements)

    def __getitem__(self, axis: int) -> Placement:
        return self.placements[axis]

    def __iter__(self):
        return iter(self.placements)

    def __str__(self) -> str:
        return self._text

    __repr__ = __str__

    def with_axis(self, axis: int, p: Placement) -> "Layout":
        """A copy with mesh axis `axis` set to `p`."""
        return Layout(self.placements[:axis] + (p,) + self.placements[axis + 1:])

    def normalized(self, tensor_ndim: int) -> "Layout":
        """Shard dims made non-negative for a tensor of rank `tensor_ndim`."""
        return Layout(tuple(Shard(p.dim % tensor_ndim) if isinstance(p, Shard) and tensor_ndim else p
                            for p in self.placements))

    @property
    def is_replicated(self) -> bool:
        return all(isinstance(p, Replicate) for p in self.placements)


def local_shape(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec) -> tuple[int, ...]:
    """Per-rank shape of a tensor of global `shape` placed by `layout` on `mesh`.

    Example: shape (8, 24), layout "S(0)S(1)" on mesh (dp=2, tp=4) -> (4, 6).

    Raises:
        IndivisibleShardError: the layout has the wrong length, shards a dim the tensor does not have, or a
            dim is not divisible, e.g. "dim 1 of shape (9, 24) is not divisible by mesh axis 'tp' of size 6".
    """
    shape = tuple(shape)
    if len(layout) != mesh.ndim:
        raise IndivisibleShardError(f"layout {layout} has {len(layout)} placements but mesh {mesh} has "
                                    f"{mesh.ndim} axes; give one placement per mesh axis",
                                    shape, str(layout), mesh, None, None)
    local = list(shape)
    for axis, (name, size, p) in enumerate(zip(mesh.axis_names, mesh.shape, layout)):
        if not isinstance(p, Shard):
            continue
        if not -len(shape) <= p.dim < len(shape):
            raise IndivisibleShardError(f"layout {layout} shards dim {p.dim} over mesh axis {name!r}, but "
                                        f"shape {shape} has {len(shape)} dims", shape, str(layout), mesh,
                                        p.dim, name)
        d = p.dim % len(shape)
        if local[d] % size:
            raise IndivisibleShardError(
                f"dim {d} of shape {shape} is not divisible by mesh axis {name!r} of size {size}"
                + (f" (after sharding by the outer axes: {local[d]})" if local[d] != shape[d] else ""),
                shape, str(layout), mesh, d, name)
        local[d] //= size
    return tuple(local)


def fits(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec) -> bool:
    """True when `local_shape` would succeed."""
    local = list(shape)
    for size, p in zip(mesh.shape, layout):
        if isinstance(p, Shard):
            if not -len(shape) <= p.dim < len(shape):
                return False
            d = p.dim % len(shape)
            if local[d] % size:
                return False
            local[d] //= size
    return len(layout) == mesh.ndim
