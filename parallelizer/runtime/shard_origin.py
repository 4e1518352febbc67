"""Which piece of each tensor a per-rank state dict holds, so that a rank never loads another rank's pieces.

`pm.state_dict()` and an optimizer's `state_dict()` over `pm.parameters()` hold this rank's LOCAL pieces (shards
under tp / fsdp, whole tensors under ddp). DDP's checkpoint recipe, "rank 0 saves, every rank loads that file",
then gives every rank rank 0's shards: they have the same shapes, so `load_state_dict` took them and training went
on from other numbers, silently (a 5-layer MLP, resumed at step 2 of 4 with AdamW: parameters 0.49 off one device
on tp=2, 0.48 on fsdp dp=2). The same holds for a state dict saved under another plan whose local shapes happen
to agree, and an optimizer state saved on another world size raised torch's size-mismatch error mid-step.

Each such state dict now records, per tensor, the piece it holds: `(global shape, starts, lengths)` of
`core.layout.local_region` (so equal pieces compare equal whatever the plan: a ddp state dict loads on any rank;
shards load only where the same rows are held):
- a module: in `state_dict._metadata[prefix]` (where torch keeps each module's version; `torch.save` / `torch.load`
  keep it), written by `ParallelModule._save_to_state_dict` and checked by its `_load_from_state_dict` before
  anything is copied;
- an optimizer: in each saved param group (`PIECES`, aligned with its "params"), by a state_dict post-hook
  `runtime.optimizer_check` adds at an optimizer's first step; torch's `load_state_dict` keeps a saved group's
  keys, so the check runs at the next `step()`, before anything is stepped.
A state dict without the record (made by hand, or by an older version) is loaded as before.
"""
from __future__ import annotations

import torch

from ..core.layout import Layout, local_region
from ..core.mesh import MeshSpec
from ..errors import StateDictError

KEY = "parallelizer_pieces"
"""The key of the record: in a module's `_metadata` entry, and in an optimizer's saved param groups."""

Piece = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
"""(global shape, starts, lengths) of the part of a tensor one rank holds."""

REMEDY = ("Remedy: save on every rank to a file of its own (e.g. f'ckpt-rank{dist.get_rank()}.pt') and load it on "
          "the same rank and plan; or parallelizer.checkpoint.save(pm, opt, dir) / load(pm, opt, dir), which reshards "
          "model and optimizer state onto any plan or world size; or pm.full_state_dict() on every rank -> "
          "pm.load_full_state_dict(sd) for the model alone")


def piece(shape: tuple[int, ...], layout: Layout, mesh: MeshSpec, coords: tuple[int, ...]) -> Piece:
    """The piece of a tensor of global `shape` that the rank at mesh `coords` holds under stored `layout`."""
    starts, lengths = local_region(tuple(shape), layout, mesh, coords)
    return tuple(shape), starts, lengths


def process_rank(mesh_rank: int) -> int:
    """This process's global rank (a pipeline stage's `rank` is its rank on the stage's sub-mesh)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else mesh_rank


def describe(p: Piece) -> str:
    shape, starts, lengths = p
    if tuple(lengths) == tuple(shape):
        return f"the whole {tuple(shape)} tensor"
    rows = ", ".join(f"{s}:{s + n}" for s, n in zip(starts, lengths))
    return f"[{rows}] of {tuple(shape)}"


def check(where: str, mine: dict[str, Piece], saved: dict[str, Piece], rank_note: str) -> None:
    """Raise StateDictError naming the first tensor whose saved piece is not the one this rank holds.

    Args:
        where: what is loading ("ParallelModule.load_state_dict", "AdamW.load_state_dict").
        mine / saved: name -> piece, this rank's now and the state dict's; names only in one are not compared.
    """
    differ = [name for name in saved if name in mine and tuple(map(tuple, saved[name])) != mine[name]]
    if not differ:
        return
    first = differ[0]
    raise StateDictError(
        f"{where}: the state dict holds another rank's or plan's piece of {len(differ)} tensor(s), e.g. {first!r}: "
        f"saved {describe(saved[first])}, but this rank holds {describe(mine[first])}{rank_note}. Loading it would "
        "train from other numbers than one device. " + REMEDY, missing=[], unexpected=[])


def module_pieces(pm) -> dict[str, Piece]:
    """Name -> this rank's piece for every tensor of a ParallelModule's `state_dict()` (tied aliases included)."""
    out = {}
    for fqn, info in pm.traced.parameters.items():
        if info.persistent:
            p = piece(tuple(info.shape), pm.spec.params[fqn], pm.spec.mesh, pm.coords)
            for name in (fqn, *info.aliases):
                out[name] = p
    return out


def stamp_optimizer(optimizer: torch.optim.Optimizer, state_dict: dict, owner_of) -> dict:
    """An optimizer state_dict post-hook: record in each saved param group the piece of each of its parameters
    (None for a parameter no parallel module registered). `owner_of(p)` -> `grad_norm.Owner` or None."""
    for group, saved in zip(optimizer.param_groups, state_dict["param_groups"]):
        record = []
        for p in group["params"]:
            o = owner_of(p)
            record.append(None if o is None or o.coords is None else (o.fqn, piece(tuple(o.shape), o.layout, o.mesh,
                                                                                    o.coords)))
        saved[KEY] = record
    return state_dict


def check_optimizer(optimizer: torch.optim.Optimizer, owner_of) -> None:
    """Before a step: compare each param group's loaded record (`stamp_optimizer`) with the pieces its parameters
    hold now, then drop the record. Raises StateDictError (nothing stepped)."""
    for group in optimizer.param_groups:
        record = group.pop(KEY, None)
        if record is None:
            continue
        mine, saved = {}, {}
        for p, entry in zip(group["params"], record):
            o = owner_of(p)
            if entry is not None and o is None and not _whole(entry[1]):
                _refuse_into_whole(optimizer, p, *entry)
            if entry is None or o is None or o.coords is None:
                continue
            fqn, was = entry
            mine[o.fqn] = piece(tuple(o.shape), o.layout, o.mesh, o.coords)
            saved[o.fqn] = was
            if fqn != o.fqn:
                raise StateDictError(
                    f"{type(optimizer).__name__}.load_state_dict: the optimizer state saved for {fqn!r} was loaded "
                    f"into parameter {o.fqn!r} (the parameters are in another order than when it was saved). "
                    "Remedy: build the optimizer over the parameters in the same order and groups as the one that "
                    "saved it, or use parallelizer.checkpoint.save / load (optimizer state by parameter name)",
                    missing=[], unexpected=[])
        check(f"{type(optimizer).__name__}.load_state_dict", mine, saved, "")


def _refuse_into_whole(optimizer: torch.optim.Optimizer, p: torch.Tensor, fqn: str, was: Piece) -> None:
    """A per-rank optimizer state holding a piece of `fqn` was loaded into an optimizer over a tensor that no parallel
    module holds (the model on one device, resumed from a rank's `opt.state_dict()`): before, AdamW raised torch's
    "The size of tensor a (16) must match the size of tensor b (32)" mid-step (trial r14c), or, where the piece
    broadcast against the tensor, would step it with one rank's moments."""
    raise StateDictError(
        f"{type(optimizer).__name__}.load_state_dict: the optimizer state holds one rank's piece {describe(was)} of "
        f"{fqn!r}, saved from a parallel module's optimizer, but was loaded into an optimizer over a tensor of shape "
        f"{tuple(p.shape)} that no parallel module holds (e.g. the model on one device). The other ranks' pieces are "
        "not in it. Remedy: parallelizer.checkpoint.save(pm, opt, dir) on every rank, then on one device "
        "pm1 = parallelizer.auto_parallelize(model, inputs) (no launcher: one device), opt1 over pm1.parameters(), "
        "parallelizer.checkpoint.load(pm1, opt1, dir) (it reshards model and optimizer state); or, for the weights "
        "alone, model.load_state_dict(pm.full_state_dict()) and a new optimizer", missing=[], unexpected=[])


# --- torch.distributed.checkpoint called directly on per-rank pieces ---------------------------------------------
# DCP takes a plain tensor under the same key on every rank for a replicated one: it writes one rank's copy and loads
# it into every rank, so `dcp.save({"model": pm.state_dict()})` then `dcp.load(...)` gave every rank one rank's shards
# (an MLP on tp=2: parameters 0.34 / 0.47 off on ranks 0 / 1 after a save-load round trip, silently). Pieces of
# sharded tensors are marked when `pm.state_dict()` hands them out (`mark`), and DCP's save and load refuse them.

_MARK = "_parallelizer_piece"
_DCP_PATCHED: list[bool] = []
_PLAIN_LOAD_PATCHED: list[bool] = []


def _whole(p: Piece) -> bool:
    return tuple(p[2]) == tuple(p[0])


def mark(pm, state_dict: dict, prefix: str) -> None:
    """Tag the tensors of `pm.state_dict()` that are pieces of sharded tensors with their piece (in-process only)."""
    for name, p in module_pieces(pm).items():
        value = state_dict.get(prefix + name)
        if isinstance(value, torch.Tensor) and not _whole(p):
            setattr(value, _MARK, p)


def _local_pieces(tree, path: str = ""):
    """Paths in a (nested) state dict of tensors marked as pieces (`mark`) and of optimizer states recording pieces
    (`stamp_optimizer`); DTensors (global by construction: `parallelizer.checkpoint`'s trees) are not pieces."""
    from torch.distributed.tensor import DTensor

    if isinstance(tree, torch.Tensor):
        if not isinstance(tree, DTensor) and getattr(tree, _MARK, None) is not None:
            yield path
    elif isinstance(tree, dict):
        for group in tree.get("param_groups", ()) if isinstance(tree.get("param_groups"), list) else ():
            if isinstance(group, dict) and any(e is not None and not _whole(e[1]) for e in group.get(KEY) or ()):
                yield f"{path}param_groups"
                break
        for key, value in tree.items():
            yield from _local_pieces(value, f"{path}{key}.")
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _local_pieces(value, f"{path}{i}.")


def refuse_local_pieces(state_dict, where: str) -> None:
    """Raise StateDictError when `state_dict` (given to torch.distributed.checkpoint) holds per-rank pieces."""
    found = list(_local_pieces(state_dict))
    if found:
        raise StateDictError(
            f"torch.distributed.checkpoint.{where} of {len(found)} per-rank piece(s) of sharded tensors, e.g. "
            f"{found[0].rstrip('.')!r}: pm.state_dict() and its optimizer's state_dict() hold this rank's shards as "
            "plain tensors, which DCP takes for replicated copies (it writes one rank's and loads it into every "
            "rank). Remedy: parallelizer.checkpoint.save(pm, opt, dir) / load(pm, opt, dir), which hand DCP the "
            "shards as DTensors (and reshard onto any plan)", missing=[], unexpected=[])


def install_dcp_guard() -> None:
    """Wrap DCP's save and load (module globals its public functions call, so names imported earlier are covered
    too) with `refuse_local_pieces`; once per process."""
    if _DCP_PATCHED:
        return
    from torch.distributed.checkpoint import state_dict_loader, state_dict_saver

    to_state_dict, load = state_dict_saver._stateful_to_state_dict, state_dict_loader._load_state_dict

    def guarded_to_state_dict(state_dict):
        out = to_state_dict(state_dict)
        refuse_local_pieces(out, "save")
        return out

    def guarded_load(state_dict, *args, **kwargs):
        refuse_local_pieces(state_dict, "load")
        return load(state_dict, *args, **kwargs)

    state_dict_saver._stateful_to_state_dict = guarded_to_state_dict
    state_dict_loader._load_state_dict = guarded_load
    _DCP_PATCHED.append(True)


def _recorded_pieces(state_dict) -> dict[str, Piece]:
    """Key -> piece of every tensor of `state_dict` that a ParallelModule recorded as a piece of a sharded tensor:
    the in-process marks (`mark`) and the `_metadata` record (`_save_to_state_dict`, kept by torch.save)."""
    found = {key: getattr(value, _MARK) for key, value in state_dict.items()
             if isinstance(value, torch.Tensor) and getattr(value, _MARK, None) is not None}
    for prefix, entry in (getattr(state_dict, "_metadata", None) or {}).items():
        for name, p in ((entry or {}).get(KEY) or {}).items():
            key = f"{prefix}.{name}" if prefix else name
            if key in state_dict and not _whole(p):
                found.setdefault(key, p)
    return found


def refuse_pieces_in_plain_module(module: torch.nn.Module, state_dict, error: RuntimeError) -> None:
    """Raise StateDictError (from torch's `error`) when `module` is not a parallel module and `state_dict` holds a
    ParallelModule's local pieces of sharded tensors (`_recorded_pieces`): `model.load_state_dict(pm.state_dict())`
    on fsdp / tp gave torch's bare "size mismatch" naming only shapes (round 20's trial, defect 4)."""
    from .module import ParallelModule  # (they import this module)
    from .pipeline_module import PipelineModule

    if isinstance(module, (ParallelModule, PipelineModule)):  # their own refusals name their remedies
        return
    found = _recorded_pieces(state_dict) if hasattr(state_dict, "items") else {}
    if not found:
        return
    key, (shape, _, lengths) = next(iter(found.items()))
    raise StateDictError(
        f"{type(module).__name__}.load_state_dict of a parallel module's state_dict(): {len(found)} tensor(s) are "
        f"this rank's pieces of sharded tensors, e.g. {key!r} {tuple(lengths)} of the model's {tuple(shape)} "
        "(pm.state_dict() holds local shards, for resuming pm itself on the same rank and plan). Remedy: "
        "model.load_state_dict(pm.full_state_dict()) (collective: call it on every rank; it gives the model's own "
        "keys and full shapes), or parallelizer.checkpoint.export_full_state_dict(pm, dir) then "
        "model.load_state_dict(parallelizer.checkpoint.read_full_state_dict(dir)) for a file",
        missing=[], unexpected=[]) from error


def install_plain_load_guard() -> None:
    """Wrap `nn.Module.load_state_dict` so that a failing load of a parallel module's local pieces into a plain
    module raises `refuse_pieces_in_plain_module`'s StateDictError (a RuntimeError, as torch's) instead of torch's
    bare size mismatch; a load that succeeds, or fails for another reason, is untouched. Once per process
    (torch offers no global load_state_dict hook; a module's own pre-hooks are the user's model's)."""
    if _PLAIN_LOAD_PATCHED:
        return
    load = torch.nn.Module.load_state_dict

    def guarded_load(self, state_dict, *args, **kwargs):
        try:
            return load(self, state_dict, *args, **kwargs)
        except StateDictError:
            raise
        except RuntimeError as error:
            refuse_pieces_in_plain_module(self, state_dict, error)
            raise

    guarded_load.__doc__, guarded_load.__wrapped__ = load.__doc__, load
    torch.nn.Module.load_state_dict = guarded_load
    _PLAIN_LOAD_PATCHED.append(True)
