"""Tracing: model + example inputs -> `TracedGraph` (torch.export, non-strict)."""
from .graph import BlockGroup, NodeInfo, ParamInfo, Role, TensorMeta, TracedGraph
from .trace import trace

__all__ = ["trace", "TracedGraph", "NodeInfo", "ParamInfo", "BlockGroup", "Role", "TensorMeta"]
