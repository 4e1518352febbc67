"""Normalisation 2 of `tracer.normalize`: the regions export keeps as higher-order ops, inlined.

A `torch.no_grad()` / `torch.enable_grad()` region inside forward (exported as a call of the
`wrap_with_set_grad_enabled` higher-order op on a submodule) is inlined; the inputs of a no-grad region (but those
it writes in place) and its outputs go through `aten.detach`, so the region stays a stop-gradient, also for what
it writes into state (a buffer updated in place from activations). A `torch.autocast(...)` region (the
`wrap_with_autocast` higher-order op, whose body holds the ops BEFORE autocast's casts) is inlined with autocast's
casts made explicit: each op's inputs go through the `aten.to.dtype` casts torch's autocast policy gives that op
on that device (probed per op on fake tensors), so the graph computes what eager autocast computes and every
later stage sees ordinary ops and dtypes.

Moved out of `tracer.normalize` (round 21 review: 759 lines); `inline_regions` is its entry.
"""
from __future__ import annotations

import itertools
from contextlib import nullcontext
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import TraceError
from .node_facts import COPIED_META, alias_source, carries_grad, meta_like as _meta_like, mutated_args, stack_location

_GRAD_HOP = torch.ops.higher_order.wrap_with_set_grad_enabled
_AUTOCAST_HOP = torch.ops.higher_order.wrap_with_autocast
_REGION_HOPS = (_GRAD_HOP, _AUTOCAST_HOP)


def inline_regions(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Inline every `wrap_with_set_grad_enabled(enabled, submod, *args)` and
    `wrap_with_autocast(device_type, dtype, enabled, cache_enabled, submod, *args)` call, outermost first
    (a region nested in another is inlined when its parent's body has become part of `gm`). A no-grad
    region's outputs are detached; inside an enabled autocast region (or a grad region nested in one),
    each op gets the casts autocast would give its inputs (`_autocast_casts`)."""
    while True:
        node = next((n for n in gm.graph.nodes if n.op == "call_function" and n.target in _REGION_HOPS), None)
        if node is None:
            return
        autocast = node.meta.get("autocast")  # set on a region inlined from an enclosing autocast region
        if node.target is _GRAD_HOP:
            enabled, sub_attr, *operands = node.args
            kind = f"torch.{'enable_grad' if enabled else 'no_grad'}()"
        else:
            device_type, dtype, enabled, _cache, sub_attr, *operands = node.args
            autocast = (device_type, dtype) if enabled else None
            kind = f"torch.autocast({device_type!r}, dtype={dtype}, enabled={enabled})"
        sub = gm.get_submodule(sub_attr.target)
        originals = list(operands)
        if node.target is _GRAD_HOP and not enabled:  # nothing computed inside has a gradient, written
            written = _written_operands(sub)           # state (a buffer updated in place) included
            with gm.graph.inserting_before(node):
                operands = [_detach(gm, o, node) if (k not in written or _is_grad_leaf(o)) and _carries_grad(o)
                            else o for k, o in enumerate(operands)]
        outputs = _inline_body(gm, node, sub, operands, autocast)
        if node.target is _GRAD_HOP and not enabled:
            roots = _output_roots(sub)
            with gm.graph.inserting_before(node):  # a parameter written in the region is read as itself after it
                outputs = tuple(originals[roots[i]] if roots.get(i) is not None and _is_grad_leaf(originals[roots[i]])
                                else _detach(gm, o) for i, o in enumerate(outputs))
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
        where = stack_location(ops[0])
        details = {(_GRAD_HOP, False): " (its outputs are detached)",
                   (_AUTOCAST_HOP, True): " (autocast's input casts made explicit)"}
        detail = details.get((node.target, bool(enabled)), "")
        notes.append(f"inlined a {kind} region{' at ' + where if where else ''}{detail}")


def _written_operands(sub: torch.fx.GraphModule) -> set[int]:
    """Positions of the region's operands that an op inside it writes in place, directly or through views
    (`ema.mul_(0.5).add_(x)` writes `ema`): those stay as they are (a detached alias would be written the
    same, but the planner keeps the write on the operand itself); every other operand is detached."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    root = {p: k for k, p in enumerate(placeholders)}
    written: set[int] = set()
    for n in sub.graph.nodes:
        if n.op != "call_function":
            continue
        for i in mutated_args(n):
            arg = n.args[i] if i < len(n.args) else None
            if isinstance(arg, torch.fx.Node) and arg in root:
                written.add(root[arg])
        first = alias_source(n) or (n.args[0] if n.args and mutated_args(n) == [0] else None)
        if isinstance(first, torch.fx.Node) and first in root:  # views, undeclared aliases, in-place results
            root[n] = root[first]
    return written


def _output_roots(sub: torch.fx.GraphModule) -> dict[int, int]:
    """Region output position -> operand position, for outputs that are the operand itself after in-place
    writes and views (`p.clamp_(-c, c)` returns p)."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    root = {p: k for k, p in enumerate(placeholders)}
    for n in sub.graph.nodes:
        first = alias_source(n) or (n.args[0] if n.op == "call_function" and n.args and mutated_args(n) == [0]
                                    else None)
        if isinstance(first, torch.fx.Node) and first in root:  # views, undeclared aliases, in-place results
            root[n] = root[first]
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    return {i: root[o] for i, o in enumerate(out if isinstance(out, (tuple, list)) else (out,)) if o in root}


def _is_grad_leaf(value: Any) -> bool:
    """A value that requires grad as it enters the graph (a parameter): a no-grad region that writes it in place
    (WGAN's weight clipping, `p.clamp_(-c, c)`) writes it through a detached alias, as eager's no_grad does;
    written directly outside no_grad, torch refuses an in-place op on a leaf that requires grad."""
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return isinstance(value, torch.fx.Node) and value.op == "placeholder" and isinstance(val, torch.Tensor) \
        and val.requires_grad


def _carries_grad(value: Any) -> bool:
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and carries_grad(val.dtype)


def _inline_body(gm: torch.fx.GraphModule, node: torch.fx.Node, sub: torch.fx.GraphModule, operands: list,
                 autocast: tuple[str, torch.dtype] | None) -> tuple[torch.fx.Node, ...]:
    """Copy the ops of region `sub` before `node` (its placeholders bound to `operands`); returns the copies
    of the region's outputs. A nested region's submodule is moved into `gm` and its call keeps `autocast`."""
    env: dict[torch.fx.Node, Any] = dict(zip([n for n in sub.graph.nodes if n.op == "placeholder"], operands))
    with gm.graph.inserting_before(node):
        for sn in sub.graph.nodes:
            if sn.op == "placeholder":
                continue
            if sn.op == "output":
                return tuple(env[o] for o in pytree.tree_leaves(sn.args[0]))
            if sn.op == "get_attr":
                target = getattr(sub, sn.target, None)
                if not isinstance(target, torch.nn.Module):
                    raise TraceError("a constant inside a torch.no_grad()/autocast region", stack_location(sn),
                                     "move the constant out of the region")
                name = _free_attr(gm, "region")
                gm.add_submodule(name, target)
                env[sn] = gm.graph.get_attr(name)
                continue
            new = gm.graph.node_copy(sn, lambda n: env[n])
            if new.target in _REGION_HOPS and autocast is not None:
                new.meta["autocast"] = autocast
            elif autocast is not None and isinstance(new.target, torch._ops.OpOverload):
                _cast_inputs(gm, new, autocast)
            env[sn] = new
    raise TraceError("a torch.no_grad()/autocast region without an output", None, "report this model")


def _free_attr(gm: torch.fx.GraphModule, prefix: str) -> str:
    i = 0
    while hasattr(gm, f"{prefix}_{i}"):
        i += 1
    return f"{prefix}_{i}"


def _cast_inputs(gm: torch.fx.GraphModule, node: torch.fx.Node, autocast: tuple[str, torch.dtype]) -> None:
    """Insert before `node` the `aten.to.dtype` casts that autocast applies to its tensor inputs."""
    casts = _autocast_casts(node, autocast)
    if not casts:
        return
    position = itertools.count()

    def cast(arg: torch.fx.Node) -> torch.fx.Node:
        dtype = casts.get(next(position))
        if dtype is None:
            return arg
        with gm.graph.inserting_before(node):
            out = gm.graph.call_function(torch.ops.aten.to.dtype, (arg, dtype))
        out.meta = _meta_like(node)
        out.meta["val"] = arg.meta["val"].to(dtype)
        return out

    node.args, node.kwargs = torch.fx.node.map_arg((node.args, node.kwargs), cast)


class _CastRecorder(TorchDispatchMode):
    """Records the dtype casts (`aten._to_copy` with a dtype) that reach the dispatcher below autocast."""

    def __init__(self, inputs: list[torch.Tensor]) -> None:
        super().__init__()
        self.position = {id(t): i for i, t in enumerate(inputs)}
        self.casts: dict[int, torch.dtype] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and id(args[0]) in self.position and "dtype" in kwargs:
            self.casts.setdefault(self.position[id(args[0])], kwargs["dtype"])
        return func(*args, **kwargs)


def _autocast_casts(node: torch.fx.Node, autocast: tuple[str, torch.dtype]) -> dict[int, torch.dtype]:
    """{index of a tensor input in map_arg order: dtype} that `torch.autocast(*autocast)` casts to when it
    runs `node`'s op: found by running the op once on fake tensors of the input shapes and dtypes under
    autocast and recording the casts autocast issues (so the policy is torch's own, per device and op, not
    a copied op list)."""
    vals: list = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: vals.append(a.meta.get("val")))
    if not any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals):
        return {}
    try:
        return run_under_autocast(node, autocast, vals)[0]
    except Exception as exc:  # noqa: BLE001 - any failure of the op on fake tensors of that device type
        cause, remedy = autocast_failure(autocast[0], vals, exc)
        raise TraceError(f"torch.autocast({autocast[0]!r}) around {node.format_node()}", stack_location(node),
                         remedy, f"Cause: {cause}") from exc


def run_under_autocast(node: torch.fx.Node, autocast: tuple[str, torch.dtype] | None, vals: list,
                       call=None, context=None) -> tuple[dict[int, torch.dtype], Any]:
    """({index of a tensor input in map_arg order: dtype autocast casts it to}, the op's output on fake tensors)
    of `node`'s op run once on fake tensors on `autocast[0]`'s device type made from `vals` (each input's meta value
    or a tensor of the shape, stride and dtype to run it in; other arguments as they are) under
    `torch.autocast(*autocast)` (None: no autocast, no casts), or inside `context` when given (a context manager
    enabling it). `call(*args, **kwargs)` runs the op (default: `node.target`). Raises the op's own error."""
    device_type = autocast[0] if autocast is not None else "cpu"
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device_type)
                 if isinstance(v, torch.Tensor) else v for v in vals]
        it = iter(fakes)
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: next(it))
        recorder = _CastRecorder([f for f in fakes if isinstance(f, torch.Tensor)])
        if context is None:
            context = torch.autocast(device_type, dtype=autocast[1]) if autocast is not None else nullcontext()
        with context, recorder:
            out = (call or node.target)(*args, **kwargs)
    tensor_index = [i for i, f in enumerate(fakes) if isinstance(f, torch.Tensor)]
    return {tensor_index[k]: d for k, d in recorder.casts.items()}, out


def autocast_failure(device_type: str, vals: list, exc: BaseException) -> tuple[str, str]:
    """(cause, remedy) of an op of a `torch.autocast(device_type)` region that could not be run once on fake
    tensors of that device type (to record autocast's casts), the cause from facts checked here rather than from
    the exception's text: whether torch knows the device type, whether this torch build has its backend module,
    and where the op's traced tensors are. (Round 16, r16e: it said "trace on a machine with <type> devices",
    which fake tensors never need: fake CUDA tensors are made on a machine without CUDA.)"""
    error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    written = "write the device type the model runs on, e.g. torch.autocast(x.device.type, ...)"
    try:
        torch.device(device_type)
    except (RuntimeError, ValueError):
        return f"{device_type!r} is not a device type torch knows ({error})", written
    if getattr(torch, device_type, None) is None:
        return (f"this torch build has no torch.{device_type} backend module, which autocast({device_type!r}) needs "
                f"({error})", f"trace with the torch build (or plugin) that provides it, or {written}")
    traced_on = sorted({v.device.type for v in vals if isinstance(v, torch.Tensor)} - {"meta"})
    if traced_on and traced_on != [device_type]:
        return (f"the op's tensors are on {', '.join(traced_on)}, not {device_type}: run eagerly there, "
                f"autocast({device_type!r}) does not apply to them, and the op could not run on {device_type} "
                f"tensors to record autocast's casts ({error})",
                "write the device type of the tensors, e.g. torch.autocast(x.device.type, ...), or build the model "
                "on the device it runs on")
    return (f"the op raised when run once under autocast on fake {device_type} tensors of its traced shapes and "
            f"dtypes, to record autocast's casts ({error})",
            "run the model once eagerly under this autocast to see whether it runs there, or move the op out of "
            "the autocast region")


def _detach(gm: torch.fx.GraphModule, value: torch.fx.Node, where: torch.fx.Node | None = None) -> torch.fx.Node:
    """`aten.detach(value)`, recorded as made where `where` (default: `value`) was: its module stack and source,
    so that the detach of a no-grad region's input belongs to the module that opened the region (a block),
    not to the one that produced the input (the previous block), and repeated blocks stay alike."""
    out = gm.graph.call_function(torch.ops.aten.detach.default, (value,))
    out.meta = {k: v for k, v in (where if where is not None else value).meta.items() if k in COPIED_META}
    out.meta["val"] = value.meta["val"].detach()
    return out
