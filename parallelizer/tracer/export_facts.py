"""Facts about a model and its example inputs that an export failure's message states instead of guessing them
from the exception's type or text (`export_errors.translate`): where the parameters, buffers, tensor attributes
and inputs are (`device_cause`), whether the inputs fit forward's signature (`signature_mismatch`), and a
container input whose keys are forward's parameter names (`keyword_hint`)."""
from __future__ import annotations

import inspect
import re

import torch
from torch.utils import _pytree as pytree

_TWO_DEVICES = re.compile(r"found at least two devices, (\S+?) and (\S+?)!")


def _listed(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def named_inputs(args: tuple, kwargs: dict) -> list[tuple[str, object]]:
    """(name as the caller wrote it: `example_inputs[0]`, `example_kwargs['mask']`, then the path inside, leaf)."""
    out = []
    for top, tree in (("example_inputs", args), ("example_kwargs", kwargs)):
        leaves, _ = pytree.tree_flatten_with_path(tree)
        out += [(top + pytree.keystr(path), leaf) for path, leaf in leaves]
    return out


def _input_tensors(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in named_inputs(args, kwargs) if isinstance(t, torch.Tensor)]


def _state_by_device(model: torch.nn.Module) -> dict[str, list[str]]:
    by_device: dict[str, list[str]] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        by_device.setdefault(str(t.device), []).append(name)
    return by_device


def _plain_tensor_attributes(model: torch.nn.Module, device: str) -> list[str]:
    """'fqn (device)' of tensors stored as plain attributes of a module (not parameters or buffers, which live in
    `_parameters` / `_buffers`, not in the instance dict) on another device than `device`: `model.to()` leaves them."""
    found = []
    for prefix, module in model.named_modules():
        for key, value in vars(module).items():
            if isinstance(value, torch.Tensor) and str(value.device) != device and value.dim() > 0:
                found.append(f"{prefix + '.' if prefix else ''}{key} ({value.device})")
    return found


def device_cause(text: str, model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[str, str]:
    """(construct, remedy) of a device mismatch under export, from where the model's state and the inputs are:
    the model spread over devices, an input on another device than the model, a tensor attribute `model.to()`
    does not move, or (none of these) a tensor made in forward without device=."""
    named = _TWO_DEVICES.search(text)
    by_device = _state_by_device(model)
    inputs = [(n, t) for n, t in _input_tensors(args, kwargs) if t.dim() > 0]  # 0-dim CPU tensors meet any device
    if len(by_device) > 1:
        listed = "; ".join(f"{d}: {_listed(names)}" for d, names in sorted(by_device.items()))
        return (f"a model whose parameters and buffers are on several devices ({listed})",
                "put every parameter and buffer on one device before tracing (`model.to(device)`; a tensor made "
                "with a legacy constructor such as `torch.FloatTensor(...)` ignores `with torch.device(...)`), and the "
                "example inputs there too: the trace moves CPU inputs to meta only when the whole model is on meta. "
                "A model split over devices by hand (or device_map=) is traced on one device, and the plan splits it")
    model_device = next(iter(by_device), None) or (str(inputs[0][1].device) if inputs else None)
    away = [f"{n} on {t.device}" for n, t in inputs if str(t.device) != model_device]
    if by_device and away:
        return (f"an example input on another device than the model ({_listed(away)}; the model's parameters "
                f"and buffers are on {model_device})",
                f"make the example inputs on the model's device (`x.to('{model_device}')`, or "
                f"`torch.randn(..., device='{model_device}')`); to trace shapes only, put the model on meta too "
                "(`parallelizer.presets.to_meta(model)`, which keeps tied weights tied; `model.to('meta')` unties "
                "them): the trace then moves CPU inputs to meta itself")
    attributes = _plain_tensor_attributes(model, model_device or "")
    if attributes:
        return (f"a tensor kept as a plain module attribute, not a parameter or buffer ({_listed(attributes)}), on "
                f"another device than the model ({model_device}): `model.to()` does not move such attributes",
                "register it as a buffer (`self.register_buffer('name', tensor, persistent=False)`, which moves with "
                "the model and is not saved), or make it in forward on the input's device")
    other = next((d for d in (named.groups() if named else ()) if d != model_device), "another device")
    meta = ("; `parallelizer plan` traces the model on the meta device, where a tensor made without device= is on "
            "the CPU. Or plan a model built on CPU from Python: parallelizer.plan(parallelizer.trace(model, inputs), "
            "mesh)" if model_device == "meta" else "")
    return (f"a tensor made in forward on another device than the model's and its inputs' (they are on "
            f"{model_device}, the tensor on {other}: a factory call without device=, e.g. `torch.zeros(B, C)`)",
            "make it where the tensors it meets are: `torch.zeros(B, C, device=x.device)`, `x.new_zeros(B, C)` or "
            "`torch.zeros_like(x)` (as the model needs on a GPU too)" + meta)


def signature_mismatch(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[str, str] | None:
    """(construct, remedy) when the example inputs do not bind to `model.forward`'s signature (too many or too few
    positional inputs, an unknown or missing keyword: torch.export binds them the same way), else None."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C forward: nothing to check against
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        given = f"{len(args)} positional input(s)" + (f" and keyword(s) {', '.join(sorted(kwargs))}" if kwargs else "")
        return (f"example inputs that do not fit {type(model).__name__}.forward{signature} ({exc}; given: {given})",
                "pass what forward takes: positional inputs as the example_inputs tuple (one tensor is one input: "
                "wrap a tuple of inputs in another tuple only if forward takes a tuple), keyword inputs as "
                "example_kwargs (auto_parallelize(model, args, example_kwargs={...}); trace(model, args, kwargs))")
    return None


def keyword_hint(model: torch.nn.Module, args: tuple) -> str:
    """'; ...' naming a positional dict input whose keys are forward's parameters (a transformers batch passed as
    `model(batch)` instead of `model(**batch)`), else ''."""
    try:
        names = set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return ""
    for i, value in enumerate(args):
        if isinstance(value, dict) and value and set(value) <= names:
            return (f"; example_inputs[{i}] is a dict whose keys ({_listed(sorted(value))}) are parameters of "
                    "forward: pass it as keyword inputs (example_kwargs=batch, as model(**batch) does)")
    return ""
