"""`runtime.replicas.generator_groups`: which ranks must hold torch's generator in one state for a program's
random draws (round 24, r24g): ranks with equal coordinates on every mesh axis over which ALL the draws are
sharded. Worked out by hand from the mesh (row-major, last axis fastest: on dp=2 x tp=2, rank = 2 * dp + tp)."""
import pytest
import torch.fx

from parallelizer.core.layout import Layout
from parallelizer.core.mesh import MeshSpec
from parallelizer.rewriter.spec import NodeSharding, ShardingSpec
from parallelizer.runtime.replicas import generator_groups


def _draws(*names: str) -> list[torch.fx.Node]:
    graph = torch.fx.Graph()
    return [graph.placeholder(name) for name in names]


def _spec(shape: dict, outputs: dict) -> ShardingSpec:
    mesh = MeshSpec(tuple(shape), tuple(shape.values()))
    nodes = {n: NodeSharding((Layout.parse(t),), Layout.parse(t)) for n, t in outputs.items()}
    return ShardingSpec(mesh, nodes, {})


@pytest.mark.parametrize("shape, outputs, groups", [
    ({"dp": 2}, {"drop": "S(0)"}, []),                        # ddp, batch-sharded: each rank its own piece
    ({"tp": 2}, {"drop": "R"}, [[0, 1]]),                     # a replicated draw: both ranks alike
    ({"tp": 2}, {"drop": "P"}, [[0, 1]]),                     # the summands of a Partial value: one mask
    ({"dp": 2, "tp": 2}, {"drop": "RS(1)"}, [[0, 2], [1, 3]]),  # copies over dp: the dp peers of each tp rank
    ({"dp": 2, "tp": 2}, {"drop": "S(0)R"}, [[0, 1], [2, 3]]),  # copies over tp: the tp group of each dp rank
    ({"dp": 2, "tp": 2}, {"drop": "S(1)S(0)"}, []),           # sharded on both axes
    ({"dp": 2, "tp": 2}, {"drop": "S(1)S(0)", "drop_1": "S(0)R"}, [[0, 1], [2, 3]]),  # every draw counts
    ({"dp": 2, "tp": 2}, {}, [[0, 1, 2, 3]]),                 # a draw without a layout (a mode traced again)
])
def test_ranks_that_must_draw_alike(shape, outputs, groups):
    names = list(outputs) or ["drop"]
    assert generator_groups(_spec(shape, outputs), _draws(*names)) == groups
