"""Pointwise fusion: which elementwise ops a compiler would fuse into one kernel, for pricing memory traffic.

Assumption (stated, not measured here): on a GPU the training step runs under ``torch.compile``, whose
inductor backend fuses a chain of elementwise ops into one kernel that reads each input of the chain once
from memory and writes only the values that leave the chain (PyTorch 2 paper, Ansel et al., ASPLOS'24,
Sec. 5: "pointwise and reduction fusion"). The rules here:

* a **pointwise op** is an ATen op tagged ``torch.Tag.pointwise`` (add, mul, gelu, silu, rsqrt, where, ...)
  or a dtype cast (``_to_copy``, ``to`` when it copies);
* the output of a pointwise op stays **inside the chain** (never written to memory) when every op that reads
  it, directly or through views (``is_free_op``), is pointwise; a graph output, a reduction, a matmul or any
  other op reading it makes it leave the chain (written once);
* an argument of a pointwise op is **read from the chain** (no memory read) when it is, through views, the
  output of a pointwise op inside the chain, or a value the chain already read from memory (a chain reads
  each of its inputs once: ``x * sigmoid(x)`` reads x once);
* only ops whose output leaves the chain launch a kernel (one launch per chain).

An output read by several pointwise consumers stays inside the chain (inductor fuses them into one kernel or
recomputes the value). A redistribution between two pointwise ops (a collective) is priced as its own
traffic and does not break the assumption's accounting of the ops. Backward keeps the forward's ratio
(``cost_model.compute``: backward bytes = 2x forward bytes), i.e. the backward chain is fused alike.
Saved activations are not changed by fusion (``cost_model.memory`` keeps eager autograd's rules: an upper
bound, since inductor's partitioner may recompute cheap pointwise values instead of saving them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from cost_model._fx import node_values, op_nodes
from cost_model.compute import is_free_op

__all__ = ["FusedIO", "is_pointwise", "pointwise_fusion"]

aten = torch.ops.aten
_CASTS = frozenset({aten._to_copy, aten.to})


@dataclass(frozen=True, slots=True)
class FusedIO:
    """How one pointwise op sits in a fused chain (module docstring).

    Attributes:
        fused_args: positional argument indices read from the chain (not from memory).
        output_fused: the output stays in the chain: not written, and the op launches no kernel of its own.
    """

    fused_args: frozenset[int] = frozenset()
    output_fused: bool = False


def is_pointwise(target: object) -> bool:
    """True for an ATen op tagged ``torch.Tag.pointwise`` or a dtype cast (module docstring)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.pointwise in target.tags or target.overloadpacket in _CASTS


def _is_view(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    args, kwargs, out = node_values(node)
    return is_free_op(node.target, args, out, kwargs)


def _readers(node: torch.fx.Node, views: dict[str, bool]) -> list[torch.fx.Node]:
    """The nodes that read `node`'s value, looking through views."""
    out: list[torch.fx.Node] = []
    for user in node.users:
        if views.get(user.name, False):
            out += _readers(user, views)
        else:
            out.append(user)
    return out


def _root(node: torch.fx.Node, views: dict[str, bool]) -> torch.fx.Node:
    """Follow views back to the node that computed the value."""
    while views.get(node.name, False) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def pointwise_fusion(graph_module: torch.fx.GraphModule) -> dict[str, FusedIO]:
    """`FusedIO` of every pointwise op of a forward graph whose fusion changes its traffic (module docstring);
    ops absent from the result are priced unfused. Nodes need ``meta["val"]`` (graphs from torch.export).

    Raises:
        ValueError: a node lacks ``meta["val"]``.
    """
    views = {n.name: _is_view(n) for n in op_nodes(graph_module)}
    pointwise = {n.name for n in op_nodes(graph_module) if is_pointwise(n.target) and not views[n.name]}
    inside = set()
    for node in op_nodes(graph_module):
        if node.name in pointwise:
            readers = _readers(node, views)
            if readers and all(r.name in pointwise for r in readers):
                inside.add(node.name)
    chain_of: dict[str, str] = {}  # pointwise node -> its chain (the name of the chain's first node)
    read: dict[str, set[str]] = {}  # chain -> values it already read from memory
    result: dict[str, FusedIO] = {}
    for node in op_nodes(graph_module):
        if node.name not in pointwise:
            continue
        roots = [(i, _root(a, views)) for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node)]
        producers = {chain_of[r.name] for _, r in roots if r.name in inside}
        chain = min(producers) if producers else node.name
        for other in producers - {chain}:  # two chains meet here: one kernel from now on
            read.setdefault(chain, set()).update(read.pop(other, set()))
            chain_of.update({n: chain for n, c in chain_of.items() if c == other})
        chain_of[node.name] = chain
        seen = read.setdefault(chain, set())
        fused_args = set()
        for i, r in roots:
            if r.name in inside or r.name in seen:
                fused_args.add(i)  # from the chain, or read once already by the chain's kernel
            seen.add(r.name)
        io = FusedIO(frozenset(fused_args), node.name in inside)
        if io != FusedIO():
            result[node.name] = io
    return result
