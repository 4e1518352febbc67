"""Hand-written sharding specs used as baselines (benchmarks against torch's DDP, rewriter tests).

Plans normally come from the planner; these exist to compare our emitted programs with torch's own data
parallelism on exactly the same decisions.
"""
from __future__ import annotations

from ..core.layout import Layout
from ..core.mesh import MeshSpec
from ..tracer.graph import Role, TracedGraph
from .apply import _tensor_args
from .spec import NodeSharding, ShardingSpec

_S0, _R = Layout.parse("S(0)"), Layout.parse("R")


def batch_parallel_spec(traced: TracedGraph, mesh: MeshSpec, zero3: bool = False) -> ShardingSpec:
    """Data parallelism on a 1-D mesh: user inputs and every op whose output keeps the batch dim (dim 0 of
    the first input's size) are batch-sharded S(0), everything else replicated; parameters stored
    replicated (DDP: one gradient all-reduce per use) or, with `zero3`, sharded S(0) and all-gathered for
    use (ZeRO-3: reduce-scatter in backward); the model's outputs are replicated (gathered)."""
    batch = traced.node(traced.input_names[0]).outputs[0].shape[0]
    nodes, layout = {}, {name: _S0 for name in traced.input_names}
    for n in traced.graph_module.graph.nodes:
        args = _tensor_args(n)
        if n.op == "call_function":
            sharded = any(layout.get(a.name) == _S0 for a in args)
            out = traced.node(n.name).outputs
            layout[n.name] = _S0 if sharded and out and out[0].shape[:1] == (batch,) else _R
            ins = tuple(_R if traced.node(a.name).role in (Role.PARAMETER, Role.BUFFER) else layout[a.name]
                        for a in args)
            nodes[n.name] = NodeSharding(ins, layout[n.name])
        elif n.op == "output":
            nodes[n.name] = NodeSharding(tuple(_R for _ in args), _R)
    return ShardingSpec(mesh, nodes, {f: (_S0 if zero3 else _R) for f in traced.parameters})
