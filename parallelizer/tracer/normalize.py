"""Graph normalisations applied right after export, each recorded in `TracedGraph.notes`.

1. Shape-assertion nodes (`_assert_tensor_metadata` and friends: no outputs, no users) are dropped.
2. A `torch.no_grad()` / `torch.enable_grad()` region inside forward (exported as a call of the
   `wrap_with_set_grad_enabled` higher-order op on a submodule) is inlined; the outputs of a no-grad region
   go through `aten.detach`, so the region stays a stop-gradient.
3. Biases are split off linear layers: `aten.linear(x, W, b)` becomes `aten.add(aten.linear(x, W), b)` and
   `aten.addmm(b, x, W)` becomes `aten.add(aten.mm(x, W), b)`. Sharding rules then see the bias as its own
   use: under row-parallel tensor parallelism the matmul's output is Partial and the bias is added once,
   after the all-reduce (adding it inside the matmul would add it once per rank).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import TraceError

_ASSERT_OPS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}
_COPIED_META = ("nn_module_stack", "stack_trace", "torch_fn")


def normalize(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Apply the normalisations of the module docstring to `gm` in place and recompile it."""
    _drop_asserts(gm, notes)
    _inline_grad_regions(gm, notes)
    _split_biases(gm, notes)
    gm.graph.lint()
    gm.recompile()


def _drop_asserts(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _ASSERT_OPS and not node.users:
            gm.graph.erase_node(node)
            dropped += 1
    if dropped:
        notes.append(f"dropped {dropped} shape-assertion node(s)")


def _inline_grad_regions(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Inline `wrap_with_set_grad_enabled(enabled, submod, *args)` calls; detach outputs when disabled."""
    hop = torch.ops.higher_order.wrap_with_set_grad_enabled
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not hop:
            continue
        enabled, sub_attr, *operands = node.args
        sub = gm.get_submodule(sub_attr.target)
        env: dict[torch.fx.Node, Any] = dict(zip(
            [n for n in sub.graph.nodes if n.op == "placeholder"], operands))
        outputs: tuple = ()
        with gm.graph.inserting_before(node):
            for sn in sub.graph.nodes:
                if sn.op == "placeholder":
                    continue
                if sn.op == "output":
                    outputs = tuple(env[o] for o in pytree.tree_leaves(sn.args[0]))
                    break
                if sn.op == "get_attr":
                    raise TraceError("a constant inside a grad-mode region", _stack_location(sn),
                                     "move the constant out of the torch.no_grad() block")
                env[sn] = gm.graph.node_copy(sn, lambda n: env[n])
            if not enabled:
                outputs = tuple(_detach(gm, o) for o in outputs)
        for user in list(node.users):
            user.replace_all_uses_with(outputs[user.args[1]])
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        if not sub_attr.users:
            gm.graph.erase_node(sub_attr)
            delattr(gm, sub_attr.target)
        ops = [n for n in sub.graph.nodes if n.op == "call_function"]
        if not ops:  # an empty region (e.g. the tail of a reentrant checkpoint): nothing was inlined
            continue
        where = _stack_location(ops[0])
        notes.append(f"inlined a torch.{'enable_grad' if enabled else 'no_grad'}() region"
                     f"{' at ' + where if where else ''}" + ("" if enabled else " (its outputs are detached)"))


def _detach(gm: torch.fx.GraphModule, value: torch.fx.Node) -> torch.fx.Node:
    out = gm.graph.call_function(torch.ops.aten.detach.default, (value,))
    out.meta = _meta_like(value)
    out.meta["val"] = value.meta["val"].detach()
    return out


def _stack_location(node: torch.fx.Node) -> str | None:
    """file:line of the last frame of a node's recorded stack trace."""
    trace_text = node.meta.get("stack_trace") or ""
    frames = [ln.strip() for ln in trace_text.splitlines() if ln.strip().startswith("File ")]
    if not frames:
        return None
    parts = frames[-1].split('"')
    line = frames[-1].split("line ")[-1].split(",")[0]
    return f"{parts[1]}:{line}" if len(parts) > 1 else None


def _split_biases(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    aten = torch.ops.aten
    split = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.linear.default and len(node.args) > 2 and node.args[2] is not None:
            x, weight, bias = node.args
            matmul = (aten.linear.default, (x, weight))
        elif node.target is aten.addmm.default and not node.kwargs:
            bias, x, weight = node.args
            matmul = (aten.mm.default, (x, weight))
        else:
            continue
        with gm.graph.inserting_before(node):
            product = gm.graph.call_function(*matmul)
            product.meta = _meta_like(node)
            total = gm.graph.call_function(aten.add.Tensor, (product, bias))
            total.meta = _meta_like(node)
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
        split += 1
    if split:
        notes.append(f"split the bias off {split} linear layer(s) (linear/addmm -> matmul + add)")


def _meta_like(node: torch.fx.Node) -> dict[str, Any]:
    meta = {k: v for k, v in node.meta.items() if k in _COPIED_META}
    meta["val"] = node.meta["val"]
    return meta
