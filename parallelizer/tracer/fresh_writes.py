"""Normalisation 5 of `tracer.normalize` (see its docstring): an in-place op writing a FRESH activation becomes its
out-of-place form, and the readers of the written value after the write read the new result. The out-of-place
overload must give the same shape and dtype (`_same_result`, on fake tensors) and have a derivative where the
program needs one (`_has_derivative`: aten.copy and aten.resize_as have none; a same-shape `copy_` becomes a
clone or cast of its source, `_copy_as_clone`)."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from .graph import alias_source, meta_like as _meta_like, mutated_args, returns_written

def out_of_place_fresh_writes(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Normalisation 5 (module docstring): `op_(fresh, ...)` -> `op(fresh, ...)`, later readers redirected."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    rewritten: dict[str, int] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or mutated_args(node) != [0] or not returns_written(node):
            continue
        base = node.args[0]
        if not (isinstance(base, torch.fx.Node) and _fresh(base)
                and not any(alias_source(u) is base for u in base.users)):
            continue
        if node.target is torch.ops.aten.copy_.default:
            # aten.copy (copy_'s out-of-place overload) has no autograd formula in torch ("derivative for
            # aten::copy is not implemented" in backward: nn.CrossMapLRN2d's `out=` pow written as copy_ into a
            # fresh buffer); copying a source of the same shape is a clone / cast of the source
            functional, args, kwargs = _copy_as_clone(node)
            if functional is None:
                continue
        else:
            kwargs = node.kwargs
            functional = _functional_overload(node.target)
            args = _with_defaults(node.target._schema, node.args, node.kwargs)  # bernoulli_(x): p=0.5 for bernoulli.p
            if functional is None or not _same_result(functional, node, args) \
                    or not _has_derivative(functional, args, node.kwargs):
                continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(functional, args, kwargs)
            new.meta = _meta_like(node)
        order[new] = order[node]
        for user in list(base.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(base, new)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        name = node.target.name().split("::")[-1].split(".")[0]
        rewritten[name] = rewritten.get(name, 0) + 1
    if rewritten:
        notes.append("wrote in-place op(s) on fresh activations out of place (same values; the planner may then "
                     "redistribute them): " + ", ".join(f"{k} x{v}" for k, v in sorted(rewritten.items())))


_DERIVATIVE_KNOWN: dict[Any, bool] = {}
_FACTORY = ("empty", "zeros", "ones", "full", "rand", "new_", "scalar_tensor", "arange", "linspace")


def _has_derivative(functional, args: tuple, kwargs: dict) -> bool:
    """Whether the out-of-place overload has an autograd formula where the traced program needs one: some
    have none although their in-place op has one (aten.resize_as, aten.copy: "derivative for aten::resize_as
    is not implemented" in backward, nn.CrossMapLRN2d's buffers), so writing the in-place op out of place
    would break backward. Probed once per overload and gradient pattern on small real tensors (the traced
    ranks, dims capped at 2): the written tensor requires grad unless a factory made it (`empty_like(h)` filled
    by `normal_`: nothing flows back), the other float arguments do. An op that does not run on such values
    counts as differentiable (the fake-tensor check `_same_result` passed)."""
    base = args[0] if args else None
    base_grad = not (isinstance(base, torch.fx.Node) and base.op == "call_function"
                     and isinstance(base.target, torch._ops.OpOverload)
                     and any(word in base.target._opname for word in _FACTORY))

    def grad_of(n):
        val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        return isinstance(val, torch.Tensor) and val.dtype.is_floating_point and (n is not base or base_grad)

    flags = tuple(grad_of(n) for n in pytree.tree_leaves((args, kwargs)))
    key = (functional, flags)
    if key in _DERIVATIVE_KNOWN:
        return _DERIVATIVE_KNOWN[key]

    def real(n):  # every dim above 2 made 2 (a model traced on meta with a (8, 1024, 50257) value allocates 8)
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return n
        shape = tuple(min(int(d), 2) for d in val.shape)
        if val.dtype.is_floating_point:
            return torch.rand(shape, dtype=val.dtype).requires_grad_(grad_of(n))
        return torch.zeros(shape, dtype=val.dtype)

    ok = True
    try:
        r_args, r_kwargs = pytree.tree_map_only(torch.fx.Node, real, (args, kwargs))
        with torch.enable_grad():
            out = functional(*r_args, **r_kwargs)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                try:
                    out.float().sum().backward()
                except RuntimeError as err:
                    ok = "not implemented" not in str(err)
    except Exception:  # noqa: BLE001 - values the op rejects: keep the fake-tensor verdict
        ok = True
    _DERIVATIVE_KNOWN[key] = ok
    return ok


def _copy_as_clone(node: torch.fx.Node):
    """(op, args, kwargs) computing `copy_(fresh, src)`'s value from `src` alone, differentiably: aten.clone when the
    source has the destination's shape and dtype, aten._to_copy to its dtype when only the dtype differs;
    (None, None, None) when the copy broadcasts, crosses devices or has non_blocking set (the in-place copy_
    stays)."""
    if len(node.args) != 2 or node.kwargs.get("non_blocking", False):
        return None, None, None
    dst, src = node.args
    dst_val = dst.meta.get("val") if isinstance(dst, torch.fx.Node) else None
    src_val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if not (isinstance(dst_val, torch.Tensor) and isinstance(src_val, torch.Tensor)) \
            or dst_val.shape != src_val.shape or dst_val.device != src_val.device:
        return None, None, None
    if dst_val.dtype == src_val.dtype:
        return torch.ops.aten.clone.default, (src,), {}
    return torch.ops.aten._to_copy.default, (src,), {"dtype": dst_val.dtype}


def _fresh(node: torch.fx.Node) -> bool:
    """Whether `node` is a fresh activation (module docstring, normalisation 5), or a view of one that only
    this chain of views reads (`F.dropout(h.flatten(1), inplace=True)` after a pooling: the write reaches no
    other reader of the pooled value)."""
    while alias_source(node) is not None:
        parent = alias_source(node)  # einsum('ij->ij', h) / F.dropout(h, 0.0, False) return h itself (r18h)
        if not (isinstance(parent, torch.fx.Node) and len(parent.users) == 1):
            return False
        node = parent
    return (node.op == "call_function" and not returns_written(node) and not mutated_args(node)
            and "val" in node.meta)


def _functional_overload(target):
    """The out-of-place op of an in-place ATen op: the same overload of the packet without the trailing
    underscore (aten.add_.Tensor -> aten.add.Tensor), else the overload of that packet or of its
    `_functional` packet whose arguments have the same names and types (aten.bernoulli_.float ->
    aten.bernoulli.p, aten.normal_.default -> aten.normal_functional.default, aten.pow_.Tensor ->
    aten.pow.Tensor_Tensor); None when there is none."""
    name = getattr(target, "_schema", None) and target._schema.name  # "aten::add_"
    if not name or not name.endswith("_") or not name.startswith("aten::"):
        return None
    base = name[len("aten::"):-1]
    packet = getattr(torch.ops.aten, base, None)
    overload = getattr(packet, target._overloadname, None) if packet is not None else None
    if overload is not None and len(overload._schema.arguments) == len(target._schema.arguments):
        return overload
    signature = _argument_signature(target._schema)
    for packet in (getattr(torch.ops.aten, base, None), getattr(torch.ops.aten, f"{base}_functional", None)):
        for candidate in (getattr(packet, o) for o in packet.overloads()) if packet is not None else ():
            if _argument_signature(candidate._schema) == signature and len(candidate._schema.returns) == 1:
                return candidate
    return None


def _argument_signature(schema) -> tuple[tuple[str, str, bool], ...]:
    """(name, type, keyword-only) of each argument: alias annotations (`Tensor(a!)`) and defaults aside."""
    return tuple((a.name, str(a.type), a.kwarg_only) for a in schema.arguments)


def _with_defaults(schema, args: tuple, kwargs: dict) -> tuple:
    """`args` extended by the defaults of the positional arguments a call left out (up to the first one
    without a default or passed by keyword): the out-of-place overload may have no default for them."""
    args = list(args)
    for argument in schema.arguments[len(args):]:
        if argument.kwarg_only or argument.name in kwargs or not argument.has_default_value():
            break
        args.append(argument.default_value)
    return tuple(args)


def _same_result(functional, node: torch.fx.Node, args: tuple) -> bool:
    """Whether the out-of-place op called with `args` (and the node's kwargs) gives the in-place op's shape
    and dtype (type promotion could differ)."""
    val = node.meta.get("val")
    fake_mode = getattr(val, "fake_mode", None)
    if not isinstance(val, torch.Tensor) or fake_mode is None:
        return False
    args, kwargs = pytree.tree_map_only(torch.fx.Node, lambda n: n.meta.get("val"), (args, node.kwargs))
    try:
        with fake_mode:
            out = functional(*args, **kwargs)
    except Exception:  # noqa: BLE001 - keep the in-place op when its functional form does not run on fakes
        return False
    return isinstance(out, torch.Tensor) and out.shape == val.shape and out.dtype == val.dtype
