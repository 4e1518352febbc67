"""The module tree of a ParallelModule: the model's modules mirrored by instances of their own classes.

A ParallelModule runs one traced program, so its submodules never run; they hold the local shards under the
model's names. Training scripts find modules by type after wrapping: `for m in pm.modules(): if
isinstance(m, nn.BatchNorm2d): m.eval()` (frozen BatchNorm statistics when fine-tuning),
`torch.optim.swa_utils.update_bn(loader, pm)` (it resets BatchNorm statistics and sets `momentum=None`), a
Dropout's `p` lowered by a schedule, `model.apply(init_fn)`. With plain holder modules these matched nothing
and did nothing, silently (update_bn on a Conv -> BatchNorm model left the running mean 0.15 off one
device's). So each submodule of a ParallelModule is a MIRROR:

- an instance of a class derived from the model module's own class (`mirror_class`: `_StateOnly` first, so
  it never runs a forward and refuses module hooks), made without calling its constructor, holding the
  model module's attributes (shallow copies of its `__dict__` outside nn.Module's own state, except tensors
  and modules kept as plain attributes: they hold full values) and this rank's shards of its parameters and
  buffers; `isinstance` and attribute reads see the model's module;
- the module's SETTINGS are its public plain attributes (bool, int, float, str, None, and tuples of them: a
  Dropout's `p`, a BatchNorm's `momentum` and `eps`, an activation's `approximate`), snapshotted when the
  mirror is made (`settings`). A change after that (`changed_settings`) is a different model: the
  ParallelModule traces the model again with the change applied (`runtime.modes`, as for train/eval), or, where
  it cannot (a pipeline stage), raises PlanMismatchError; it is never ignored.

Method calls on a mirror run the model class's code on the mirror's local shards: elementwise writes of
constants (`reset_running_stats`, `zero_`) act on each shard as on the full tensor; random draws
(`nn.init.normal_`, `weight.data.normal_()`) and shape-reading initialisers are refused on shards
(`runtime.init_check`), and so is a constant written into a part chosen along a sharded dim
(`weight[padding_idx].zero_()`: another row of each shard; round 26: 0.27 off one device on fsdp, silently,
before), or any value written there by index assignment, `copy_` or an indexed write (`runtime.part_writes`,
round 27); other code that indexes a parameter sees the local shard, as for any use of `pm.parameters()`: initialise
the model before parallelising it, or run such code under `pm.apply` / `pm.full_model()`.
A class whose mirror class cannot be made (a metaclass or `__init_subclass__` that refuses it) is mirrored by a
plain `_StateOnly`.
"""
from __future__ import annotations

import types

import torch

from ..errors import TraceError, UnsupportedOpError

MODULE_STATE = frozenset(torch.nn.Module().__dict__)
"""nn.Module's own per-instance state (parameters, buffers, submodules, hooks, mode): not copied to mirrors
(and what `ParallelModule.__deepcopy__` copies)."""
_CLASSES: dict[type, type] = {}
_MISSING = object()


class _StateOnly(torch.nn.Module):
    """A submodule of a ParallelModule: it holds the local shards of one of the model's modules but never
    runs (the rank's program is one graph), so forward hooks on it could never fire: registering one raises.
    Children are reached by attribute, and by index or key as in a ModuleList / ModuleDict."""

    def _no_hooks(self, hook=None, *args, **kwargs):
        from torch.nn.utils.prune import BasePruningMethod
        if isinstance(hook, BasePruningMethod):
            # torch.nn.utils.prune registers its hook last, after computing the mask from what this module holds
            # (a shard's magnitudes, not the whole tensor's) and setting the pruned weight as a plain attribute
            # that the program would read, stale, from then on. Drop that attribute so that prune's own rollback
            # puts the parameter back (it raised KeyError "attribute 'weight' already exists" before), and refuse.
            self.__dict__.pop(hook._tensor_name, None)
            raise UnsupportedOpError(
                f"torch.nn.utils.prune ({type(hook).__name__}) on {hook._tensor_name!r} of a submodule of a "
                "ParallelModule after wrapping: the submodule never runs, so its pruning hook would never recompute "
                "the pruned weight (it would stay the tensor of the first step), and a magnitude threshold on this "
                "rank's shard is not the whole tensor's. Nothing was changed. Remedy: prune the model before "
                "auto_parallelize (the pruned weight is then traced into the program), or write a mask over whole "
                "tensors inside `with pm.full_model() as model:` (e.g. model.fc.weight.mul_(mask))")
        raise TraceError(
            "a forward or module backward hook registered on a submodule of a ParallelModule", None,
            "such a submodule never runs by itself (the sharded program is one graph); register the hook on the "
            "model's module BEFORE tracing/auto_parallelize (torch.export traces it into the program), or hook "
            "the ParallelModule itself, or a parameter (tensor hooks work)")

    register_forward_hook = register_forward_pre_hook = _no_hooks
    register_full_backward_hook = register_full_backward_pre_hook = _no_hooks

    def forward(self, *args, **kwargs):
        raise TraceError(
            f"a call of the submodule {type(self).__name__} of a ParallelModule", None,
            "its parameters are this rank's shards and the sharded program runs the model as one graph; call the "
            "ParallelModule itself (or parallelise that submodule as its own model)")

    def __getitem__(self, key: int | str) -> torch.nn.Module:
        """`pm.model.layers[0]` as on the model's ModuleList / ModuleDict (the children holding state)."""
        if isinstance(key, int):
            key = str(key if key >= 0 else len(self._modules) + key)
        return self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __bool__(self) -> bool:  # a module is truthy whatever its number of children (as nn.Module)
        return True

    def __iter__(self):
        return iter(self._modules.values())


def refuse_foreign_modules(root: torch.nn.Module, owner: str = "a ParallelModule", parametrized=None,
                           modules=None) -> None:
    """Raise UnsupportedOpError when a submodule of `root` (a ParallelModule) is not a mirror: a module swapped in
    or added after wrapping (`pm.fc = MyLinear(...)`, `torch.ao.quantization.prepare_qat(pm)`, `pm.head =
    nn.Identity()`). The program runs the model as traced and reads only the parameters and buffers at the
    traced names, so the new module's forward would never run: a fake-quantised or custom Linear trained as the
    plain one (prepare_qat on an MLP: outputs 1.3e-2 off one device after 3 SGD steps, silently, on ddp, fsdp
    and tp alike). A parametrization registered later keeps the module (its class gains a parametrized
    subclass, judged by `parametrized(name, module)` when given: `runtime.init_check.refuse_parametrized_shard`,
    in this same walk); its `parametrizations` container is torch's, not a model module, and is allowed.
    `modules`: `root.named_modules()` read already (`tree_reading.TreeReading.modules`), else walked here."""
    from torch.nn.utils.parametrize import is_parametrized
    torchs: list[str] = []  # the `parametrizations` containers of parametrized mirrors (and what they hold)
    for name, module in (root.named_modules() if modules is None else modules):
        if not name or any(name == t or name.startswith(t + ".") for t in torchs):
            continue
        if isinstance(module, _StateOnly):
            qconfig = module.__dict__.get("qconfig")
            if qconfig is not None and qconfig is not module.__dict__.get("_built_qconfig"):
                raise UnsupportedOpError(
                    f"a torch.ao.quantization qconfig set on submodule {name!r} of {owner} after wrapping "
                    "(prepare_qat / prepare / quantize_dynamic): torch swaps modules by exact class, and pm's "
                    "submodules are mirrors, so nothing was swapped and the program would train the float model "
                    "(prepare_qat on an MLP: 1.3e-2 off one device after 3 SGD steps, silently). Remedy: "
                    "prepare_qat(model) before auto_parallelize (the fake quantisation is then traced)")
            if is_parametrized(module):
                torchs.append(f"{name}.parametrizations")
                if parametrized is not None:
                    parametrized(name, module)
            continue
        raise UnsupportedOpError(
            f"submodule {name!r} of {owner} is a {type(module).__module__}.{type(module).__qualname__} set after "
            "wrapping (a module swap, prepare_qat / quantize_dynamic, a new or replaced submodule): the sharded "
            "program runs the model as it was traced and never calls a submodule's forward, so the change would be "
            "ignored. Remedy: change the model before auto_parallelize (swap, prepare_qat, add or remove modules, "
            "then trace and plan it), or, to change values only, write them into pm's own submodules")


def mirror_class(cls: type) -> type:
    """The mirror class of module class `cls` (cached): `_StateOnly` before `cls` in the MRO, named like
    `cls`; `_StateOnly` itself when `cls` is nn.Module or no such class can be made."""
    if cls in (torch.nn.Module, _StateOnly) or issubclass(cls, _StateOnly):
        return _StateOnly
    if cls not in _CLASSES:
        try:
            _CLASSES[cls] = types.new_class(cls.__name__, (_StateOnly, cls), exec_body=lambda ns: ns.update(
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}))
        except Exception:  # noqa: BLE001 - a metaclass, layout conflict or __init_subclass__ refusing it:
            # a plain holder (isinstance then fails, as before mirrors)
            _CLASSES[cls] = _StateOnly
    return _CLASSES[cls]


def mirror(module: torch.nn.Module | None) -> torch.nn.Module:
    """A mirror of `module` (module docstring) without its parameters, buffers and children; a plain
    `_StateOnly` for None (a path the model does not have as a module)."""
    if module is None:
        return _StateOnly()
    cls = mirror_class(type(module))
    new = object.__new__(cls)
    torch.nn.Module.__init__(new)
    if cls is not _StateOnly:
        for key, value in module.__dict__.items():  # not tensors or modules outside nn.Module's registries:
            if key not in MODULE_STATE and not isinstance(value, (torch.Tensor, torch.nn.Module)):  # full values
                new.__dict__[key] = value
        for registry in ("_parameters", "_buffers"):  # entries registered as None (Conv2d(bias=False).bias)
            getattr(new, registry).update({k: None for k, v in getattr(module, registry).items() if v is None})
    new.__dict__["_built_qconfig"] = module.__dict__.get("qconfig")  # a qconfig set later: refuse_foreign_modules
    new.training = module.training
    return new


def settings(module: torch.nn.Module) -> dict[str, object]:
    """The module's public plain attributes (module docstring), by name (private ones, `_name`, are bookkeeping
    of torch or libraries, not the model's configuration)."""
    return {k: v for k, v in module.__dict__.items() if k not in MODULE_STATE and not k.startswith("_") and _plain(v)}


def changed_settings(root: torch.nn.Module, snapshots: dict[str, dict[str, object]], modules=None) -> tuple:
    """((module name, attribute, current value), ...) for every snapshotted setting of `root`'s submodules
    that differs now (a deleted one: the value `None` with attribute name suffixed ' (deleted)'). `modules`:
    `root.named_modules()` read already (`tree_reading.TreeReading.modules`), else walked here."""
    out = []
    for name, module in (root.named_modules() if modules is None else modules):
        for key, value in snapshots.get(name, {}).items():
            now = module.__dict__.get(key, _MISSING)
            if now is _MISSING:
                out.append((name, key + " (deleted)", None))
            elif now is not value and not (type(now) is type(value) and now == value):
                out.append((name, key, now))
    return tuple(out)


def apply_settings(skeleton: torch.nn.Module, changes: tuple) -> list[tuple]:
    """Set `changes` (from `changed_settings`) on the matching modules of `skeleton`; returns what to pass to
    `restore_settings` to undo it."""
    undo = []
    for name, key, value in changes:
        module = skeleton.get_submodule(name)
        if key.endswith(" (deleted)"):
            key = key[: -len(" (deleted)")]
            undo.append((module, key, module.__dict__.get(key, _MISSING)))
            module.__dict__.pop(key, None)
        else:
            undo.append((module, key, module.__dict__.get(key, _MISSING)))
            setattr(module, key, value)
    return undo


def restore_settings(undo: list[tuple]) -> None:
    """Undo `apply_settings`."""
    for module, key, value in reversed(undo):
        if value is _MISSING:
            module.__dict__.pop(key, None)
        else:
            module.__dict__[key] = value


def describe(changes: tuple, n: int = 3) -> str:
    """'bn.momentum=None, drop.p=0.0' for the first n changes."""
    text = ", ".join(f"{name or '<root>'}.{key}={value!r}" for name, key, value in changes[:n])
    return text + (f" ... ({len(changes) - n} more)" if len(changes) > n else "")


def _plain(value) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))
