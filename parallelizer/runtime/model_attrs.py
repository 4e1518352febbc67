"""The wrapped model's own methods and attributes, read on its parallel module: a typed error that says what to do.

A script that swaps `model` for `pm = auto_parallelize(model, ...)` keeps calling what it called on the model after
training: `pm.save_pretrained(dir)`, `pm.generate(ids)`, `pm.config`, `pm.push_to_hub(...)`,
`pm.gradient_checkpointing_enable()`. The parallel module is not an instance of the model's class (its submodules
are, `runtime.mirror`): it holds this rank's pieces of the tensors and runs the one traced forward, so these
raised torch's bare "'ParallelModule' object has no attribute 'save_pretrained'" (round 14, trial r14c), which
says neither why nor what to do. `remember(module, model)` (called by `auto_parallelize`) records the model's
class and the names of its root's own attributes; `missing(module, name)` is the error for a name the parallel
module lacks: `ModelAttributeError` (an AttributeError too, so `hasattr(pm, "generate")` stays False, as
libraries probing a module expect) naming the attribute, the model's class and the remedies, or torch's plain
AttributeError for names the model does not have either (and for private names, which libraries probe often).
"""
from __future__ import annotations

import torch

from ..errors import ModelAttributeError
from .mirror import MODULE_STATE

_KEY = "_wrapped_model_attrs"


class ModelAttributes:
    """Mixed into ParallelModule and PipelineModule before torch.nn.Module: nn.Module's lookup (parameters,
    buffers, submodules), then `missing`: a method or attribute of the wrapped model (`save_pretrained`,
    `generate`, `config`) is a ModelAttributeError with the remedy (before: torch's bare AttributeError)."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            raise missing(self, name) from None


def remember(module: torch.nn.Module, model: torch.nn.Module) -> None:
    """Record on `module` (a ParallelModule or PipelineModule built from `model`) the model's class and the public
    names of its root's own attributes (a transformers model's `config`, `generation_config`)."""
    own = frozenset(k for k in vars(model) if k not in MODULE_STATE and not k.startswith("_"))
    module.__dict__[_KEY] = (type(model), own)


def missing(module: torch.nn.Module, name: str) -> AttributeError:
    """The error for attribute `name` that `module` lacks (nn.Module's lookup found nothing)."""
    plain = AttributeError(f"'{type(module).__name__}' object has no attribute '{name}'")
    recorded = module.__dict__.get(_KEY)
    if recorded is None or name.startswith("_"):
        return plain
    cls, own = recorded
    if name not in own and not hasattr(cls, name):
        return plain
    kind = type(module).__name__
    method = name not in own and callable(getattr(cls, name, None))
    if not method:
        remedy = (f"read it from the model: `model.{name}` (the traced program was made with the value it had then; "
                  "a setting changed after wrapping is not in it)")
    elif kind == "PipelineModule":
        remedy = ("after training, `model.load_state_dict(pm.full_state_dict())` (on every rank) gives the model the "
                  f"trained weights: then `model.{name}(...)`")
    else:
        remedy = (f"`with pm.full_model() as m: m.{name}(...)` runs it on a copy of the model holding the whole "
                  "trained tensors (collective: enter on every rank; for models that fit one device); or, after "
                  f"training, `model.load_state_dict(pm.full_state_dict())` (on every rank), then `model.{name}(...)`")
    if name.startswith(("save", "push_to_hub")):
        remedy += (". To save: parallelizer.checkpoint.export_full_state_dict(pm, dir, config=model.config) (every "
                   "rank) writes a checkpoint that from_pretrained loads, tensor by tensor")
    return ModelAttributeError(
        f"{kind}.{name}: {name!r} is {'a method' if method else 'an attribute'} of the wrapped model "
        f"({cls.__name__}), not of the {kind}, which holds this rank's pieces of the tensors and runs the traced "
        f"forward only (its submodules are the model's classes: pm.<submodule> works). Remedy: {remedy}")
