"""Normalisations that make a trace independent of the device the model was traced on.

The CLI plans a model built on `meta` (shapes only); a user then applies the plan to the same model built on CPU
or GPU, and `auto_parallelize(plan=...)` / `parallelizer rehearse` check that the two traces are one graph, node
by node. torch.export records a few layout- and constant-handling ops only on some devices, so without these
passes the CLI's plans of GPT-2, Llama, OPT and Falcon did not fit the model they were made for (a
PlanMismatchError, or an UnsupportedOpError for a node the plan never saw):

- `aten.contiguous` (memory layout only) is recorded or not depending on the strides the device's kernels
  return (SDPA's output is contiguous after its transpose on CPU, not on meta): it is dropped
  (`drop_contiguous`);
- `aten.view` is valid only on some strides, so a model traced where `.contiguous()` was a no-op holds a view
  where a model traced elsewhere (another device, batch size or width: a transpose of one head is contiguous)
  needs a reshape after the dropped copy. Every `aten.view` becomes `aten.reshape` (`views_as_reshapes`),
  which is the same view wherever `view` works; its rule, cost and emitted op were already those of reshape
  (the sharded program emits reshape: a collective's result may have other strides than the trace);
- a tensor created inside forward (`torch.tensor([])`, the start of a transformers KV-cache layer; Falcon's
  `torch.tensor(...)` scale) is lifted to a constant input; on CPU export reads it through
  `aten.lift_fresh_copy` (a copy, so that the stored constant is never written), on meta it often reads the
  constant itself, and `torch.tensor`'s `detach_` then writes the constant (which kept a KV cache's dead
  `detach_` nodes alive on meta only). A copy nothing writes through is the constant, and `detach_` of a tensor
  that carries no gradient changes nothing: both are removed (`uncopied_constants`);
- a Python number that an op needs as a tensor (`s[:, 0] = start_id` in transformers' `shift_tokens_right`,
  `x[mask] = 0.0`) is wrapped in a 0-dim CPU constant on CPU (read through `lift_fresh_copy`, written with
  `fill_.Tensor` into a slice) and built with `aten.scalar_tensor` on other devices (meta, cuda; written into a
  slice as `copy_` of its `expand`). Both become `scalar_tensor(v)` where read as a tensor, and a slice
  assignment becomes `fill_.Scalar(dst, v)` (`wrapped_scalars`; the value is read from the CPU constant). Any
  other 0-dim tensor written into a slice (`x[:, 0] = h.sum()`, `torch.tensor(v, device=...)`; MBart's
  `shift_tokens_right` at batch 1, where the start token is a `squeeze`d gather) is `fill_.Tensor` on CPU and
  the same `copy_` of an `expand` elsewhere: it becomes `fill_.Tensor(dst, x)`;
- the nodes the devices record differently shift export's per-op counters in every later name (`expand_1` on
  meta where CPU has `expand`), so after normalisation every op node is renamed in graph order: the name
  export gave it without its `_N` suffix, then `_1`, `_2`, ... per name (`canonical_names`), and lifted
  constants are numbered 0, 1, ... in input order (`canonical_constants`).

Tests: tests/unit/test_device_free.py traces transformers models and one pattern per member on meta and on CPU
and compares the two graphs node by node, and the CPU program with eager.
"""
from __future__ import annotations

import re

import torch
import torch.fx
from torch.export.graph_signature import InputKind

from .graph import written_through

aten = torch.ops.aten


def views_as_reshapes(gm: torch.fx.GraphModule) -> int:
    """Retarget every `aten.view.default` node to `aten.reshape.default` (module docstring); returns how many."""
    views = list(gm.graph.find_nodes(op="call_function", target=aten.view.default))
    for node in views:
        node.target = aten.reshape.default
    return len(views)


def drop_contiguous(gm: torch.fx.GraphModule) -> int:
    """Drop `aten.contiguous` nodes (module docstring; run after `views_as_reshapes`, so that what reads the
    dropped copy through views accepts any strides). Kept when something writes in place through it, directly
    or through views (the copy must not alias). Returns how many were dropped."""
    dropped = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.contiguous.default)):
        if node.kwargs or written_through(node):
            continue  # a memory_format, or an in-place write through the copy must not reach the original: keep it
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
        dropped += 1
    return dropped


def uncopied_constants(gm: torch.fx.GraphModule) -> int:
    """Remove `aten.detach_(c)` of a graph input or constant copy that carries no gradient, then replace
    `aten.lift_fresh_copy(c)` by `c` when nothing writes through the copy (module docstring). Returns how many
    nodes were removed."""
    removed = 0
    for target, removable in ((aten.detach_.default, _no_grad_input), (aten.lift_fresh_copy.default, _unwritten)):
        for node in list(gm.graph.find_nodes(op="call_function", target=target)):
            if isinstance(node.args[0], torch.fx.Node) and removable(node):
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
                removed += 1
    return removed


def wrapped_scalars(gm: torch.fx.GraphModule, constants: dict[str, torch.Tensor]) -> int:
    """Rewrite the wrapped Python numbers of the module docstring in place; `constants`: placeholder name ->
    value of each lifted tensor constant (meta values are not read). Run after `views_as_reshapes` and before
    `uncopied_constants` (a wrapped number is a `lift_fresh_copy` that no `detach_` reads; `torch.tensor(v)` in
    forward adds a `detach_`). Returns how many nodes changed."""
    changed = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.lift_fresh_copy.default)):
        value = constants.get(getattr(node.args[0], "name", None))
        if value is None or value.dim() != 0 or value.is_meta or written_through(node) \
                or any(u.target is aten.detach_.default for u in node.users):
            continue
        with gm.graph.inserting_before(node):
            number = gm.graph.create_node("call_function", aten.scalar_tensor.default, (value.item(),), {
                "dtype": value.dtype, "layout": torch.strided, "device": value.device}, name="scalar_tensor")
        number.meta = dict(node.meta)
        node.replace_all_uses_with(number)
        gm.graph.erase_node(node)
        changed += 1
    for node in list(gm.graph.nodes):
        found = _fill_value(node)
        if found is None:
            continue
        value, chain = found
        number = value.args[0] if value.target is aten.scalar_tensor.default and len(value.users) == 1 else None
        target, arg = (aten.fill_.Tensor, value) if number is None else (aten.fill_.Scalar, number)
        if node.target is target:
            continue  # already fill_.Tensor(dst, x) of a computed or constant x
        with gm.graph.inserting_before(node):
            fill = gm.graph.create_node("call_function", target, (node.args[0], arg), name="fill_")
        fill.meta = dict(node.meta)
        node.replace_all_uses_with(fill)
        gm.graph.erase_node(node)
        for link in [*chain, *([value] if number is not None else [])]:  # expand, reshape, scalar_tensor: unread
            if not link.users:
                gm.graph.erase_node(link)
        changed += 1
    return changed


def _fill_value(node: torch.fx.Node):
    """(x, the nodes between x and `node`) when `node` writes one 0-dim value x into all of its destination:
    `fill_.Tensor(dst, x)`, or `copy_(dst, expand(reshape(x, []), dst's shape))` whose expand / reshape nothing
    else reads (torch's setitem on devices other than CPU); otherwise None."""
    if node.op != "call_function" or node.target not in (aten.fill_.Tensor, aten.copy_.default) \
            or len(node.args) != 2 or node.kwargs or not isinstance(node.args[1], torch.fx.Node):
        return None
    source, chain = node.args[1], []
    if node.target is aten.copy_.default:
        dst = node.args[0].meta.get("val")
        if source.target is not aten.expand.default or len(source.users) != 1 or not isinstance(dst, torch.Tensor) \
                or list(source.args[1]) != list(dst.shape):
            return None
        chain.append(source)
        source = source.args[0]
        if source.target is aten.reshape.default and len(source.users) == 1 and list(source.args[1]) == []:
            chain.append(source)
            source = source.args[0]
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 0:
        return None
    return source, chain


def canonical_constants(gm: torch.fx.GraphModule, exported: torch.export.ExportedProgram) -> int:
    """Renumber the lifted tensor constants `...lifted_tensor_N` 0, 1, 2, ... in input order (their targets in
    the signature and `exported.constants`, and their placeholders `c_..._lifted_tensor_N`): a constant that
    export lifted on one device only (a wrapped Python number on CPU) and normalisation removed left a gap that
    renamed every later constant. Run after `drop_unused_constants`. Returns how many were renamed."""
    pattern = re.compile(r"^(.*)lifted_tensor_(\d+)$")
    specs = [s for s in exported.graph_signature.input_specs
             if s.kind == InputKind.CONSTANT_TENSOR and pattern.match(s.target) and pattern.match(s.arg.name)]
    moves = []
    for index, spec in enumerate(specs):
        target = pattern.sub(rf"\g<1>lifted_tensor_{index}", spec.target)
        name = pattern.sub(rf"\g<1>lifted_tensor_{index}", spec.arg.name)
        if target != spec.target or name != spec.arg.name:
            moves.append((spec, target, name))
    placeholders = {n.name: n for n in gm.graph.find_nodes(op="placeholder")}
    values = {spec.target: exported.constants.pop(spec.target) for spec, _, _ in moves
              if spec.target in exported.constants}
    for spec, target, name in moves:
        if spec.target in values:
            exported.constants[target] = values[spec.target]
        node = placeholders[spec.arg.name]
        node.name = node.target = name  # `canonical_names` rebuilds the graph's namespace afterwards
        spec.target, spec.arg.name = target, name
    if moves:
        gm.recompile()
    return len(moves)


def canonical_names(gm: torch.fx.GraphModule, exported: torch.export.ExportedProgram) -> int:
    """Rename every call_function node in graph order (module docstring): its current name without a trailing
    `_N` is given to fx's name generator, which appends `_1`, `_2`, ... per name and avoids Python builtins
    (`sum` -> `sum_1`) exactly as when export named it. Placeholder and output names are kept; the exported
    program's output specs follow. Returns how many names changed."""
    namespace = torch.fx.graph._Namespace()  # fx's own (private) generator: a Graph has no public rename
    for node in gm.graph.nodes:
        if node.op != "call_function":
            namespace._used_names.add(node.name)
            namespace._obj_to_name[node] = node.name
    renamed = {}
    for node in [n for n in gm.graph.nodes if n.op == "call_function"]:
        name = namespace.create_name(re.sub(r"_\d+$", "", node.name) or node.name, node)
        if name != node.name:
            renamed[node.name] = name
            node.name = name
    gm.graph._graph_namespace = namespace
    for spec in exported.graph_signature.output_specs:
        if getattr(spec.arg, "name", None) in renamed:
            spec.arg.name = renamed[spec.arg.name]
    if renamed:
        gm.recompile()
    return len(renamed)


def _no_grad_input(node: torch.fx.Node) -> bool:
    source = node.args[0]
    val = source.meta.get("val")
    return (source.op == "placeholder" or source.target is aten.lift_fresh_copy.default) \
        and isinstance(val, torch.Tensor) and not val.requires_grad


def _unwritten(node: torch.fx.Node) -> bool:
    return not written_through(node)
