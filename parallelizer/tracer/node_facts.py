"""Facts about one fx node or value of a traced graph, read by every stage after the trace: whether a dtype carries
a gradient (`carries_grad`), complex values as real pairs (`as_real`), what an op writes in place (`mutated_args`,
`returns_written`, `written_through`), what it may alias (`is_view`, `may_alias`, `alias_source`), whether it
draws random numbers (`draws_random`, `drawing_ops`), the ambient autocast state (`ambient_autocast`), and the metadata a
replacing node keeps (`meta_like`) and the user's source line of a node (`stack_location`).

Moved out of `tracer.graph` (round 21 review: 708 lines), which re-exports them; `tracer.graph` keeps the
`TracedGraph` data classes and the checks of a call's inputs against the traced ones.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx


def carries_grad(dtype: torch.dtype) -> bool:
    """Whether autograd can carry a gradient through a tensor of `dtype`: floating AND complex dtypes (a
    value that passes through complex tensors, e.g. a complex rotary embedding's view_as_complex -> mul ->
    view_as_real, still has a gradient). Every "does a gradient flow here" decision of the planner, the
    rewriter and the pipeline runtime uses this: with `dtype.is_floating_point` alone the gradient chain
    was cut at the first complex value, and the Megatron f (gradient all-reduce) of a replicated value
    feeding a sharded op downstream was not emitted (silent gradient mismatch)."""
    return dtype.is_floating_point or dtype.is_complex


def as_real(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as the real tensor of its (real, imaginary) pairs (`torch.view_as_real`: one more
    trailing dim of 2, no copy); any other tensor unchanged. Every comparison, checksum and collective of
    values that may be complex goes through this: `.double()` / `.float()` of a complex tensor keeps only its
    real part (torch warns once, then stays silent), so a rehearsal judged 1+1j against 1+5j a match and the
    global gradient norm of complex (FNO spectral) weights left out their imaginary parts; gloo's all-to-all
    has no complex types. Sums and differences of the pairs are those of the complex values."""
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


# composites whose schema hides a mutation: the running statistics of batch_norm and instance_norm
_HIDDEN_MUTATIONS = {torch.ops.aten.batch_norm.default: (3, 4), torch.ops.aten.instance_norm.default: (3, 4)}


def mutated_args(node: torch.fx.Node) -> list[int]:
    """Positions of the arguments an op writes in place: schema alias annotations `Tensor(a!)` (add_, fill_,
    copy_, index_put_, ...) and the running statistics of batch_norm and instance_norm (composites whose schema
    does not say so)."""
    if node.op != "call_function":
        return []
    if node.target in _HIDDEN_MUTATIONS:
        return list(_HIDDEN_MUTATIONS[node.target])
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


_NO_DRAW_WHEN = ("p", "dropout_p", "dropout", "train", "training")  # arguments whose 0 / False means no draw


def draws_random(node: torch.fx.Node) -> bool:
    """Whether a traced op draws from torch's random generator: its ATen schema is tagged
    `nondeterministic_seeded` (dropout, bernoulli, rand*, normal, multinomial, randperm, scaled_dot_product_attention,
    the RNNs, rrelu_with_noise, ...) and none of its dropout-probability or train arguments (`p`, `dropout_p`,
    `dropout`, `train`, `training`) is 0 or False in this call (SDPA with dropout_p=0, eval-mode dropout)."""
    target = node.target if node.op == "call_function" else None
    if torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()):
        return False
    for i, argument in enumerate(target._schema.arguments):
        if argument.name in _NO_DRAW_WHEN:
            value = node.args[i] if i < len(node.args) and not argument.kwarg_only else node.kwargs.get(
                argument.name, argument.default_value if argument.has_default_value() else None)
            if isinstance(value, (bool, int, float)) and not value:
                return False
    return True


def drawing_ops(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes of `graph_module` that draw from torch's random generator (`draws_random`), in graph order."""
    return [node for node in graph_module.graph.nodes if draws_random(node)]


def op_label(node: torch.fx.Node) -> str:
    """'node (op)', e.g. 'dropout (dropout.default)': how messages name a traced op."""
    return f"{node.name} ({getattr(node.target, '__name__', node.target)})"

def returns_written(node: torch.fx.Node) -> bool:
    """True for an in-place op returning the tensor it wrote (`add_`, `mul_`: `Tensor(a!) self -> Tensor(a!)`)."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None
                and schema.returns[0].alias_info.is_write)


def is_view(node: torch.fx.Node) -> bool:
    """True for an op whose output aliases its first input (view, select, slice, transpose, split and the
    getitems of a split, ...): writing the output writes the input."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return is_view(node.args[0])
    schema = getattr(node.target, "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None
                and not schema.returns[0].alias_info.is_write)


# Ops whose schema declares a fresh result (no alias annotation) but which return their input, or a view of
# it, for some arguments (checked in eager on torch 2.13 by tests/unit/test_reshard_aliases.py):
# einsum('ii->i') is a diagonal view, einsum('ij->ji') a transpose; type_as to the same dtype, atleast_Nd of a
# tensor with >= N dims, sum_to_size to the same size and dropout / feature_dropout / alpha_dropout in eval
# (or p=0) return the input itself; unsafe_chunk / unsafe_split return views.
UNDECLARED_ALIASES = frozenset({
    torch.ops.aten.einsum, torch.ops.aten.type_as, torch.ops.aten.atleast_1d, torch.ops.aten.atleast_2d,
    torch.ops.aten.atleast_3d, torch.ops.aten.sum_to_size, torch.ops.aten.dropout, torch.ops.aten.feature_dropout,
    torch.ops.aten.alpha_dropout, torch.ops.aten.feature_alpha_dropout, torch.ops.aten.unsafe_chunk,
    torch.ops.aten.unsafe_split})


def may_alias(node: torch.fx.Node) -> bool:
    """True when `node`'s output may share storage with a tensor argument: a declared view (`is_view`) or an
    op of `UNDECLARED_ALIASES` (a getitem of one included)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], torch.fx.Node) and may_alias(node.args[0])
    return is_view(node) or getattr(node.target, "overloadpacket", None) in UNDECLARED_ALIASES


# Device types whose torch.autocast state a trace records (torch.amp.is_autocast_available is True for each, torch 2.13).
AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")


def ambient_autocast() -> tuple[tuple[str, torch.dtype], ...]:
    """((device type, dtype), ...) of the torch.autocast contexts enabled now, over `AUTOCAST_DEVICES`."""
    return tuple((d, torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICES if torch.is_autocast_enabled(d))


def alias_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The argument whose storage `node`'s output may share, or None for a fresh result: the first argument of a
    declared view (`is_view`) or of an op of `UNDECLARED_ALIASES` (einsum: its operand when it has one; with two
    or more the result is a fresh contraction), the tuple node of a getitem of one. Code that follows a write
    back to the tensor it reaches (in-place ops on a placeholder, on a fresh activation) walks this, not
    `is_view`: `F.dropout(h, 0.0, False).relu_()`, `torch.atleast_1d(buf).mul_(0.9)` and
    `torch.einsum('ij->ij', h).add_(1)` write `h` / `buf` in eager torch 2.13 (r18h)."""
    if node.op != "call_function" or not may_alias(node):
        return None
    if node.target is getattr(torch.ops.aten.einsum, "default", None):
        operands = node.args[1] if len(node.args) > 1 else node.kwargs.get("tensors", ())
        return operands[0] if len(operands) == 1 and isinstance(operands[0], torch.fx.Node) else None
    first = node.args[0] if node.args else None
    return first if isinstance(first, torch.fx.Node) else None


def written_through(node: torch.fx.Node) -> bool:
    """Whether an op writes `node`'s value in place, directly or through its views (or through the results of
    in-place ops on it)."""
    todo = [node]
    while todo:
        value = todo.pop()
        for user in value.users:
            if any(i < len(user.args) and user.args[i] is value for i in mutated_args(user)):
                return True
            if alias_source(user) is value or returns_written(user):
                todo.append(user)
    return False


COPIED_META = ("nn_module_stack", "stack_trace", "torch_fn", "custom")  # custom: user checkpoint regions (trace)


def meta_like(node: torch.fx.Node) -> dict[str, Any]:
    """The metadata a node that replaces `node` keeps: its value (`val`) and COPIED_META (source location, module
    stack, user checkpoint regions)."""
    meta = {k: v for k, v in node.meta.items() if k in COPIED_META}
    meta["val"] = node.meta["val"]
    return meta


def stack_location(node: torch.fx.Node) -> str | None:
    """file:line of the last frame of a node's recorded stack trace."""
    trace_text = node.meta.get("stack_trace") or ""
    frames = [ln.strip() for ln in trace_text.splitlines() if ln.strip().startswith("File ")]
    if not frames:
        return None
    parts = frames[-1].split('"')
    line = frames[-1].split("line ")[-1].split(",")[0]
    return f"{parts[1]}:{line}" if len(parts) > 1 else None
