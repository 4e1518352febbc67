"""Norms of a local piece (or its gradient) over a dim its layout shards: refused, since they read this rank's piece.

`pm.parameters()` and each parameter's `.grad` are this rank's local pieces. A norm reduced over a dim the layout
shards (`NORMS`: `torch.linalg.vector_norm` / `matrix_norm` / `norm`, and through them `torch.norm`, `Tensor.norm`,
`F.normalize`) reads this rank's piece only, so user code that normalises or logs by it got other numbers than one
device, silently (round 27, r27f; Conv1d -> Linear on 2 gloo ranks, fsdp dp=2 / tp=2): `p.div_(p.norm())`,
`p.grad.norm()` for logging, timm's adaptive gradient clipping (`p.norm(dim=(1, ...))` of a column-sharded
weight), a row normalisation over tp's sharded columns. Refused there, with the remedies
(`torch.nn.utils.get_total_norm([p])` or `([p.grad])` gives the full tensor's norm, collectively; `with
pm.full_model()`); a norm over dims the layout keeps whole (the per-row norms of a row-sharded weight) and any norm
under ddp run. A norm of a view of a piece (`w.data[0].norm()`, a flattening) is refused on a sharded layout: its
elements are chosen by local indices (`part_writes`' rule for writes). So is `renorm` / `renorm_` (`RENORMS`,
r27fg) where the dims it reduces (every dim but `dim`) include a sharded one.

Not intercepted: statistics through another op first (`p.grad.abs().max()`, `p.pow(2).sum()`: the first op makes a
fresh tensor), and a name bound before `install()` (`from torch.linalg import vector_norm`), as for torch.nn.init.
Which piece a tensor lies in is `grad_norm.owner_of_memory(t, grads=True)` (one dictionary look-up on any other
tensor); the emitted programs run aten ops, not these Python functions, so a step of `pm` pays nothing.
"""
from __future__ import annotations

import functools

import torch

from ..errors import UnsupportedOpError
from .grad_norm import owner_of, owner_of_memory
from .part_writes import sharded_dims

NORMS = {"vector_norm": None, "matrix_norm": (-2, -1), "norm": None}
"""torch.linalg's norms and the dims each reduces by default (None: all)."""
RENORMS = ("renorm", "renorm_")
"""torch.Tensor's (and torch's, for `renorm`) per-slice norm projections: `w.renorm_(p, dim, maxnorm)` scales each
slice along `dim` by its norm over every OTHER dim (r27fg: a member r27f's table lacked; `torch.renorm` is named in
docs/reference.md as a projection of whole tensors)."""


def refuse_statistic(call: str, t: torch.Tensor, dim, piece: torch.Tensor, owner) -> None:
    """Raise UnsupportedOpError when statistic `call` of `t` (in the memory of `piece`, a registered local parameter
    or its gradient, with `owner`: `grad_norm.Owner`) over dims `dim` (None or (): all, torch's reading; an int or a
    sequence of ints) reads only this rank's piece along a dim the layout shards: the reduction covers a sharded
    dim, or `t` is another view of `piece` (a row, a flattening: its elements are chosen by local indices)."""
    sharded = set(sharded_dims(piece, owner))
    if not sharded:
        return
    whole = (tuple(t.shape) == tuple(piece.shape) and t.stride() == piece.stride()
             and t.data_ptr() == piece.data_ptr())
    listed = (dim,) if isinstance(dim, int) else tuple(dim or ())
    dims = {d % max(t.ndim, 1) for d in listed} if listed else set(range(t.ndim))
    if whole and not dims & sharded:
        return
    what = "" if owner_of(piece) is not None else "the gradient of "
    over = (f"over dim(s) {sorted(dims)}, which include sharded dim(s) {sorted(dims & sharded)}," if whole else
            f"of a view {tuple(t.shape)} chosen by local indices,")
    raise UnsupportedOpError(
        f"{call} of {what}{owner.fqn!r} {over} on a local shard (this rank holds {tuple(piece.shape)} of "
        f"{owner.shape}, stored as {owner.layout} on mesh {owner.mesh}): it reads only this rank's piece, so the "
        "value is not one device's (and differs across ranks). Remedy: torch.nn.utils.get_total_norm([p]) or "
        "([p.grad]) gives the norm of the full tensor (collective: call it on every rank), pm.clip_grad_norm_ "
        "clips by the global norm; other statistics of whole tensors run inside `with pm.full_model() as model:` "
        "(collective); a norm over dims the layout keeps whole runs as it is")


def _checked_norm(name: str, original):
    default = NORMS[name]

    @functools.wraps(original)
    def norm(input, *args, **kwargs):
        held = owner_of_memory(input, grads=True) if isinstance(input, torch.Tensor) else None
        if held is not None:
            dim = args[1] if len(args) > 1 else kwargs.get("dim", default)
            refuse_statistic(f"torch.linalg.{name}", input, dim, *held)
        return original(input, *args, **kwargs)

    norm._parallelizer_checked = True
    return norm


def _checked_renorm(call: str, original):
    @functools.wraps(original)
    def renorm(input, *args, **kwargs):
        held = owner_of_memory(input, grads=True) if isinstance(input, torch.Tensor) and input.ndim > 1 else None
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if held is not None and isinstance(dim, int):  # a 1-D renorm is elementwise: exact on any piece
            refuse_statistic(call, input, [d for d in range(input.ndim) if d != dim % input.ndim], *held)
        return original(input, *args, **kwargs)

    renorm._parallelizer_checked = True
    return renorm


def install() -> None:
    """Wrap the `NORMS` of torch.linalg, the `RENORMS` of torch.Tensor and `torch.renorm` (once per process;
    `init_check.install`, which every ParallelModule calls)."""
    for name in NORMS:
        original = getattr(torch.linalg, name)
        if not getattr(original, "_parallelizer_checked", False):
            setattr(torch.linalg, name, _checked_norm(name, original))
    for owner, name in [(torch.Tensor, n) for n in RENORMS] + [(torch, "renorm")]:
        original = getattr(owner, name)
        if not getattr(original, "_parallelizer_checked", False):
            call = f"torch.Tensor.{name}" if owner is torch.Tensor else f"torch.{name}"
            setattr(owner, name, _checked_renorm(call, original))
