"""`trace`: model + example inputs -> `TracedGraph`, through torch.export (non-strict).

The graph is export's training IR: ATen ops with high-level ops kept whole (aten.linear, aten.layer_norm,
aten.scaled_dot_product_attention, aten.embedding), which is what per-op sharding rules are written for;
backward is left to autograd of the forward program (DESIGN.md rule 3). Two normalisations are applied and
recorded in `TracedGraph.notes`: shape-assertion nodes are dropped, a
`torch.no_grad()` region inside forward is inlined as a stop-gradient, and biases are split off linear
layers (see `normalize`).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import traceback
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import TraceError
from .blocks import find_repeated_blocks
from .normalize import normalize
from .graph import NodeInfo, ParamInfo, Role, TensorMeta, TracedGraph

_SCALAR_TYPES = (int, float, bool, type(None))


def trace(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None = None) -> TracedGraph:
    """Capture `model(*example_inputs, **example_kwargs)` as an ATen-level graph with node metadata.

    Args:
        model: any `torch.nn.Module`; its parameters may live on CPU or on the `meta` device (shapes only:
            nothing is allocated, so a 7B-parameter model traces in a few hundred MB).
        example_inputs: positional inputs (tensors, or nested tuples/lists/dicts of tensors and Python
            scalars). With a `meta` model, CPU tensors are moved to `meta` (recorded in `notes`).
        example_kwargs: keyword inputs, same rules.
    Returns:
        A `TracedGraph` (see its docstring for the per-node facts).
    Raises:
        TraceError: an input of an unsupported type, data-dependent control flow (a Python branch on a
            tensor value), or any other construct torch.export cannot capture; the message names the
            construct, the user's source file:line and a remedy.
    """
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"an object of type {type(model).__name__}", None,
                         "pass a torch.nn.Module (wrap a function in a Module whose forward calls it)")
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    example_kwargs = dict(example_kwargs or {})
    _check_input_types(example_inputs, example_kwargs)
    notes: list[str] = []
    if _on_meta(model):
        example_inputs, example_kwargs = pytree.tree_map_only(
            torch.Tensor, lambda t: t.to("meta"), (example_inputs, example_kwargs))
        notes.append("model is on the meta device: traced shapes only; example inputs moved to meta")
    exported = _export(model, example_inputs, example_kwargs)
    gm = exported.graph_module
    normalize(gm, notes)
    return _build(model, exported, gm, notes)


def _check_input_types(args: tuple, kwargs: dict) -> None:
    leaves, _ = pytree.tree_flatten_with_path((args, kwargs))
    for path, leaf in leaves:
        if not isinstance(leaf, (torch.Tensor, *_SCALAR_TYPES, str)):
            where = "inputs" + pytree.keystr(path)
            raise TraceError(
                f"an input of type {type(leaf).__qualname__} ({where})", None,
                "pass tensors, Python scalars, or tuples/lists/dicts of them; register custom containers "
                "with torch.utils._pytree.register_pytree_node")


def _on_meta(model: torch.nn.Module) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(t.device.type == "meta" for t in tensors)


def _export(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    """torch.export (non-strict). On failure torch prints graph dumps and warnings before raising; they are
    held back so that the TraceError is what the user reads (on success, captured output is passed on)."""
    captured, captured_err = io.StringIO(), io.StringIO()
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes_log.level
    shapes_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured_err):
            exported = torch.export.export(model, args, kwargs, strict=False)
    except Exception as exc:  # export raises many types; each is translated, the cause is kept
        raise _translate(exc) from exc
    finally:
        shapes_log.setLevel(level)
    sys.stdout.write(captured.getvalue())  # e.g. the user's own prints inside forward
    sys.stderr.write(captured_err.getvalue())
    return exported


def _translate(exc: Exception) -> TraceError:
    """Turn an export failure into a TraceError naming the construct and the user's file:line."""
    text = str(exc)
    location = _user_location(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if "data-dependent" in text or "GuardOnDataDependent" in type(exc).__name__:
        return TraceError(
            "data-dependent control flow (Python control flow on a tensor value)", location,
            "branch with torch.where or torch.cond instead of `if tensor:`, or compute the condition "
            "outside forward and pass it in as a Python value", detail=first)
    return TraceError(f"the model ({type(exc).__name__})", location,
                      "make forward traceable by torch.export(strict=False); see the cause above", detail=first)


def _user_location(exc: BaseException) -> str | None:
    """file:line of the innermost frame outside torch and this package, from the traceback."""
    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not f.filename.startswith(skip) and not f.filename.startswith("<")]
    if not user:
        return None
    return f"{user[-1].filename}:{user[-1].lineno}"


def _build(model: torch.nn.Module, exported: torch.export.ExportedProgram, gm: torch.fx.GraphModule,
           notes: list[str]) -> TracedGraph:
    sig = exported.graph_signature
    canonical = _canonical_names(model)
    module_types: dict[str, str] = {"": type(model).__qualname__}
    nodes: dict[str, NodeInfo] = {}
    user_outputs = {a.name for a in pytree.tree_leaves(gm.graph.output_node().args)
                    if isinstance(a, torch.fx.Node)}
    for node in gm.graph.nodes:
        role, fqn = _role(node, sig, user_outputs)
        module = _module_of(node, fqn, module_types)
        nodes[node.name] = NodeInfo(
            name=node.name, node=node, op=node.op,
            target=node.target if node.op == "call_function" else None, role=role,
            outputs=_tensor_metas(node.meta.get("val")), module_fqn=module,
            param_fqn=canonical.get(fqn, (fqn,))[0] if fqn else None)
    parameters = _parameters(model, gm, nodes, canonical)
    blocks = find_repeated_blocks(nodes, module_types)
    _tag_blocks(blocks, nodes, parameters)
    return TracedGraph(exported=exported, graph_module=gm, nodes=nodes, parameters=parameters,
                       blocks=blocks, input_names=tuple(sig.user_inputs), notes=notes)


def _canonical_names(model: torch.nn.Module) -> dict[str, tuple[str, bool]]:
    """Every FQN (aliases included) -> (canonical FQN, is_buffer); canonical = first name of the tensor."""
    first: dict[int, str] = {}
    out: dict[str, tuple[str, bool]] = {}
    for is_buffer, named in ((False, model.named_parameters(remove_duplicate=False)),
                             (True, model.named_buffers(remove_duplicate=False))):
        for fqn, tensor in named:
            out[fqn] = (first.setdefault(id(tensor), fqn), is_buffer)
    return out


def _role(node: torch.fx.Node, sig, user_outputs: set[str]) -> tuple[Role, str | None]:
    if node.op == "placeholder":
        if node.name in sig.inputs_to_parameters:
            return Role.PARAMETER, sig.inputs_to_parameters[node.name]
        if node.name in sig.inputs_to_buffers:
            return Role.BUFFER, sig.inputs_to_buffers[node.name]
        if node.name in sig.inputs_to_lifted_tensor_constants:
            return Role.BUFFER, sig.inputs_to_lifted_tensor_constants[node.name]
        return Role.INPUT, None
    if node.op == "output" or node.name in user_outputs:
        return Role.OUTPUT, None
    return Role.ACTIVATION, None


def _module_of(node: torch.fx.Node, fqn: str | None, module_types: dict[str, str]) -> str:
    if fqn is not None:
        return fqn.rpartition(".")[0]
    stack = node.meta.get("nn_module_stack") or {}
    path = ""
    for path, mtype in stack.values():
        module_types.setdefault(path, mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", str(mtype)))
    return path


def _tensor_metas(val: Any) -> tuple[TensorMeta, ...]:
    leaves = pytree.tree_leaves(val)
    return tuple(TensorMeta(tuple(int(d) for d in t.shape), t.dtype) for t in leaves if isinstance(t, torch.Tensor))


def _parameters(model: torch.nn.Module, gm: torch.fx.GraphModule, nodes: dict[str, NodeInfo],
                canonical: dict[str, tuple[str, bool]]) -> dict[str, ParamInfo]:
    order = {name: i for i, name in enumerate(nodes)}
    placeholders: dict[str, list[str]] = {}
    for info in nodes.values():
        if info.role in (Role.PARAMETER, Role.BUFFER) and info.param_fqn is not None:
            placeholders.setdefault(info.param_fqn, []).append(info.name)
    aliases: dict[str, list[str]] = {}
    for fqn, (canon, _) in canonical.items():
        if fqn != canon:
            aliases.setdefault(canon, []).append(fqn)
    out: dict[str, ParamInfo] = {}
    for fqn, phs in placeholders.items():
        uses = sorted({u.name for ph in phs for u in nodes[ph].node.users}, key=order.__getitem__)
        meta = nodes[phs[0]].outputs[0]
        out[fqn] = ParamInfo(fqn=fqn, aliases=tuple(aliases.get(fqn, ())), shape=meta.shape, dtype=meta.dtype,
                             placeholders=tuple(phs), uses=tuple(uses),
                             is_buffer=canonical.get(fqn, (fqn, True))[1])
    return out


def _tag_blocks(blocks, nodes: dict[str, NodeInfo], parameters: dict[str, ParamInfo]) -> None:
    for group in blocks:
        for index, (member, names) in enumerate(zip(group.members, group.nodes)):
            for position, name in enumerate(names):
                info = nodes[name]
                info.block, info.block_group, info.block_index, info.position = member, group.name, index, position
    for p in parameters.values():
        owners = {(nodes[u].block, nodes[u].block_group, nodes[u].block_index) for u in p.uses}
        if len(owners) == 1:
            p.block, p.block_group, p.block_index = owners.pop()
