"""Inputs of `forward` that the traced call left at (or passed as) their defaults, and calls that differ from the
traced call only there.

A model traced as `model(x)` ran `forward(x, mask=None, scale=1.0)` with its defaults, so the traced program
computes exactly `model(x, mask=None)` and `model(x, None, 1.0)` too. Before, such a call was refused with
"unexpected keyword(s)" (a training loop that passes `attention_mask=None` or `return_dict=False` explicitly could
not swap its module for the parallel one); now an input given its default value, when the traced call did not
pass it, is dropped before the call is matched against the trace. A different value is a TypeError that names
the input, both values and the remedy (trace and plan with it in `example_kwargs`).

The converse holds too: a model traced as `model(x, extra=None)` (an optional input passed explicitly at its
default) computes exactly `model(x)`, where Python fills `extra=None` in. Before round 24 such a call was refused
with "missing keyword(s) ['extra']" (trial r24h: a loop that traces with every keyword spelled out and evaluates
without the optional ones); now an omitted input the traced call passed with its plain-constant default is filled
in with that default before the call is matched (`fill_omitted_defaults`).

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


def untraced_defaults(model: torch.nn.Module, args: tuple,
                      kwargs: dict) -> tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]:
    """(the names of `model.forward`'s positional parameters in order, {name: default} of its parameters that the
    call `model(*args, **kwargs)` does not pass and whose default is a plain constant, {name: default} of those it
    passes with exactly that default (`_same_constant`)). Empty when the forward's signature cannot be read or
    the call does not bind to it."""
    try:
        signature = inspect.signature(model.forward)
        bound = signature.bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return (), {}, {}
    params = [p for p in signature.parameters.values() if p.kind in _KINDS
              and p.default is not inspect.Parameter.empty and type(p.default) in _PLAIN]
    positional = tuple(p.name for p in signature.parameters.values()
                       if p.kind in _KINDS and p.kind != inspect.Parameter.KEYWORD_ONLY)
    left = {p.name: p.default for p in params if p.name not in bound.arguments}
    passed = {p.name: p.default for p in params
              if p.name in bound.arguments and _same_constant(bound.arguments[p.name], p.default)}
    return positional, left, passed


def _same_constant(value, default) -> bool:
    """`value` is the plain constant `default` (same type and value: `1` is not `1.0`)."""
    return type(value) is type(default) and value == default


def fill_omitted_defaults(traced_args: int, traced_keywords: set[str], positional: tuple[str, ...],
                          passed: dict[str, Any], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`(args, kwargs)` with the inputs the traced call passed at their defaults (`passed`) and this call omits
    filled in with those defaults, as Python fills them for the model: trailing traced positions (when every one
    omitted was passed at its default and none is given by keyword) and traced keywords. Anything else is left
    for the caller's structure check."""
    missing = positional[len(args):traced_args]
    if missing and len(args) + len(missing) == traced_args and all(n in passed and n not in kwargs for n in missing):
        args = (*args, *(passed[n] for n in missing))
    filled = {k: passed[k] for k in traced_keywords if k not in kwargs and k in passed}
    return args, ({**kwargs, **filled} if filled else kwargs)


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
        if _same_constant(value, default):
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
