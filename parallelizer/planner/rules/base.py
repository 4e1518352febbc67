"""What a sharding rule sees and returns: `OpView` (one node) and `AxisOption` (one strategy on ONE mesh
axis). Multi-axis strategies are products of per-axis options (`planner.strategies`).

Placements follow DTensor (`Shard(d)`, `Replicate()`, `Partial("sum")`); uneven shards follow torch.chunk
(`core.layout`). An option lists the placement of every tensor input (in `OpView.in_shapes` order) and
of the output (shared by every output of a multi-output op). An option whose local computation is only
right when a sharded dim splits into EQUAL chunks (an op that pairs chunks of two different dims, or a
kernel that rejects an empty shard) names those tensors in `even`; the strategy product keeps it only where
they do. A view that merges or splits a sharded dim names its input and output in `regroup` instead: when
the chunks are uneven its local form moves the few rows that cross chunk boundaries between neighbouring
ranks (`rewriter.collectives.rechunk`), which needs the dim sharded by that one mesh axis only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

aten = torch.ops.aten
R = Replicate()
P = Partial("sum")
OUT = -1  # index of the output in `AxisOption.even` / `AxisOption.regroup`


@dataclass(frozen=True)
class OpView:
    """What a rule sees of a node.

    Attributes:
        target: the ATen OpOverload (or operator.getitem).
        args, kwargs: the node's raw arguments (fx Nodes stand for tensors).
        in_shapes, in_dtypes: global shape and dtype of each tensor input, in order of appearance in args
            then kwargs (lists of tensors, e.g. einsum's operands, are flattened in place).
        out_shapes, out_dtypes: global shape and dtype of each tensor output.
    """

    target: object
    args: tuple
    kwargs: dict
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[torch.dtype, ...] = ()
    out_dtypes: tuple[torch.dtype, ...] = ()

    @property
    def out(self) -> tuple[int, ...]:
        """Shape of the first output (() when the op returns no tensor)."""
        return self.out_shapes[0] if self.out_shapes else ()

    @property
    def out_is_float(self) -> bool:
        return bool(self.out_dtypes) and self.out_dtypes[0].is_floating_point

    @property
    def n_in(self) -> int:
        return len(self.in_shapes)

    @property
    def packet(self):
        return getattr(self.target, "overloadpacket", self.target)

    @property
    def overload(self) -> str:
        return getattr(self.target, "_overloadname", "")

    def arg(self, i: int, name: str, default=None):
        """Positional argument i, else keyword `name`, else `default`."""
        if len(self.args) > i:
            return self.args[i]
        return self.kwargs.get(name, default)

    def nd(self, k: int = 0) -> int:
        """Rank of tensor input k."""
        return len(self.in_shapes[k])


@dataclass(frozen=True)
class AxisOption:
    """One strategy of a node on one mesh axis: input placements, output placement, and the tensors whose
    sharded dim must split evenly, or else be regrouped (input indices, `OUT` for the output; module
    docstring)."""

    inputs: tuple[Placement, ...]
    output: Placement
    even: tuple[int, ...] = ()
    regroup: tuple[int, ...] = ()


def replicate(v: OpView) -> AxisOption:
    """The all-Replicate option (every rule lists it first)."""
    return AxisOption((R,) * v.n_in, R)


def same_dims(v: OpView, d: int, shapes=None, out=None) -> tuple[Placement, ...]:
    """Placement of each input for output dim `d` under right-aligned broadcasting: Shard of the matching
    input dim where it has the output's size there, Replicate where it is broadcast (size 1 or absent)."""
    out = v.out if out is None else out
    res = []
    for s in (v.in_shapes if shapes is None else shapes):
        k = d - (len(out) - len(s))
        res.append(Shard(k) if k >= 0 and s[k] == out[d] else R)
    return tuple(res)


def dims_arg(v: OpView, i: int, name: str, nd: int) -> list[int]:
    """A dim / dims argument normalised to non-negative dims (None or [] = every dim)."""
    dims = v.arg(i, name)
    if dims is None or dims == []:
        return list(range(nd))
    return sorted({d % nd for d in (dims if isinstance(dims, (list, tuple)) else [dims])})
