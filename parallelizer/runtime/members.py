"""Where a ParallelModule keeps the model's tensors and submodules: under the model's own names, in the module
dicts (`_parameters`, `_buffers`, `_modules`), also when a name is an attribute of ParallelModule itself (a
counter buffer `step`, a submodule `traced`: `register_buffer` / `add_module` refused those with an untyped
KeyError on every rank). Lookups go through the dicts (`member`, `submodule`), since an attribute of the same
name would shadow them; `torch.func.functional_call` swaps tensors in those dicts too.
"""
from __future__ import annotations

import torch

from .mirror import mirror


def add_child(parent: torch.nn.Module, name: str, child: torch.nn.Module) -> None:
    """Put `child` into `parent._modules` under the model's own (already validated) name. Not `add_module`: it
    refuses a name that is an attribute of ParallelModule itself (a submodule `traced` or `spec` of the model),
    and its `hasattr` check calls the model class's own `__getattr__`, which peft's `ModulesToSaveWrapper` makes
    raise KeyError while the wrapper's children are still being added (before: a raw KeyError 'modules_to_save'
    on every rank building a ParallelModule of a peft model with `modules_to_save`, round 14 r14b)."""
    parent._modules[name] = child


def submodule(root: torch.nn.Module, path: str) -> torch.nn.Module:
    """The submodule at dotted `path` of `root`, through the module dicts (`add_child`); `get_submodule` reads
    attributes, which a ParallelModule attribute of the same name shadows."""
    module = root
    for part in filter(None, path.split(".")):
        if part not in module._modules:
            raise AttributeError(f"{module._get_name()} has no submodule {part!r} (path {path!r})")
        module = module._modules[part]
    return module


def add_member(owner: torch.nn.Module, name: str, tensor: torch.Tensor, is_buffer: bool, persistent: bool) -> None:
    """Put `tensor` into `owner`'s parameter or buffer dict under the model's own name, as `add_child` does for
    modules (`register_buffer` / `register_parameter` refuse a name that is an attribute of ParallelModule itself,
    a counter buffer `step`, with an untyped KeyError on every rank, and call the class's `__getattr__`): the name
    keeps meaning the API (`pm.step(...)`) while state_dict(), named_buffers() and the program (`member`) read
    the tensor."""
    (owner._buffers if is_buffer else owner._parameters)[name] = tensor
    if is_buffer and not persistent:
        owner._non_persistent_buffers_set.add(name)
    elif is_buffer:
        owner._non_persistent_buffers_set.discard(name)


def member(module: torch.nn.Module, name: str):
    """Parameter or buffer `name` of `module` (its tensor dicts first: `add_member`; also what
    torch.func.functional_call swaps in), else the attribute."""
    for store in (module._parameters, module._buffers):
        if name in store:
            return store[name]
    return getattr(module, name)


def owner_of(root: torch.nn.Module, fqn: str) -> torch.nn.Module:
    """The (created on demand) submodule of `root` that owns attribute path `fqn`."""
    module = root
    for part in fqn.split(".")[:-1]:
        if part not in module._modules:
            module.add_module(part, mirror(None))
        module = module._modules[part]
    return module


def attribute_at(root: torch.nn.Module, fqn: str):
    """The attribute at dotted path `fqn` of `root` (a parameter, buffer or any tensor attribute)."""
    owner, _, name = fqn.rpartition(".")
    return member(submodule(root, owner), name)
