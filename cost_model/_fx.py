"""Small helpers shared by :mod:`cost_model.compute` and :mod:`cost_model.memory` for fx graphs and
meta/Fake tensors. Internal: the public API is re-exported by ``cost_model/__init__.py``."""

from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.fx
from torch.utils._pytree import tree_leaves, tree_map


def tensor_nbytes(t: torch.Tensor) -> int:
    """``numel * element_size`` of a (meta / Fake / real) tensor, in bytes.

    Raises:
        ValueError: the shape is symbolic; export with static shapes (no ``dynamic_shapes``).
    """
    try:
        return int(t.numel()) * t.element_size()
    except (TypeError, RuntimeError) as exc:
        raise ValueError(
            f"tensor of shape {tuple(t.shape)} has a symbolic size; the cost model needs concrete shapes. "
            "Remedy: export without dynamic_shapes or pass torch.empty(shape, device='meta')."
        ) from exc


def tensors_in(tree: Any) -> list[torch.Tensor]:
    """All tensors in a nested structure of args / kwargs / outputs, in pytree order. (`tree_leaves`, the leaves
    `tree_flatten` returns: its recursive helper closure is a reference cycle per call, garbage for the collector,
    ~11k per 2x2 Llama plan; round 26, r26a.)"""
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


_META = torch.device("meta")


def to_meta(tree: Any) -> Any:
    """Replace every tensor in ``tree`` by an uninitialised meta tensor of the same shape, stride, dtype, and
    every device argument (a ``torch.device``, or the value of a ``device`` keyword) by the meta device.

    Device arguments matter because an op run on meta tensors that names a real device (``x.to(x.device,
    torch.float32)`` exports as ``aten.to.device(x, device(type='cpu'), ...)``; ``new_ones(..., device=...)``)
    would copy out of a meta tensor, which has no data (NotImplementedError).
    """
    def convert(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
        if isinstance(x, torch.device):
            return _META
        return x
    out = tree_map(convert, tree)
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) and out[1].get("device") is not None:
        out = (out[0], {**out[1], "device": _META})  # (args, kwargs) with device="cuda:0" given as a string
    return out


def node_values(node: torch.fx.Node) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    """``(args, kwargs, out)`` of a call_function node with each input node replaced by its ``meta["val"]``.

    Raises:
        ValueError: an input or the node itself has no ``meta["val"]`` (graph not from torch.export /
            make_fx with fake tensors); names the node.
    """
    def value_of(x: Any) -> Any:
        if isinstance(x, torch.fx.Node):
            if "val" not in x.meta:
                raise ValueError(f"node {x.format_node()} has no meta['val']; trace with torch.export or "
                                 "make_fx(tracing_mode='fake') so nodes carry FakeTensors")
            return x.meta["val"]
        return x
    args = tuple(tree_map(value_of, list(node.args)))
    kwargs = tree_map(value_of, dict(node.kwargs))
    return args, kwargs, value_of(node)


def op_nodes(graph_module: torch.fx.GraphModule) -> Iterator[torch.fx.Node]:
    """The call_function nodes whose target is an ATen ``OpOverload`` (skips getitem, higher-order ops)."""
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            yield node
