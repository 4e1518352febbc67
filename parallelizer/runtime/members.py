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
    """`parent.add_module(name, child)`, or, for a name that is an attribute of ParallelModule itself (a
    submodule `traced` or `spec` of the model), straight into `parent._modules` (`add_member`)."""
    if name in parent._modules or not hasattr(parent, name):
        parent.add_module(name, child)
    else:
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
    """Register `tensor` as parameter or buffer `name` of `owner`. A model's tensor named like an attribute of
    ParallelModule itself (a counter buffer `step`, a submodule `traced`) goes into the module's tensor dict
    directly: `register_buffer` refused it (an untyped KeyError on every rank), and the name keeps meaning the
    API (`pm.step(...)`) while state_dict(), named_buffers() and the program (`member`) read the tensor."""
    store = owner._buffers if is_buffer else owner._parameters
    if name in store or not hasattr(owner, name):
        if is_buffer:
            owner.register_buffer(name, tensor, persistent=persistent)
        else:
            owner.register_parameter(name, tensor)
        return
    store[name] = tensor
    if is_buffer and not persistent:
        owner._non_persistent_buffers_set.add(name)


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
