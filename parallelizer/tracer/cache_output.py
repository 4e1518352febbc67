"""Tracing a model with its own `use_cache` setting: the cache object is dropped from the OUTPUT, not turned off.

transformers models whose config says `use_cache=True` (the default of generative models) build a key/value
cache (DynamicCache, EncoderDecoderCache, a hybrid or state-space cache) in a training forward and return it;
a training step never reads it and export cannot return it. Turning the setting off while tracing changed the
computed function: transformers' masks detect packed sequences (`position_ids` restarting inside a row) only
when `attention_mask is None and cache is None` (masking_utils `_preprocess_mask_arguments`), so the traced
graph masked across packed sequences that the user's model attends across (logits 0.21 off on the packed row,
on every mesh and on one device; round 10a). So the model is traced as the user calls it, and only the cache
object is removed from what forward returns (`cache_dropped`); what building the cache added to the graph is
normalised away afterwards:

- `drop_empty_cat_operands`: a fresh cache layer starts from `torch.tensor([])` and `update` returns
  `cat([empty, k], -2)`: an operand with no elements that `cat` skips is removed, and a `cat` left with one
  operand is that operand;
- `drop_dead_code`: ops whose results reach no output and that write nothing an output or a parameter, buffer
  or input reads (the cache's `lift_fresh_copy` + `detach_` of its empty constant, a state cache's `zeros`
  + `copy_`) are removed; ops drawing random numbers are kept (removing one would shift later draws);
- `drop_unused_constants`: a lifted tensor constant no op reads any more is removed from the program and its
  signature.
"""
from __future__ import annotations

import contextlib
import functools
import operator
import sys
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import InputKind

from .graph import alias_source, mutated_args, returns_written, written_through


def is_cache(value: Any) -> bool:
    """Whether `value` is a key/value or state cache object: a `transformers.cache_utils.Cache` (when
    transformers is loaded), or any other non-container object whose class name ends with "Cache"."""
    if value is None or isinstance(value, (torch.Tensor, tuple, list, dict, str, int, float, bool)):
        return False
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is not None and isinstance(value, getattr(cache_utils, "Cache", ())):
        return True
    return type(value).__name__.endswith("Cache")


def without_cache(output: Any) -> Any:
    """`output` with its cache objects removed, at any depth: a transformers `ModelOutput` rebuilt without the
    cache field (the structure forward returns with use_cache=False, whose `to_tuple` skips None fields), a
    tuple or list without its cache elements, a dict without cache values; containers holding none are
    returned as they are (the same object). Nested: a composite model's output holds its language model's
    (InstructBLIP's and BLIP-2's `language_model_outputs`, with `return_dict=False` a tuple in the tuple),
    whose cache export could not return (a TraceError under the default use_cache=True)."""
    model_output = getattr(sys.modules.get("transformers.utils"), "ModelOutput", None)
    if model_output is not None and isinstance(output, model_output):
        kept = {k: without_cache(v) for k, v in output.items() if not is_cache(v)}
        if len(kept) == len(output) and all(kept[k] is v for k, v in output.items()):
            return output
        return type(output)(**kept)
    if isinstance(output, (tuple, list)):
        kept = [without_cache(v) for v in output if not is_cache(v)]
        if len(kept) == len(output) and all(a is b for a, b in zip(kept, output)):
            return output
        return type(output)(*kept) if hasattr(output, "_fields") else type(output)(kept)
    if isinstance(output, dict):
        kept = {k: without_cache(v) for k, v in output.items() if not is_cache(v)}
        if len(kept) == len(output) and all(kept[k] is v for k, v in output.items()):
            return output
        return type(output)(kept)
    return output


@contextlib.contextmanager
def cache_dropped(model: torch.nn.Module, notes: list[str] | None = None):
    """While inside, `model(...)` returns `without_cache(output)` (the instance's `forward` is wrapped, with
    its signature, and restored after). A note is added when forward returned a cache object."""
    original = model.__dict__.get("forward")
    bound = model.forward
    dropped = []

    @functools.wraps(bound)
    def forward(*args, **kwargs):
        output = bound(*args, **kwargs)
        stripped = without_cache(output)
        if stripped is not output:
            dropped.append(type(output).__name__)
        return stripped

    model.forward = forward
    try:
        yield
    finally:
        if original is None:
            del model.forward
        else:
            model.forward = original
    if dropped and notes is not None:
        notes.append(f"traced with the model's own use_cache setting; the cache object forward returns (in "
                     f"{dropped[0]}) is dropped from the traced output: a training step does not read it, and "
                     "building it adds no op to the traced graph (empty cat operands and dead code removed)")


def drop_empty_cat_operands(gm: torch.fx.GraphModule) -> int:
    """Remove the `aten.cat` operands with no elements that cat skips (1-D of size 0, or size 0 along the
    cat dimension) and of the result's dtype; a cat left with one operand of the result's shape is replaced by
    it, unless something writes in place through the result or that operand. Returns how many cats changed."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
            continue
        operands, dim = node.args[0], (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0))
        out = node.meta.get("val")
        if not isinstance(out, torch.Tensor):
            continue
        kept = [a for a in operands if not _skipped_by_cat(a, dim, out)]
        if len(kept) == len(operands) or not kept:
            continue
        if len(kept) == 1 and isinstance(kept[0], torch.fx.Node) and _same_shape(kept[0], out) \
                and not written_through(node) and not written_through(kept[0]):
            node.replace_all_uses_with(kept[0])
            gm.graph.erase_node(node)
        else:
            node.args = (kept, *node.args[1:])
        changed += 1
    return changed


def _skipped_by_cat(arg: Any, dim: int, out: torch.Tensor) -> bool:
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dtype != out.dtype or val.numel() != 0:
        return False
    return tuple(val.shape) == (0,) or (val.dim() == out.dim() and val.shape[dim] == 0)


def _same_shape(node: torch.fx.Node, out: torch.Tensor) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and tuple(val.shape) == tuple(out.shape) and val.dtype == out.dtype


def drop_dead_code(gm: torch.fx.GraphModule) -> int:
    """Erase the call_function nodes whose values reach no output and that write no storage a kept node reads
    or a placeholder owns (module docstring). Nodes that are no ATen op (higher-order ops) and ops drawing
    random numbers are always kept. Returns how many nodes were erased."""
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:  # the storage each value lives in: views and in-place results alias their input
        first = node.args[0] if node.op == "call_function" and node.args else None
        source = alias_source(node) or (first if isinstance(first, torch.fx.Node) and returns_written(node) else None)
        root[node] = root[source] if source is not None else node  # einsum('ij->ij', h): h's storage (r18h)
    live: set[torch.fx.Node] = set()
    read_roots: set[torch.fx.Node] = set()
    for node in reversed(gm.graph.nodes):
        written = {root[node.args[i]] for i in mutated_args(node)
                   if i < len(node.args) and isinstance(node.args[i], torch.fx.Node)}
        keep = (node.op != "call_function" or any(u in live for u in node.users)
                or not (isinstance(node.target, torch._ops.OpOverload) or node.target is operator.getitem)
                or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
                or any(r in read_roots or r.op != "call_function" for r in written))
        if keep:
            live.add(node)
            read_roots.update(root[a] for a in node.all_input_nodes)
    dead = [n for n in gm.graph.nodes if n not in live]
    for node in reversed(dead):
        gm.graph.erase_node(node)
    return len(dead)


def drop_unused_constants(exported: torch.export.ExportedProgram) -> int:
    """Remove the lifted tensor constants that no node reads (placeholder, input spec and stored value) from
    `exported`, whose graph module was normalised in place. Returns how many were removed."""
    gm = exported.graph_module
    unused = {n.name: n for n in gm.graph.find_nodes(op="placeholder") if not n.users}
    specs = exported.graph_signature.input_specs
    removed = [s for s in specs if s.kind == InputKind.CONSTANT_TENSOR and s.arg.name in unused]
    for spec in removed:
        specs.remove(spec)
        exported.constants.pop(spec.target, None)
        gm.graph.erase_node(unused[spec.arg.name])
    return len(removed)
