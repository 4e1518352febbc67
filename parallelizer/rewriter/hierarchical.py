"""Hierarchical (two-level) collectives over a process group that spans nodes, run on sub-groups.

A group of n = g * m ranks, g on each of m nodes (node of a global rank = rank // devices_per_node; the
members are sorted, so member j = node k, local index l sits at j = k * g + l), is split into
  * intra groups: the g members on one node (one per node), and
  * inter groups: the m members with the same local index l (one per l),
and (`cost_model.communication`, module docstring, where the choice and its price are made):
  * all-reduce (sum) = reduce-scatter inside the node, all-reduce across nodes on 1/g of the buffer (the g
    inter groups run in parallel), all-gather inside the node;
  * all-gather = all-gather across nodes (this local index's chunks), then inside the node;
  * reduce-scatter = reduce-scatter inside the node (each local index gets its nodes' chunks summed over
    the node), then across nodes.
The all-reduce is Horovod's hierarchical allreduce (horovod/horovod PR #411: NCCL reduce-scatter, MPI
all-reduce, NCCL all-gather); all-gather and reduce-scatter decompose the same way (Cho et al., "BlueConnect",
SysML 2019). All three run on torch.distributed's own collectives over the sub-groups.

Which collectives run this way is a decision of the plan (`Plan.hierarchical`): per mesh axis the devices
per node and, per collective kind, the message sizes (bytes, nccl-tests convention) for which the planner
priced the two-level algorithm strictly cheaper (`cost_model.communication.hierarchical_byte_ranges`). The
emitted program carries that rule as a plain tuple (`Hierarchy`, printable in `gm.code`) and each collective
picks its algorithm by the bytes it moves (`uses_hierarchy`), so the program runs what was priced.

The sub-groups are created once, on every rank, in the same order, before a program runs
(`sub_groups`, called by `parallelizer.auto_parallelize` and the rehearsals with `create_groups`).

The sum is taken in a different order than a flat ring's, so results equal the flat all-reduce up to float
rounding (torch.testing's fp32 tolerances), not bitwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Hierarchy", "hierarchy_arg", "uses_hierarchy", "split_group", "sub_groups", "Levels",
           "HierarchicalAllReduce", "all_gather", "reduce_scatter"]

Hierarchy = tuple
"""`(devices_per_node, ((kind, ((lo_bytes, hi_bytes), ...)), ...))`: the plan's rule for one mesh axis
(`hierarchy_arg`); kinds sorted, intervals (lo, hi], `hi` may be `inf`."""


def hierarchy_arg(devices_per_node: int, ranges: dict[str, list]) -> Hierarchy:
    """The `Hierarchy` tuple of one mesh axis from a plan's record (`Plan.hierarchical[axis]`).

    Raises:
        ValueError: devices_per_node < 1, or a range that is not (lo, hi) with 0 <= lo < hi.
    """
    if not isinstance(devices_per_node, int) or devices_per_node < 1:
        raise ValueError(f"hierarchy: devices_per_node must be an int >= 1, got {devices_per_node!r}")
    out = []
    for kind in sorted(ranges):
        pairs = tuple((float(lo), float("inf") if hi is None else float(hi)) for lo, hi in ranges[kind])
        if any(not 0 <= lo < hi for lo, hi in pairs):
            raise ValueError(f"hierarchy: byte ranges of {kind} must be (lo, hi) with 0 <= lo < hi, got {ranges[kind]}")
        out.append((kind, pairs))
    return devices_per_node, tuple(out)


def uses_hierarchy(hierarchy: Hierarchy | None, kind: str, nbytes: int) -> bool:
    """Whether a `kind` collective of `nbytes` bytes (nccl-tests convention: all_reduce the buffer, all_gather
    the output, reduce_scatter the input) runs two-level under the rule `hierarchy` (None: never)."""
    if hierarchy is None:
        return False
    return any(lo < nbytes <= hi for k, pairs in hierarchy[1] if k == kind for lo, hi in pairs)


def split_group(ranks: tuple[int, ...] | list[int], devices_per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """(intra groups, inter groups) of a group of sorted global ranks (module docstring); ([], []) when the group
    lies in one node, has one member per node, or its members are spread unevenly over nodes (no two-level
    algorithm: such a group runs flat, and the planner records no rule for it)."""
    nodes: dict[int, list[int]] = {}
    for r in ranks:
        nodes.setdefault(r // devices_per_node, []).append(r)
    sizes = {len(members) for members in nodes.values()}
    if len(nodes) < 2 or len(sizes) != 1 or sizes == {1}:
        return [], []
    intra = list(nodes.values())
    inter = [list(column) for column in zip(*intra)]
    return intra, inter


def sub_groups(axis_groups: list[list[int]], devices_per_node: int) -> list[list[int]]:
    """Every intra and inter group of `axis_groups` (each once, in a fixed order): the groups to create on every
    rank before a program with hierarchical collectives over these groups runs."""
    out: list[list[int]] = []
    for ranks in axis_groups:
        intra, inter = split_group(ranks, devices_per_node)
        out += [s for s in intra + inter if len(s) > 1 and s not in out]
    return out


@dataclass(frozen=True, slots=True)
class Levels:
    """The calling rank's two sub-groups of a hierarchical group: process groups, sizes g (intra) and m (inter),
    and its index in each (l, k)."""

    intra: dist.ProcessGroup
    inter: dist.ProcessGroup
    g: int
    m: int
    local: int
    node: int


class HierarchicalAllReduce:
    """All-reduce (sum) of a flat 1-D tensor over a hierarchical group, in place, as three asynchronous phases
    (module docstring). `advance()` waits for the running phase and starts the next; `wait()` runs to the end
    and writes the sum into the tensor. Phases start only from these calls, in the caller's order, so ranks
    that make the same calls issue the same collectives on every sub-group in the same order (gloo and nccl
    match collectives by order per group). Waits are bounded by the groups' timeouts.

    Local shapes: `flat` (N,) -> (N,); internally padded with zeros to a multiple of g.
    """

    def __init__(self, flat: torch.Tensor, levels: Levels) -> None:
        self.flat, self.levels = flat, levels
        n = flat.numel()
        padded = -(-n // levels.g) * levels.g
        self.buffer = flat if padded == n else torch.cat([flat, flat.new_zeros(padded - n)])
        self.chunk = flat.new_empty(padded // levels.g)
        self.phase = 0
        self.work = dist.reduce_scatter_single(self.chunk, self.buffer, group=levels.intra, async_op=True)

    def advance(self) -> None:
        """Wait for the running phase and start the next (reduce-scatter -> all-reduce -> all-gather)."""
        if self.phase == 2:
            return
        self.work.wait()
        self.phase += 1
        if self.phase == 1:
            self.work = dist.all_reduce(self.chunk, group=self.levels.inter, async_op=True)
        else:
            self.work = dist.all_gather_single(self.buffer, self.chunk, group=self.levels.intra, async_op=True)

    def wait(self) -> torch.Tensor:
        """Finish every phase; returns `flat`, now holding the sum over the group."""
        while self.phase < 2:
            self.advance()
        self.work.wait()
        if self.buffer is not self.flat:
            self.flat.copy_(self.buffer[: self.flat.numel()])
        return self.flat


def all_gather(x: torch.Tensor, dim: int, levels: Levels) -> torch.Tensor:
    """Two-level all-gather of equal chunks along `dim` (pad uneven chunks first), in group order.

    Local shapes: (.., c, ..) -> (.., n * c, ..) along `dim`, n = g * m.
    """
    rows = x.movedim(dim, 0).contiguous()                                     # (c, *rest)
    across = rows.new_empty((levels.m * rows.shape[0], *rows.shape[1:]))
    dist.all_gather_single(across, rows, group=levels.inter)             # (m*c, *rest): nodes k, local l
    inside = rows.new_empty((levels.g * across.shape[0], *rows.shape[1:]))
    dist.all_gather_single(inside, across, group=levels.intra)           # (g*m*c, *rest): order [l][k]
    c = rows.shape[0]
    ordered = inside.view(levels.g, levels.m, c, *rows.shape[1:]).transpose(0, 1)   # [k][l] = group order
    return ordered.reshape(levels.g * levels.m * c, *rows.shape[1:]).movedim(0, dim)


def reduce_scatter(x: torch.Tensor, dim: int, levels: Levels) -> torch.Tensor:
    """Two-level reduce-scatter (sum) along `dim` whose length is a multiple of n = g * m (pad first): this rank
    keeps chunk k * g + l of the sum. Local shapes: (.., n * c, ..) -> (.., c, ..)."""
    rows = x.movedim(dim, 0)
    c = rows.shape[0] // (levels.g * levels.m)
    rest = rows.shape[1:]
    by_local = rows.reshape(levels.m, levels.g, c, *rest).transpose(0, 1).contiguous()  # [l][k]
    mine = rows.new_empty((levels.m * c, *rest))
    dist.reduce_scatter_single(mine, by_local.view(levels.g * levels.m * c, *rest), group=levels.intra)  # [k] of l
    out = rows.new_empty((c, *rest))
    dist.reduce_scatter_single(out, mine, group=levels.inter)
    return out.movedim(0, dim)
