"""Deep copies of a user's model that compute with their own tensors.

`copy.deepcopy` copies a Python function as it is: a function stored on a module whose closure holds the
module, a submodule or a tensor of the model (x-transformers' `tie_embedding`:
`self.to_logits = lambda t: t @ self.token_emb.emb.weight.t()`; a forward hook closing over `self`) is shared
by the copy, so the copy computes with the ORIGINAL's tensors. Every copy this package makes of a user's model
(the rehearsal's references, the mode-change skeleton, `ParallelModule.full_model`) goes through
`copy_module`, which rebinds such closures to the copy. Before: the eval program of a model tied through a
lambda used the weights the model had when it was wrapped, frozen (outputs 1.19 off after 2 AdamW steps on one
device), and `rehearse` compared the plan with a reference that did the same (a false "differs", every plan).

`copy.deepcopy` also refuses a tensor that is no graph leaf, and `torch.nn.utils.weight_norm` (the hook form,
deprecated but used by diffusers' AutoencoderOobleck, HiFi-GAN / EnCodec / DAC-style vocoders) stores the
module's `weight` as such a tensor, computed from `weight_g` and `weight_v`: every copy raised torch's "Only
Tensors created explicitly by the user (graph leaves) support the deepcopy protocol" (trial r16b: `rehearse` of
diffusers' AutoencoderOobleck failed on every rank; `pm.eval()` and `full_model()` would too). A module
attribute holding a non-leaf tensor is copied as its detached value: it is derived state that the module's
hook recomputes from the copy's own parameters at its next call (pytorch/pytorch#103001 added the error).
"""
from __future__ import annotations

import copy
import types

import torch

from ..tracer.slots import one_process_view


def copy_module(model: torch.nn.Module, memo: dict | None = None) -> torch.nn.Module:
    """`copy.deepcopy(model, memo)` whose functions held by its modules (attributes, hook dicts, lists of them)
    close over copies of what the originals closed over: every closure cell whose object was copied (a module,
    a tensor, a container; `memo` maps the original's id to its copy, as in `copy.deepcopy`) now holds the
    copy. Functions without such cells stay the same objects. A tensor attribute that is no graph leaf
    (weight_norm's `weight`) is copied as its detached value (module docstring)."""
    memo = {} if memo is None else memo
    for module in model.modules():  # derived non-leaf tensors held as attributes (weight_norm): their values
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and not value.is_leaf and id(value) not in memo:
                memo[id(value)] = value.detach().clone()
    clone = copy.deepcopy(model, memo)
    for module in clone.modules():
        for key, value in list(vars(module).items()):
            new = _rebound_in(value, memo)
            if new is not value:
                module.__dict__[key] = new
    return clone


def _rebound_in(value, memo: dict):
    """`value` with its functions rebound (`_rebound`): a function, or one level of dict / list / tuple of them
    (the copy's own containers are changed in place; deepcopy made them)."""
    if isinstance(value, types.FunctionType):
        return _rebound(value, memo)
    if isinstance(value, dict):
        for k, v in list(value.items()):
            if isinstance(v, types.FunctionType):
                value[k] = _rebound(v, memo)
    elif isinstance(value, list):
        value[:] = [_rebound(v, memo) if isinstance(v, types.FunctionType) else v for v in value]
    elif isinstance(value, tuple) and any(isinstance(v, types.FunctionType) for v in value):
        return tuple(_rebound(v, memo) if isinstance(v, types.FunctionType) else v for v in value)
    return value


def _rebound(fn: types.FunctionType, memo: dict) -> types.FunctionType:
    """`fn`, or a new function of the same code whose closure cells hold the copies `memo` names (functions in
    cells rebound too; the new function is recorded in `memo`, so cycles and shared functions resolve once)."""
    if id(fn) in memo:
        return memo[id(fn)]
    if not fn.__closure__:
        return fn
    memo[id(fn)] = fn  # while its cells are looked at: a function closing over itself keeps itself
    contents = []
    for cell in fn.__closure__:
        try:
            obj = cell.cell_contents
        except ValueError:  # an empty cell (a name assigned after the function was made)
            contents.append(cell)
            continue
        new = _rebound(obj, memo) if isinstance(obj, types.FunctionType) else memo.get(id(obj), obj)
        contents.append(cell if new is obj else types.CellType(new))
    if all(a is b for a, b in zip(contents, fn.__closure__)):
        memo.pop(id(fn))
        return fn
    new_fn = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(contents))
    new_fn.__kwdefaults__, new_fn.__qualname__, new_fn.__module__ = fn.__kwdefaults__, fn.__qualname__, fn.__module__
    new_fn.__dict__.update(fn.__dict__)
    memo[id(fn)] = new_fn
    return new_fn


def reference_copy(model: torch.nn.Module) -> torch.nn.Module:
    """`copy_module(model)` whose calls run as on one device (`tracer.slots.one_process_view`: no default
    process group is visible inside its forward), for a single-device reference computed on a rank. Round 24
    (r24e): `rehearse`'s references ran under the ranks' group, so a model that reads it took its distributed
    branch there: a FLAVA-style global contrastive head all-gathered the embeddings (logits over twice the batch,
    labels offset by the rank; a false "NUMERICS DIFFER", loss 0.69 apart, against a right program) and
    nn.SyncBatchNorm raised "expected input tensor to be on GPU" on every rank. Copies of the copy keep the
    view (a bound method, rebound by deepcopy). A model whose instance already holds its own `forward` is
    copied without the view."""
    clone = copy_module(model)
    if "forward" not in vars(clone):
        clone.forward = types.MethodType(_one_process_forward, clone)
    return clone


def _one_process_forward(self: torch.nn.Module, *args, **kwargs):
    with one_process_view([]):
        return type(self).forward(self, *args, **kwargs)
