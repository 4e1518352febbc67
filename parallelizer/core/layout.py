"""Placements and layouts: DTensor's placement types with short string forms, and local shapes.

Vocabulary (DESIGN.md): a *placement* says how a tensor lives along ONE mesh axis:
`Shard(d)` ("S(d)": split evenly along tensor dim d), `Replicate()` ("R": full copy), `Partial("sum")`
("P": every rank holds a summand; "P(avg)" for a mean). A *layout* is one placement per mesh axis, written
by concatenation, e.g. "S(0)R" on mesh (dp, tp) = batch-sharded over dp, replicated over tp.

Uneven shards follow torch.chunk, as DTensor does: a dim of N elements over n ranks is cut into chunks of
ceil(N / n); the last non-empty chunk is shorter and trailing ranks may hold empty chunks (N = 10 over 4:
3, 3, 3, 1; N = 4 over 8: 1, 1, 1, 1, 0, 0, 0, 0). When several mesh axes shard the same tensor dim
(e.g. "S(0)S(0)"), the dim is split in mesh-axis order: the outer axis picks a chunk, the inner axis
splits that chunk the same way (DTensor's default, row-major). Rank 0 of every axis holds the largest
chunk, so `local_shape` without coordinates is the largest shard: what the planner prices.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from fractions import Fraction

from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from ..errors import ParallelizerError
from .mesh import MeshSpec

__all__ = ["Regroup", "view_regroups", "Shard", "Replicate", "Partial", "Placement", "Layout", "placement_str", "parse_placement",
           "chunk_range", "local_shape", "local_region", "fits", "divides_evenly", "IndivisibleShardError", "R", "P"]

R = Replicate()
P = Partial("sum")
_TOKEN = re.compile(r"S\((-?\d+)\)|R|P\((sum|avg)\)|P")


class IndivisibleShardError(ParallelizerError, ValueError):
    """A layout does not fit a tensor (wrong number of placements, a dim the tensor lacks), or an op that
    needs even shards got a dim that does not divide by the mesh axes sharding it.

    Attributes: shape, layout (str), mesh (MeshSpec), dim, axis (the name of the offending mesh axis).
    """

    def __init__(self, message: str, shape: tuple[int, ...], layout: str, mesh: MeshSpec, dim: int | None,
                 axis: str | None) -> None:
        super().__init__(message)
        self.shape, self.layout, self.mesh, self.dim, self.axis = shape, layout, mesh, dim, axis


# The placement types whose short form determines the placement (a Shard by its dim, a Partial by its reduce op):
# layouts made of these types only are equal exactly when their strings are, so their normalized forms and local
# regions may be cached by string (`Layout._plain`). Subclasses (DTensor's private _StridedShard, _MaskPartial)
# carry more than their string and are never cached. The exact-type tests also spare the planner's hot paths
# torch 2.13's Python `OpaqueBaseMeta.__instancecheck__`, which every isinstance miss against a placement
# type runs (546k calls when planning a 2-layer Llama on 4 devices, round 19).
_PLAIN_TYPES = frozenset((Shard, Replicate, Partial))


def placement_str(p: Placement) -> str:
    """Short form: Shard(1) -> "S(1)", Replicate() -> "R", Partial("sum") -> "P", Partial("avg") -> "P(avg)"."""
    kind = type(p)
    if kind is Replicate:
        return "R"
    if kind is Shard:
        return f"S({p.dim})"
    if kind is Partial:
        return "P" if p.reduce_op == "sum" else f"P({p.reduce_op})"
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
    _plain: bool = field(init=False, repr=False, compare=False)  # only _PLAIN_TYPES: cacheable by string

    def __post_init__(self) -> None:
        object.__setattr__(self, "placements", tuple(self.placements))
        object.__setattr__(self, "_text", "".join(placement_str(p) for p in self.placements))  # validates
        object.__setattr__(self, "_plain", all(type(p) in _PLAIN_TYPES for p in self.placements))

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
        """Shard dims made non-negative for a tensor of rank `tensor_ndim` (cached for layouts of plain
        placements: a Layout is immutable)."""
        if getattr(self, "_plain", False):  # (a Layout unpickled from before the field has none)
            return _normalized(self, tensor_ndim)
        return self._normalized(tensor_ndim)

    def _normalized(self, tensor_ndim: int) -> "Layout":
        return Layout(tuple(Shard(p.dim % tensor_ndim) if isinstance(p, Shard) and tensor_ndim else p
                            for p in self.placements))

    @property
    def is_replicated(self) -> bool:
        return all(isinstance(p, Replicate) for p in self.placements)


@lru_cache(maxsize=4096)
def _normalized(layout: Layout, tensor_ndim: int) -> Layout:
    return layout._normalized(tensor_ndim)


def chunk_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """(start, length) of chunk `index` when a dim of `size` elements is split into `parts` chunks the way
    torch.chunk and DTensor's Shard do: chunks of ceil(size / parts), trailing chunks shorter or empty.

    Example: chunk_range(10, 4, 3) -> (9, 1); chunk_range(4, 8, 5) -> (4, 0).
    """
    step = -(-size // parts) if size else 0
    start = min(index * step, size)
    return start, min(step, size - start)


def _check_layout(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec) -> None:
    if len(layout) != mesh.ndim:
        raise IndivisibleShardError(f"layout {layout} has {len(layout)} placements but mesh {mesh} has "
                                    f"{mesh.ndim} axes; give one placement per mesh axis",
                                    shape, str(layout), mesh, None, None)
    for name, p in zip(mesh.axis_names, layout):
        if isinstance(p, Shard) and not -len(shape) <= p.dim < len(shape):
            raise IndivisibleShardError(f"layout {layout} shards dim {p.dim} over mesh axis {name!r}, but "
                                        f"shape {shape} has {len(shape)} dims", shape, str(layout), mesh,
                                        p.dim, name)


def local_region(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec,
                 coords: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(start, length) per tensor dim of the part of a tensor of global `shape` that the rank at mesh
    `coords` holds under `layout` (uneven chunks as in the module docstring; Partial and Replicate axes
    hold the whole dim). `coords=None` is coordinate 0 on every axis: the largest shard.

    Example: shape (10, 6), layout "S(0)S(0)" on mesh (dp=2, tp=2), coords (1, 1) -> starts (8, 0),
    lengths (2, 6): dp's second chunk is rows 5-9, tp's second chunk of those is rows 8-9.

    Raises:
        IndivisibleShardError: the layout has the wrong length or shards a dim the tensor does not have.
    """
    shape = tuple(shape)
    if getattr(layout, "_plain", False):  # a pure function of hashable arguments (the planner asks ~100 times per distinct call)
        return _local_region(shape, layout, mesh, None if coords is None else tuple(coords))
    return _local_region_uncached(shape, layout, mesh, coords)


def _local_region_uncached(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec,
                           coords: tuple[int, ...] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    _check_layout(shape, layout, mesh)
    starts, lengths = [0] * len(shape), list(shape)
    for axis, (size, p) in enumerate(zip(mesh.shape, layout)):
        if isinstance(p, Shard):
            d = p.dim % len(shape)
            offset, lengths[d] = chunk_range(lengths[d], size, coords[axis] if coords is not None else 0)
            starts[d] += offset
    return tuple(starts), tuple(lengths)


_local_region = lru_cache(maxsize=65536)(_local_region_uncached)


def local_shape(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec,
                coords: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Per-rank shape of a tensor of global `shape` placed by `layout` on `mesh`, for the rank at mesh
    `coords`; without `coords`, the largest shard (rank 0's), which is what the planner prices.

    Example: shape (8, 24), layout "S(0)S(1)" on mesh (dp=2, tp=4) -> (4, 6); shape (10,), "S(0)" on
    mesh (dp=4,) -> (3,) (ranks hold 3, 3, 3, 1).

    Raises:
        IndivisibleShardError: the layout has the wrong length or shards a dim the tensor does not have.
    """
    return local_region(shape, layout, mesh, coords)[1]


def fits(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec) -> bool:
    """True when `layout` can place a tensor of `shape` (one placement per mesh axis, existing dims)."""
    return len(layout) == mesh.ndim and all(
        -len(shape) <= p.dim < len(shape) for p in layout if isinstance(p, Shard))


def divides_evenly(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec,
                   dims: tuple[int, ...] | None = None) -> bool:
    """True when every sharded dim of `shape` (or only those in `dims`) splits into equal chunks over
    the mesh axes sharding it, in mesh-axis order (ops that merge or split a sharded dim need this)."""
    if not fits(shape, layout, mesh):
        return False
    local = list(shape)
    for size, p in zip(mesh.shape, layout):
        if isinstance(p, Shard):
            d = p.dim % len(shape)
            if dims is not None and d not in [x % len(shape) for x in dims]:
                continue
            if local[d] % size:
                return False
            local[d] //= size
    return True


@dataclass(frozen=True)
class Regroup:
    """One re-cut a view of an unevenly sharded dim needs (`view_regroups`): along tensor dim `dim`, split over
    mesh axis `axis` in consecutive blocks of `have[j]` elements (member j holds block j), into torch.chunk's
    blocks `want[j]`. `after`: the re-cut runs on the view's output (a merge); else on its input (a split)."""

    axis: int
    dim: int
    have: tuple[int, ...]
    want: tuple[int, ...]
    after: bool

    def rows_sent(self) -> int:
        """The most rows any member sends to others (the overlap of its old block with its new one stays)."""
        start_have = start_want = 0
        most = 0
        for h, w in zip(self.have, self.want):
            kept = max(0, min(start_have + h, start_want + w) - max(start_have, start_want))
            most = max(most, h - kept)
            start_have, start_want = start_have + h, start_want + w
        return most


def view_regroups(src: tuple[int, ...], dst: tuple[int, ...], inputs: Layout, output: Layout,
                  mesh_shape: tuple[int, ...]) -> list[Regroup]:
    """The re-cuts (`Regroup`) a view from global shape `src` (layout `inputs`) to `dst` (layout `output`) needs
    on a mesh of `mesh_shape`: a sharded dim it merges (rows -> rows x k) or splits whose chunks do not line up
    with torch.chunk's split of the new dim. Example: (10, 7) Shard(0) over 4 -> (70,) Shard(0): rows (3, 3,
    3, 1) give blocks (21, 21, 21, 7) but Shard(0) of 70 is (18, 18, 18, 16): one re-cut after the view.
    Used by the rewriter (`rewriter.localize.regrouped_view`) and priced by the planner (`planner.op_comm`)."""
    out = []
    for axis, (p_in, p_out) in enumerate(zip(inputs, output)):
        n = mesh_shape[axis]
        if n == 1 or not isinstance(p_in, Shard) or not isinstance(p_out, Shard):
            continue
        d, e = p_in.dim % len(src), p_out.dim % len(dst)
        if src[d] == dst[e]:
            continue
        chunks = lambda size: tuple(chunk_range(size, n, j)[1] for j in range(n))  # noqa: E731
        # rows of dim d hold src_inner elements, rows of dim e dst_inner: a block of m rows of d is m * dst[e] /
        # src[d] rows of e (the ratio is rational: (12, 8) -> (16, 6) is 4/3 rows of e per row of d)
        ratio = Fraction(dst[e], src[d])
        have, want = tuple(m * ratio for m in chunks(src[d])), chunks(dst[e])
        if have == want:        # the blocks coincide (every even split does): a local view
            continue
        if dst[e] > src[d] and all(h.denominator == 1 for h in have):   # merge: re-cut the output rows
            out.append(Regroup(axis, e, tuple(int(h) for h in have), want, True))
            continue
        back = tuple(w / ratio for w in want)
        if all(b.denominator == 1 for b in back):    # split: re-cut the input rows first
            out.append(Regroup(axis, d, chunks(src[d]), tuple(int(b) for b in back), False))
            continue
        if all(h.denominator == 1 for h in have):
            out.append(Regroup(axis, e, tuple(int(h) for h in have), want, True))
            continue
        raise IndivisibleShardError(
            f"a view from {tuple(src)} to {tuple(dst)} sharding dim {d} -> dim {e} over {n} ranks: the chunks "
            f"{chunks(src[d])} of dim {d} are not whole rows of dim {e} (chunks {want}), nor the reverse",
            tuple(src), str(inputs), None, d, None)
    return out
