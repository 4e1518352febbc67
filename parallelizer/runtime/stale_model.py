"""A warning when the model given to `auto_parallelize` is used after its parallel module has trained.

`auto_parallelize(model, ...)` returns a module that holds its own tensors (this rank's shards, or its stages'
copies) and never writes the model's. After `pm` trains, `model(x)` still computes with the weights it had when
it was wrapped and `model.state_dict()` saves them: an evaluation or a checkpoint of the untrained model that
looks like any other (round 5: documented, but silent). `watch` adds a forward pre-hook and a state-dict pre-hook
to the model that warn `StaleModelWarning` once, naming the remedy, as soon as one of `pm`'s parameters has
changed since wrapping (an optimizer step or a load writes it in place, which moves its version counter). Before
that the model is still equal to `pm` and nothing is said. Copies of the model (`copy.deepcopy(model)`, a
reference kept for comparison; `pm.full_model()`'s copy, which holds the trained weights) carry the hooks but
are not the wrapped object and are never warned about.
"""
from __future__ import annotations

import warnings
import weakref

import torch

from ..errors import StaleModelWarning


def watch(model: torch.nn.Module, module: torch.nn.Module) -> None:
    """Warn `StaleModelWarning` when `model` is run or its `state_dict()` read after `module` (the ParallelModule
    or PipelineModule built from it) changed a parameter. Holds `model` and `module` by weak reference only."""
    model_ref, module_ref = weakref.ref(model), weakref.ref(module)
    start = {name: p._version for name, p in module.named_parameters()}
    state = {"warned": False}

    def check(mod: torch.nn.Module, what: str, stacklevel: int) -> None:
        pm = module_ref()
        if state["warned"] or mod is not model_ref() or pm is None:
            return
        moved = [n for n, p in pm.named_parameters() if start.get(n) != p._version]
        if not moved:
            return
        state["warned"] = True
        warnings.warn(StaleModelWarning(
            f"{what} of the model given to auto_parallelize, after the {type(pm).__name__} built from it changed its "
            f"parameters (e.g. {moved[0]!r}, by an optimizer step or a load): the parallel module trains its own "
            "tensors, never the model's, so the model still holds the weights it had when it was wrapped. Remedy: "
            "run pm(...) instead of model(...); save pm.full_state_dict() or use parallelizer.checkpoint instead of "
            "model.state_dict(); `with pm.full_model() as m:` gives the model's own modules with the trained "
            "weights"), stacklevel=stacklevel)

    # stack levels: check, the hook, torch's caller(s) of the hook, then the user's line
    model.register_forward_pre_hook(lambda mod, args: check(mod, "a forward", 6))
    model.register_state_dict_pre_hook(lambda mod, prefix, keep_vars: check(mod, "state_dict()", 4))
