"""Inputs of `forward` that the traced call left at their defaults, and calls that pass those defaults explicitly.

A model traced as `model(x)` ran `forward(x, mask=None, scale=1.0)` with its defaults, so the traced program
computes exactly `model(x, mask=None)` and `model(x, None, 1.0)` too. Before, such a call was refused with
"unexpected keyword(s)" (a training loop that passes `attention_mask=None` or `return_dict=False` explicitly could
not swap its module for the parallel one); now an input given its default value, when the traced call did not
pass it, is dropped before the call is matched against the trace. A different value is a TypeError that names
the input, both values and the remedy (trace and plan with it in `example_kwargs`).

Only defaults that are plain constants (None, bool, int, float, str) count, compared by type and value: `1` is
not `1.0` (integer arithmetic differs), and a tensor default is not assumed unchanged.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from ..errors import InputMismatchError

_PLAIN = (type(None), bool, int, float, str)
_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def untraced_defaults(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(the names of `model.forward`'s positional parameters in order, {name: default} of its parameters that the
    call `model(*args, **kwargs)` does not pass and whose default is a plain constant). Empty when the forward's
    signature cannot be read or the call does not bind to it."""
    try:
        signature = inspect.signature(model.forward)
        bound = signature.bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return (), {}
    params = [p for p in signature.parameters.values() if p.kind in _KINDS]
    positional = tuple(p.name for p in params if p.kind != inspect.Parameter.KEYWORD_ONLY)
    defaults = {p.name: p.default for p in params if p.name not in bound.arguments
                and p.default is not inspect.Parameter.empty and type(p.default) in _PLAIN}
    return positional, defaults


def drop_passed_defaults(traced_args: int, traced_keywords: set[str], positional: tuple[str, ...],
                         defaults: dict[str, Any], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`(args, kwargs)` without the inputs the traced call left at their defaults and this call passes with the
    same value (trailing positional ones beyond the `traced_args` traced positions, and keywords not among
    `traced_keywords`). Anything else is left for the caller's structure check.

    Raises:
        TypeError: such an input passed with another value than its default (names it, both values, the remedy).
    """
    def same(name: str, value) -> bool:
        if name not in defaults:
            return False
        default = defaults[name]
        if type(value) is type(default) and value == default:
            return True
        shown = (f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value))[:80]
        given = "<that tensor>" if isinstance(value, torch.Tensor) else shown
        raise InputMismatchError(
            f"input {name!r} = {shown} was not passed when the model was traced, so the program computes forward "
            f"with its default {name}={default!r}. Remedy: trace and plan with it, e.g. auto_parallelize(model, "
            f"example_inputs, example_kwargs={{{name!r}: {given}}}), or leave it at its default")

    extra = list(args[traced_args:])
    names = positional[traced_args:traced_args + len(extra)]
    if extra and len(names) == len(extra) and all(same(n, v) for n, v in zip(names, extra)):
        args = args[:traced_args]
    kwargs = {k: v for k, v in kwargs.items() if k in traced_keywords or not same(k, v)}
    return args, kwargs
