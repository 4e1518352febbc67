"""parallelizer: trace a PyTorch model, price it, plan hybrid sharding with an ILP, emit sharded programs.

Public API (see README.md):
    trace(model, example_inputs, example_kwargs=None) -> TracedGraph
    plan(traced, mesh, *, cluster=None, topology=None, config=None, **options) -> Plan
    explain(traced, plan, node, ...) -> Explanation
"""
from .errors import InfeasiblePlanError, ParallelizerError, PlanMismatchError, TraceError, UnsupportedOpError
from .tracer import BlockGroup, NodeInfo, ParamInfo, Role, TensorMeta, TracedGraph, trace
from .config import PlanConfig
from .core import Layout, MeshSpec
from .planner import Plan, explain, plan

__all__ = [
    "trace", "TracedGraph", "NodeInfo", "ParamInfo", "BlockGroup", "Role", "TensorMeta",
    "plan", "explain", "Plan", "PlanConfig", "MeshSpec", "Layout",
    "ParallelizerError", "TraceError", "UnsupportedOpError", "InfeasiblePlanError", "PlanMismatchError",
]
