"""THE single source of collective steps for a layout change (DESIGN.md rule 1).

`redistribute_steps(src, dst, shape, mesh)` returns the ordered steps that turn a tensor placed by `src`
into one placed by `dst`; `edge_steps` adds the gradient semantics of one use of the tensor (below). The
planner prices exactly these steps (`parallelizer.planner.costs.step_time_s`); the rewriter emits exactly
these steps.

Step kinds (forward -> backward conjugate):
    all_gather      Shard(d) -> Replicate on one axis       bwd reduce_scatter (or local_slice, see below)
    reduce_scatter  Partial  -> Shard(d)                    bwd all_gather
    all_reduce      Partial  -> Replicate                   bwd identity
    all_to_all      Shard(d1) -> Shard(d2)                  bwd all_to_all (d2 -> d1)
    local_slice     Replicate -> Shard(d), no communication bwd all_gather
    grad_all_reduce identity (layout unchanged)             bwd all_reduce  (Megatron's "f" operator)
`Replicate -> Partial` and `Shard -> Partial` are impossible (raise `ImpossibleRedistributionError`).

Multi-axis changes are decomposed deterministically in three phases: (1) resolve Partial axes in mesh
order (reduce_scatter straight to the target shard when the nesting allows it, else all_reduce);
(2) unshard axes from the innermost to the outermost (all_to_all when the target is another shard and the
nesting allows, else all_gather); (3) shard the remaining axes from the outermost to the innermost by local
slicing. An axis whose placement is already right is redone when an outer axis on the same tensor dim
changes, because a dim sharded by several axes is split in mesh-axis order (outer axis = outer chunk).

Gradient semantics (the contract with the rewriter). Every rank runs the same local program; autograd
produces local gradients. Invariant: the gradient of a Replicate tensor is full (identical on all ranks) and
the gradient of a Partial tensor is full too. A use of a tensor that is Replicate on mesh axis a by a node
whose output is Shard or Partial on a (the computation is split over a) receives a partial-sum gradient;
`edge_steps(..., grad_partial_axes=(a,))` restores the invariant: if the last step on axis a is an
all_gather, its backward reduce_scatter sums the partial gradients (FSDP, Megatron sequence parallelism);
otherwise a `grad_all_reduce` is appended (DDP gradient sync, Megatron's f). Every other all_gather receives
full gradients, so its backward is a free `local_slice`. Tensors without gradients get identity backwards.

Bytes follow nccl-tests' convention (`cost_model.communication`): all_gather = output (gathered) local
bytes, reduce_scatter = input local bytes, all_reduce = the buffer, all_to_all = the per-rank buffer.
A SUM of a float narrower than float32 (float16, bfloat16) runs in float32 and is rounded once after it
(`rewriter.collectives`; round 24, r24b), as one device's kernels accumulate in float32 and round once; a dtype
gloo cannot sum runs in a wider one (int16 in int64, float8 in float32; `sum_dtype`): its
steps move `sum_itemsize` bytes per element (4 for float16; 8 for int16; round 25), the forward all_reduce / reduce_scatter of a Partial and,
on a tensor that is not a parameter, the backward sums of gradients (`grad_all_reduce`, an all_gather's
reduce_scatter conjugate). A parameter's gradient sums are priced at the plan's gradient bytes by the planner
(`planner.costs.Pricer.step_time_s`), so their bytes stay at the use dtype here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from ..errors import ParallelizerError
from .layout import Layout, Partial, Replicate, Shard, local_shape, placement_str
from .mesh import MeshSpec

__all__ = ["Step", "STEP_KINDS", "COLLECTIVE_KINDS", "redistribute_steps", "edge_steps", "grad_partial_axes",
           "ImpossibleRedistributionError", "NARROW_FLOATS", "WIDENED_FLOATS", "SUMMED_AS_IS", "sum_dtype",
           "sum_itemsize", "widened_dtype"]

STEP_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "local_slice", "grad_all_reduce")
COLLECTIVE_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
_DEFAULT_BWD = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather", "all_reduce": "identity",
                "all_to_all": "all_to_all", "local_slice": "all_gather", "grad_all_reduce": "all_reduce"}


NARROW_FLOATS = frozenset({torch.float16, torch.bfloat16})
"""Floats whose sums over ranks run in float32 (module docstring): one device's matmul, sum and norm kernels
accumulate them in float32 and round once (`at::opmath_type`), so a pending sum held per rank in them rounds
(float16: overflows beyond 65504) where one device does not."""


WIDENED_FLOATS = frozenset({torch.float16})
"""Floats whose ops with a pending-sum output run on float32 copies of their inputs (`rewriter.apply._sums_wide`,
priced so by `planner.costs.Pricer`): float16 overflows past 65504 where one device's float32 accumulation is
finite. A bfloat16 op keeps its dtype: bfloat16 has float32's exponent range, so its product is rounded once per
rank (as Megatron-LM's row-parallel output and autocast's products are) and only the sum over ranks runs in
float32; a bfloat16 product computed in float32 would run, and be priced, at a GPU's fp32 rate (67 vs 989 TFLOP/s
dense on an H100 SXM, NVIDIA H100 datasheet)."""


SUMMED_AS_IS = frozenset({torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float32,
                          torch.float64})
"""Dtypes a collective SUM runs in as they are: those gloo's reduce kernels take (ProcessGroupGloo's
GENERATE_ALL_TYPES, torch 2.13.0) apart from `NARROW_FLOATS`; complex64 / complex128 sum as their real views
(complex32 in complex64: `sum_dtype`)."""


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a collective SUM of a `dtype` tensor runs in, the one rule the runtime sums by
    (`rewriter.collectives._carried`, `grad_sync`, `localize`, `vocab_parallel`) and the planner prices by
    (`sum_itemsize`): `dtype` for `SUMMED_AS_IS` and complex dtypes; float32 for every other float (float16 /
    bfloat16: `NARROW_FLOATS`, as one device accumulates them; float8, which gloo cannot sum); int64 for every
    other integer (int16, uint16, uint32, uint64, which gloo cannot sum: added in int64 and cast back, wrapping as
    in their own dtype); complex64 for complex32 (its float16 parts, as float16; before round 26 summed in float16
    by gloo, one rounding per member: 2048 + 1 + 1 - 2048 over 4 ranks gave 0 for 2)."""
    if dtype is torch.complex32:
        return torch.complex64
    if dtype in SUMMED_AS_IS or dtype.is_complex:
        return dtype
    return torch.float32 if dtype.is_floating_point else torch.int64


def widened_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an input of `dtype` is computed in by an op whose output is a pending sum of a `WIDENED_FLOATS`
    value (`rewriter.apply.as_sum_dtype`, priced so by `planner.costs.Pricer`): float32 for `NARROW_FLOATS`,
    else `dtype` (an index or mask input keeps its own)."""
    return torch.float32 if dtype in NARROW_FLOATS else dtype


def sum_itemsize(dtype: torch.dtype) -> int:
    """Bytes per element a summing collective moves for a `dtype` tensor: the itemsize of `sum_dtype(dtype)`,
    the dtype the runtime sums it in (4 for float16 / bfloat16; an int16 or uint16 tensor its own 2, a float64
    one 8). The planner (`planner.costs.Pricer.steps`, `planner.op_comm`, `planner.plan.derive_edge`) and the
    rewriter (`rewriter.apply`) all read the width of a sum here, from a dtype, never from an itemsize alone
    (before round 25 the planner took any 2-byte tensor, an int16 one too, for a float summed at 4 B)."""
    return sum_dtype(dtype).itemsize


class ImpossibleRedistributionError(ParallelizerError, ValueError):
    """A layout change with no collective: Shard -> Partial, Replicate -> Partial, or mismatched reductions."""


@dataclass(frozen=True, slots=True)
class Step:
    """One collective (or local) step of a redistribution, on one mesh axis.

    Attributes:
        kind: one of STEP_KINDS (forward op).
        mesh_axis: the mesh axis name the collective runs over.
        tensor_dim: the tensor dim gathered / scattered / sliced (source dim for all_to_all), else None.
        dst_dim: the target tensor dim of an all_to_all, else None.
        before, after: the tensor's layout (string form) before and after this step.
        nbytes: forward bytes in nccl-tests convention (module docstring); 0 when nothing is sent.
        bwd_kind: the backward conjugate: "reduce_scatter", "all_gather", "all_to_all", "all_reduce",
            "local_slice" or "identity".
        bwd_nbytes: backward bytes in nccl-tests convention; 0 when nothing is sent.
        reduce_op: "sum" or "avg" for reductions of a Partial tensor, else None.
        regather: True for an all_gather of a stored parameter shard (ZeRO-3 / FSDP with
            reshard_after_forward): the gathered tensor is freed after its forward use and the backward runs
            the same all_gather again before its conjugate, so the gathered copy is never saved.
    """

    kind: str
    mesh_axis: str
    tensor_dim: int | None
    dst_dim: int | None
    before: str
    after: str
    nbytes: int
    bwd_kind: str
    bwd_nbytes: int
    reduce_op: str | None = None
    regather: bool = False

    @property
    def fwd_collective(self) -> str | None:
        """The cost_model collective kind run in forward, or None (local_slice, grad_all_reduce)."""
        return self.kind if self.kind in COLLECTIVE_KINDS else None

    @property
    def bwd_collective(self) -> str | None:
        """The cost_model collective kind run in backward, or None (identity, local_slice)."""
        return self.bwd_kind if self.bwd_kind in COLLECTIVE_KINDS else None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_dict(cls, d: dict) -> "Step":
        return cls(**d)

    def __str__(self) -> str:
        dims = "" if self.tensor_dim is None else f" dim {self.tensor_dim}" + (
            "" if self.dst_dim is None else f"->{self.dst_dim}")
        return f"{self.kind}[{self.mesh_axis}{dims}] {self.before}->{self.after}"


def _nbytes(shape: tuple[int, ...], layout: list, mesh: MeshSpec, itemsize: int) -> int:
    return math.prod(local_shape(shape, Layout(tuple(layout)), mesh)) * itemsize


def redistribute_steps(src: Layout, dst: Layout, shape: tuple[int, ...], mesh: MeshSpec, *,
                       itemsize: int = 4, sum_bytes: int | None = None) -> tuple[Step, ...]:
    """Ordered steps turning `src` into `dst` for a tensor of global `shape` (module docstring).

    Args:
        src, dst: layouts with one placement per mesh axis.
        shape: global tensor shape.
        mesh: the mesh.
        itemsize: bytes per element (dtype.itemsize), for `Step.nbytes`.
        sum_bytes: bytes per element of the summing steps (all_reduce, reduce_scatter; `sum_itemsize`: 4
            for float16 / bfloat16, which sum in float32); default `itemsize`.
    Returns:
        The steps; () when src == dst. Backward kinds are the defaults (all_gather -> reduce_scatter);
        `edge_steps` refines them for one use.
    Raises:
        ImpossibleRedistributionError: dst is Partial on an axis where src is not the same Partial.
        IndivisibleShardError: src or dst does not fit `shape` on `mesh`.
    """
    shape = tuple(shape)
    sum_bytes = itemsize if sum_bytes is None else sum_bytes
    if getattr(src, "_plain", False) and getattr(dst, "_plain", False):
        return _cached_steps(src, dst, shape, mesh, itemsize, sum_bytes)  # immutable steps, shared between callers
    return _steps(src, dst, shape, mesh, itemsize, sum_bytes)


def _steps(src: Layout, dst: Layout, shape: tuple[int, ...], mesh: MeshSpec, itemsize: int,
           sum_bytes: int | None = None) -> tuple[Step, ...]:
    """`redistribute_steps` uncached: the moves of `_moves` (which depend on the placements only), each sized for
    `shape` (nccl-tests' byte convention, module docstring)."""
    sum_bytes = itemsize if sum_bytes is None else sum_bytes
    nd = len(shape)
    src, dst = src.normalized(nd), dst.normalized(nd)
    local_shape(shape, src, mesh)
    local_shape(shape, dst, mesh)
    moves = _cached_moves(src, dst, mesh) if src._plain and dst._plain else _moves(src, dst, mesh)
    steps: list[Step] = []
    for kind, i, layout_before, layout_after, tensor_dim, dst_dim, op in moves:
        b_before, b_after = (math.prod(local_shape(shape, x, mesh)) * itemsize for x in (layout_before, layout_after))
        summed = b_before // itemsize * sum_bytes
        fwd = {"all_gather": b_after, "reduce_scatter": summed, "all_reduce": summed,
               "all_to_all": b_before, "local_slice": 0}[kind]
        bwd_kind = _DEFAULT_BWD[kind]
        bwd = {"reduce_scatter": b_after, "all_gather": b_before, "all_to_all": b_after, "identity": 0}[bwd_kind]
        steps.append(Step(kind, mesh.axis_names[i], tensor_dim, dst_dim, str(layout_before), str(layout_after), fwd,
                          bwd_kind, bwd, op))
    return tuple(steps)


def _moves(src: Layout, dst: Layout, mesh: MeshSpec) -> tuple[tuple, ...]:
    """The decomposition of src -> dst (normalized layouts) into moves (kind, mesh axis index, layout before, layout
    after, tensor dim, destination dim, reduce op of a Partial resolved), by the three phases of the module
    docstring. A function of the placements and the mesh alone, not of the tensor's shape: `_steps` sizes the moves
    for each shape (round 26, r26a: the planner asks ~15k distinct (layouts, shape) pairs per 2x2 Llama plan, of far
    fewer layout pairs). Raises ImpossibleRedistributionError (module docstring)."""
    for a, (s, d) in enumerate(zip(src, dst)):
        if isinstance(d, Partial) and s != d:
            raise ImpossibleRedistributionError(
                f"cannot redistribute {src} -> {dst} on mesh {mesh}: {placement_str(s)} -> {placement_str(d)} "
                f"on axis {mesh.axis_names[a]!r} is impossible (no collective makes a Partial tensor); "
                "choose a strategy whose input is not Partial there")
    n = mesh.ndim
    cur = list(src)
    pending = [False] * n
    for i in range(n):  # closure: redo an axis when an outer axis on the same tensor dim changes
        same = isinstance(cur[i], Shard) and any(pending[k] and cur[i] in (cur[k], dst[k]) for k in range(i))
        pending[i] = cur[i] != dst[i] or same
    moves: list[tuple] = []

    def touches(p, d: int) -> bool:
        return isinstance(p, Shard) and p.dim == d

    def safe(i: int, d: int) -> bool:  # may axis i hold Shard(d) now, in mesh-order nesting?
        outer_ok = all(not pending[k] for k in range(i) if touches(cur[k], d) or touches(dst[k], d))
        return outer_ok and not any(touches(cur[j], d) for j in range(i + 1, n))

    held = [Layout(tuple(cur))]  # the tensor's layout before the next move (each move's `after` made once)

    def emit(kind: str, i: int, new, tensor_dim=None, dst_dim=None) -> None:
        before = cur[i]
        cur[i] = new
        held.append(Layout(tuple(cur)))
        op = before.reduce_op if isinstance(before, Partial) else None
        moves.append((kind, i, held[-2], held[-1], tensor_dim, dst_dim, op))

    for i in range(n):  # phase 1: Partial axes, mesh order
        if pending[i] and isinstance(cur[i], Partial):
            if isinstance(dst[i], Shard) and safe(i, dst[i].dim):
                emit("reduce_scatter", i, dst[i], dst[i].dim)
            else:
                emit("all_reduce", i, Replicate())
            pending[i] = cur[i] != dst[i]
    for i in reversed(range(n)):  # phase 2: unshard, innermost first
        if pending[i] and isinstance(cur[i], Shard):
            d = cur[i].dim
            if (isinstance(dst[i], Shard) and dst[i] != cur[i] and safe(i, dst[i].dim)
                    and not any(touches(cur[j], d) for j in range(i + 1, n))):
                emit("all_to_all", i, dst[i], d, dst[i].dim)
            else:
                emit("all_gather", i, Replicate(), d)
            pending[i] = cur[i] != dst[i]
    for i in range(n):  # phase 3: shard, outermost first
        if pending[i]:
            emit("local_slice", i, dst[i], dst[i].dim)
            pending[i] = False
    return tuple(moves)


# Layouts of plain placements are equal exactly when their strings are (`core.layout._PLAIN_TYPES`), so the moves
# and the steps are pure functions of these hashable arguments: one entry per distinct layout pair (per distinct edge),
# kept across plans of one process (a notebook planning again, the pipeline search's meshes); exceptions are not
# cached (raised again each call).
_cached_moves = lru_cache(maxsize=8192)(_moves)
_cached_steps = lru_cache(maxsize=32768)(_steps)


def grad_partial_axes(consumed: Layout, output: Layout | None, mesh: MeshSpec) -> tuple[str, ...]:
    """Mesh axes on which an input consumed as `consumed` receives a partial-sum gradient: it is Replicate
    there while the node's `output` is Shard or Partial (the computation is split over that axis). The
    planner prices and the rewriter emits the resulting `grad_all_reduce` from this one rule."""
    if output is None:
        return ()
    return tuple(a for a, p_in, p_out in zip(mesh.axis_names, consumed, output)
                 if isinstance(p_in, Replicate) and not isinstance(p_out, Replicate))


def edge_steps(src: Layout, dst: Layout, shape: tuple[int, ...], mesh: MeshSpec, *, itemsize: int = 4,
               grad_partial_axes: tuple[str, ...] = (), requires_grad: bool = True,
               is_parameter: bool = False, sum_bytes: int | None = None) -> tuple[Step, ...]:
    """Steps of one use of a tensor: `redistribute_steps` plus the gradient semantics (module docstring).

    Args:
        grad_partial_axes: mesh axes on which the consumer's input is Replicate while its computation is
            split (output Shard or Partial): the gradient arriving there is a partial sum.
        requires_grad: False for tensors without gradients (inputs, integer tensors, buffers): every
            backward is "identity".
        is_parameter: the tensor is a stored parameter: its all_gathers are `regather` steps (FSDP).
        sum_bytes: bytes per element of summing steps (`redistribute_steps`); on a tensor that is not a
            parameter also of the gradient sums in backward (module docstring).
    Raises:
        ValueError: an axis in grad_partial_axes is not Replicate in `dst`.
        and what `redistribute_steps` raises.
    """
    steps = list(redistribute_steps(src, dst, shape, mesh, itemsize=itemsize, sum_bytes=sum_bytes))
    grad_bytes = itemsize if is_parameter or sum_bytes is None else sum_bytes  # per element of a gradient sum
    if is_parameter:
        steps = [replace(s, regather=True) if s.kind == "all_gather" else s for s in steps]
    if not requires_grad:
        return tuple(replace(s, bwd_kind="identity", bwd_nbytes=0) for s in steps)
    dst = dst.normalized(len(shape))
    absorbed: set[int] = set()
    for axis in sorted(set(grad_partial_axes), key=mesh.index):
        i = mesh.index(axis)
        if not isinstance(dst[i], Replicate):
            raise ValueError(f"grad_partial_axes names {axis!r} but the consumer layout {dst} is not "
                             "Replicate there; only a Replicate input of a split computation gets partial grads")
        on_axis = [k for k, s in enumerate(steps) if s.mesh_axis == axis]
        if on_axis and steps[on_axis[-1]].kind == "all_gather":
            absorbed.add(on_axis[-1])
        else:
            nbytes = _nbytes(tuple(shape), list(dst), mesh, grad_bytes)
            steps.append(Step("grad_all_reduce", axis, None, None, str(dst), str(dst), 0, "all_reduce", nbytes))
    return tuple(replace(s, bwd_kind="local_slice", bwd_nbytes=0) if s.kind == "all_gather" and k not in absorbed
                 else replace(s, bwd_nbytes=s.bwd_nbytes // itemsize * grad_bytes) if s.kind == "all_gather"
                 else s for k, s in enumerate(steps))
