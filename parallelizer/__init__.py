"""parallelizer: trace a PyTorch model, price it, plan hybrid sharding with an ILP, emit sharded programs.

Public API (see README.md):
    trace(model, example_inputs, example_kwargs=None) -> TracedGraph
"""
from .errors import InfeasiblePlanError, ParallelizerError, PlanMismatchError, TraceError, UnsupportedOpError
from .tracer import BlockGroup, NodeInfo, ParamInfo, Role, TensorMeta, TracedGraph, trace

__all__ = [
    "trace", "TracedGraph", "NodeInfo", "ParamInfo", "BlockGroup", "Role", "TensorMeta",
    "ParallelizerError", "TraceError", "UnsupportedOpError", "InfeasiblePlanError", "PlanMismatchError",
]
