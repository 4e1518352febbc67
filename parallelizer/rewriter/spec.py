"""`ShardingSpec`: the sharding decisions the rewriter consumes (a `Plan` converts to it).

Per call_function node: the layout of each tensor argument as the node consumes it, and the layout of its
output; per parameter/buffer: its stored layout. User inputs arrive global (replicated) and are sliced
locally to the layout their consumers ask for, which costs no communication.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.layout import Layout, Replicate
from ..core.mesh import MeshSpec
from .compression import NO_COMPRESSION, GradCompression
from .hierarchical import hierarchy_arg, sub_groups


@dataclass(frozen=True, slots=True)
class NodeSharding:
    """Layouts of one node: `inputs[i]` for its i-th fx-node argument (in `torch.fx.node.map_arg` order over
    args then kwargs), and `output` for every tensor it produces."""

    inputs: tuple[Layout, ...]
    output: Layout


@dataclass(frozen=True, slots=True)
class ShardingSpec:
    """Mesh, per-node layouts (call_function and output nodes), and stored layouts per canonical FQN.

    `inputs` gives the layout in which a graph input ARRIVES when it is not a global tensor (the
    activations a pipeline stage receives from the previous stage, already sharded); such inputs carry
    gradients back. Inputs not named there are global (replicated) user inputs without gradients.
    `rank_offset` is added to every rank of the mesh: a pipeline stage's (dp, tp) sub-mesh starts at
    global rank stage_index * dp * tp.
    `recompute`: activation recomputation, region -> "selective" | "full" (`Plan.recompute`; emitted by
    `rewriter.recompute`).
    `compression`: the codec of the bucketed gradient sync of replicated parameters (`Plan.compression`,
    `rewriter.compression`).
    `hierarchy`: mesh axis -> the plan's rule for two-level collectives on that axis (`Plan.hierarchical`,
    `rewriter.hierarchical.Hierarchy`); axes absent run every collective flat.
    `autocast`: the mixed-precision recipe the program's forward runs under (`runtime.precision`, e.g.
    "autocast_bf16"; `Plan.config["mixed_precision"]`), None: the traced dtypes.
    `zero1`: the mesh axis the plan prices the optimizer state partitioned over (`Plan.config["zero1"]`,
    `runtime.zero1`), None: every rank keeps all of it.
    """

    mesh: MeshSpec
    nodes: Mapping[str, NodeSharding]
    params: Mapping[str, Layout]
    inputs: Mapping[str, Layout] = field(default_factory=dict)
    rank_offset: int = 0
    recompute: Mapping[str, str] = field(default_factory=dict)
    compression: GradCompression = NO_COMPRESSION
    hierarchy: Mapping[str, tuple] = field(default_factory=dict)
    autocast: str | None = None
    zero1: str | None = None


def axis_ranks(mesh: MeshSpec, rank: int) -> dict[str, list[int]]:
    """For each mesh axis, the global ranks of the group along that axis that contains `rank`.

    Ranks are laid out row-major over `mesh.shape` (last axis fastest), as `init_device_mesh` does.
    Example: mesh (dp=2, tp=2), rank 3 -> {"dp": [1, 3], "tp": [2, 3]}.
    Raises ValueError when `rank` is outside the mesh.
    """
    if not 0 <= rank < mesh.world_size:
        raise ValueError(f"rank {rank} is outside mesh {mesh} of {mesh.world_size} devices")
    coords = mesh_coords(mesh, rank)
    strides = [1] * mesh.ndim
    for i in reversed(range(mesh.ndim - 1)):
        strides[i] = strides[i + 1] * mesh.shape[i + 1]
    out = {}
    for i, name in enumerate(mesh.axis_names):
        rest = rank - coords[i] * strides[i]  # this rank with its coordinate on axis i set to 0
        out[name] = [rest + j * strides[i] for j in range(mesh.shape[i])]
    return out


def mesh_coords(mesh: MeshSpec, rank: int) -> tuple[int, ...]:
    """Coordinates of `rank` on the mesh (row-major, last axis fastest)."""
    coords = []
    for size in reversed(mesh.shape):
        coords.append(rank % size)
        rank //= size
    return tuple(reversed(coords))


def all_axis_groups(mesh: MeshSpec) -> list[list[int]]:
    """Every group of every mesh axis (each once), to create on all ranks before running a program."""
    groups: list[list[int]] = []
    for rank in range(mesh.world_size):
        for ranks in axis_ranks(mesh, rank).values():
            if len(ranks) > 1 and ranks not in groups:
                groups.append(ranks)
    return groups


def hierarchical_sub_groups(spec: ShardingSpec, rank_offsets: tuple[int, ...] = (0,)) -> list[list[int]]:
    """The intra- and inter-node sub-groups (`rewriter.hierarchical.sub_groups`) of every group of the axes with a
    hierarchical rule, for the copies of the mesh starting at `rank_offsets` (pipeline stages): to create on
    every rank, in this order, before the programs run."""
    out: list[list[int]] = []
    for axis, (devices_per_node, _) in sorted(spec.hierarchy.items()):
        groups = []
        for offset in rank_offsets:
            for rank in range(spec.mesh.world_size):
                ranks = [r + offset for r in axis_ranks(spec.mesh, rank)[axis]]
                if ranks not in groups:
                    groups.append(ranks)
        out += [s for s in sub_groups(groups, devices_per_node) if s not in out]
    return out


def squeeze_trivial_axes(spec: ShardingSpec) -> ShardingSpec:
    """The same decisions with every placement on a size-1 mesh axis made Replicate: one rank holds the
    whole tensor there (a shard of one, a sum of one), so no step is emitted on such an axis and a mesh of
    one device runs the eager program with no collectives."""
    trivial = [i for i, size in enumerate(spec.mesh.shape) if size == 1]
    if not trivial:
        return spec

    def squeeze(layout: Layout) -> Layout:
        out = layout
        for i in trivial:
            out = out.with_axis(i, Replicate())
        return out

    nodes = {n: NodeSharding(tuple(squeeze(x) for x in s.inputs), squeeze(s.output)) for n, s in spec.nodes.items()}
    return ShardingSpec(spec.mesh, nodes, {f: squeeze(x) for f, x in spec.params.items()},
                        {n: squeeze(x) for n, x in spec.inputs.items()}, spec.rank_offset, spec.recompute,
                        spec.compression, spec.hierarchy, spec.autocast, spec.zero1)


def spec_from_plan(plan) -> ShardingSpec:
    """The rewriter's view of a `parallelizer.planner.Plan`: per-node input/output layouts (the graph's
    output node keeps its input layouts), the stored layout of each parameter/buffer, the recomputed
    regions, the gradient codec, the hierarchical-collective rules and the mixed-precision recipe
    (`Plan.config["mixed_precision"]`, `runtime.precision`).

    Raises ValueError naming the node when a layout string in the plan does not parse.
    """
    nodes = {}
    for name, node in plan.nodes.items():
        if node.output is None and name != "output":
            continue  # placeholders carry no strategy of their own
        inputs = tuple(Layout.parse(s) for s in node.inputs)
        output = Layout.parse(node.output) if node.output is not None else Layout.replicate(plan.mesh.ndim)
        nodes[name] = NodeSharding(inputs, output)
    params = {fqn: Layout.parse(p.stored) for fqn, p in plan.params.items()}
    hierarchy = {axis: hierarchy_arg(h["devices_per_node"], h["bytes"]) for axis, h in plan.hierarchical.items()}
    return ShardingSpec(plan.mesh, nodes, params, recompute=dict(plan.recompute),
                        compression=GradCompression.from_record(getattr(plan, "compression", {})),
                        hierarchy=hierarchy, autocast=plan.config.get("mixed_precision"),
                        zero1=plan.config.get("zero1"))
