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
from collections import OrderedDict

import torch

from ..errors import StaleModelWarning


def watch(model: torch.nn.Module, module: torch.nn.Module) -> None:
    """Warn `StaleModelWarning` when `model` is run or its `state_dict()` read after `module` (the ParallelModule
    or PipelineModule built from it) changed a parameter. Holds `model` and `module` by weak reference only."""
    model_ref, module_ref = weakref.ref(model), weakref.ref(module)
    start = {name: p._version for name, p in module.named_parameters()}
    state = {"warned": False, "loading": None}

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
            "model.state_dict(); model.load_state_dict(pm.full_state_dict()) (on every rank) gives the model the "
            "trained weights (then save_pretrained / generate it); `with pm.full_model() as m:` gives the model's "
            "own modules with the trained "
            "weights; an EMA / SWA copy: AveragedModel(pm), updated from pm"), stacklevel=stacklevel)

    # stack levels: check, the hook, torch's caller(s) of the hook, then the user's line
    model.register_forward_pre_hook(lambda mod, args: check(mod, "a forward", 6))
    model.register_state_dict_pre_hook(lambda mod, prefix, keep_vars: check(mod, "state_dict()", 4))
    # an EMA / SWA copy made before wrapping and updated from the model (a DDP script: DDP shares the model's
    # tensors) averaged the untrained weights at every step, silently (trial r13a)
    _READERS[model] = check
    if torch.optim.swa_utils.AveragedModel.update_parameters is not _update_parameters:
        torch.optim.swa_utils.AveragedModel.update_parameters = _update_parameters
    writes = _watch_writes(model_ref, module_ref)

    def loading(mod, state_dict, prefix, local_metadata, *rest) -> None:
        tag = (local_metadata or {}).get(SNAPSHOT)
        pm = module_ref()
        state["loading"] = tag[1] if prefix == "" and tag is not None and pm is not None and tag[0] == id(pm) else None

    def loaded(mod, incompatible) -> None:
        versions, state["loading"] = state["loading"], None
        if versions is not None and not incompatible.missing_keys:
            # the model now holds the parallel module's weights as of `versions` (trial r14c: the export recipe
            # `model.load_state_dict(pm.full_state_dict())` was warned about both ways, as stale and as changed)
            start.clear()
            start.update(versions)
            # and is used on its own from now on (model.eval() for generate, an export): changes to it are no
            # longer set-up steps meant for the parallel module, so `_watch_writes` stops
            writes["warned"] = True

    model.register_load_state_dict_pre_hook(loading)
    model.register_load_state_dict_post_hook(loaded)


SNAPSHOT = "parallelizer_snapshot"
"""The key, in the root entry of a full state dict's `_metadata`, of (id of the parallel module, the version counter
of each of its parameters when the state dict was gathered): `tag_snapshot`."""


def tag_snapshot(module: torch.nn.Module, full: dict) -> "OrderedDict[str, torch.Tensor]":
    """`full` (the parallel module's `full_state_dict()`) as an OrderedDict that records in `_metadata`, the
    attribute torch's `load_state_dict` passes on, which version of `module`'s weights it holds. Loading it into the
    model given to auto_parallelize (`model.load_state_dict(pm.full_state_dict())`, then `model.save_pretrained` or
    `model.generate`) makes the model current as of that version, so `watch` warns neither that the model is stale
    (until `module` trains again) nor, at `module`'s next forward, that the model was changed after wrapping."""
    tagged = OrderedDict(full)
    tagged._metadata = {"": {SNAPSHOT: (id(module), {n: p._version for n, p in module.named_parameters()})}}
    return tagged


_READERS: "weakref.WeakKeyDictionary[torch.nn.Module, object]" = weakref.WeakKeyDictionary()
"""A wrapped model -> its `watch` check, for readers of the model's tensors other than forward / state_dict."""
_TORCH_UPDATE_PARAMETERS = torch.optim.swa_utils.AveragedModel.update_parameters


def _update_parameters(self, model: torch.nn.Module) -> None:
    """`AveragedModel.update_parameters` that warns `StaleModelWarning` (`watch`) when `model` is a model given to
    auto_parallelize whose parallel module has trained: its tensors are the weights it had when wrapped."""
    check = _READERS.get(model)
    if check is not None:
        check(model, "AveragedModel.update_parameters' read", 3)
    return _TORCH_UPDATE_PARAMETERS(self, model)


def _state(model: torch.nn.Module) -> dict[str, tuple]:
    """(tensor id, version counter, requires_grad) of each parameter of `model`, by name (buffers are left out:
    an eager reference forward of the model writes its BatchNorm statistics), and each module's train/eval mode
    (by "<name> (mode)")."""
    state: dict[str, tuple] = {name: (id(t), t._version, t.requires_grad) for name, t in model.named_parameters()}
    state.update({f"{name or type(model).__name__} (mode)": ("mode", m.training) for name, m in model.named_modules()})
    return state


def _mode_followed(pm: torch.nn.Module, name: str | None, value: tuple) -> bool:
    """Whether `value`, a module's ("mode", training) entry of `_state` for the module `name` of the model,
    is the mode of the parallel module's module of that name too (the user switched both: nothing is lost)."""
    if name is None or value[0] != "mode":
        return False
    try:
        return pm.get_submodule(name).training == value[1]
    except AttributeError:
        return False


def _watch_writes(model_ref, module_ref) -> dict[str, bool]:
    """The other direction (trial r13a): warn `StaleModelWarning` once, at the parallel module's next forward,
    when the MODEL was changed after wrapping by what users do to it before training: a checkpoint loaded into
    it (`model.load_state_dict(...)`), values written in place, tensors replaced, parameters frozen or unfrozen
    (`requires_grad_`), `model.eval()` / `model.train()` (the parallel module kept its own mode: dropout stayed on
    in a validation run). The parallel module never reads the model again, so it trained from the weights (and
    with the frozen set) it had when it was wrapped, silently: with DDP, which shares the model's tensors, the
    same script trains the loaded weights. A model trained eagerly after wrapping (a reference run: its
    parameters have gradients) is left alone. Returns its {"warned": ...} state (`watch` sets it when the model
    loads the parallel module's own full state dict: the model is an exported copy from then on)."""
    start, state = _state(model_ref()), {"warned": False}

    def check(mod: torch.nn.Module, args) -> None:
        model = model_ref()
        if state["warned"] or mod is not module_ref() or model is None:
            return
        params = dict(model.named_parameters())
        if any(p.grad is not None for p in params.values()):
            return  # trained eagerly after wrapping: a reference, not a set-up step
        now = _state(model)  # on every forward until it warns: the cheap comparison first, names only on a change
        differ = [n for n, v in now.items() if start.get(n) != v]
        if not differ and len(now) == len(start):
            return
        modes = {f"{name or type(model).__name__} (mode)": name for name, _ in model.named_modules()}
        changed = [n for n in differ if not _mode_followed(mod, modes.get(n), now[n])]
        changed += [n for n in start if n not in now]
        if not changed:
            return
        state["warned"] = True
        if changed[0].endswith(" (mode)"):
            what = "its train/eval mode: pm.train() / pm.eval() set the parallel module's"
        elif all(start.get(n, (0, 0, None))[:2] == now.get(n, (1, 1, None))[:2] for n in changed):
            what = "its requires_grad"
        else:
            what = "its values (a load, an in-place write)"
        warnings.warn(StaleModelWarning(
            f"the model given to auto_parallelize was changed after wrapping (e.g. {changed[0]!r}: {what}): the "
            f"{type(mod).__name__} holds its own tensors, copied when it was built, and never reads the model "
            "again, so it runs and trains without that change. Remedy: load or change the model before "
            "auto_parallelize, or apply it to the parallel module (pm.load_full_state_dict(state), "
            "pm.get_parameter(name).requires_grad_(False), pm.eval(), `with pm.full_model() as m:` for in-place "
            "edits)"),
            stacklevel=4)

    module_ref().register_forward_pre_hook(check)
    return state
