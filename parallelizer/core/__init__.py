"""Core vocabulary: abstract mesh, placements/layouts, and the single source of redistribution steps."""
from .layout import IndivisibleShardError, Layout, Partial, Replicate, Shard, local_shape, parse_placement, placement_str
from .mesh import MeshSpec
from .redistribute import ImpossibleRedistributionError, Step, edge_steps, redistribute_steps

__all__ = ["MeshSpec", "Layout", "Shard", "Replicate", "Partial", "placement_str", "parse_placement",
           "local_shape", "IndivisibleShardError", "Step", "redistribute_steps", "edge_steps",
           "ImpossibleRedistributionError"]
