"""Sharded checkpoints of a `ParallelModule` and its optimizer, through torch.distributed.checkpoint (DCP).

As torchtitan does it: every rank hands DCP its LOCAL shards, each described as a DTensor
(`DTensor.from_local(local, mesh, placements, shape=global shape, stride=global stride)`, no copy, no
communication), and DCP writes each rank's part to its own file (`__<rank>_0.distcp`) plus one `.metadata`
file of global shapes and chunk offsets; replicated chunks are written once. DTensor's `Shard(d)` cuts a
dim like `core.layout` does (torch.chunk's split, uneven and empty chunks included; several mesh axes on
one dim split it in mesh-axis order), so uneven shards are described exactly.

- `save(pm, optimizer, path)`: the model's persistent parameters and buffers (canonical names, no aliases)
  and the optimizer state, keyed by parameter FQN (torch.distributed.checkpoint.state_dict's flattened
  form, "state.<fqn>.exp_avg", "param_groups.<fqn>.lr", ...): per-parameter state tensors of the
  parameter's local shape are sharded like the parameter, scalars (Adam's `step`) are replicated.
- `load(pm, optimizer, path)`: the same tree, built from THIS module's plan (any mesh, any plan of the same
  model) and filled in place by DCP, which reads from each saved chunk the part that overlaps each local
  shard: resharding is DCP's planner, not ours. Values come back bitwise.
- `export_full_state_dict(pm, directory)`: the full model, tensor by tensor, as a transformers-style
  sharded safetensors checkpoint (`model.safetensors.index.json` + one `.safetensors` file per tensor,
  every key of the model's `state_dict()`, aliases included): rank 0 receives one tensor's shards from the
  ranks that hold them, writes it and frees it before the next.

Memory: save and load materialise nothing but DCP's own buffers for one saved chunk at a time (a chunk is
at most one full tensor, when it was saved replicated); export holds one full tensor (plus one received
shard) on rank 0. So no rank holds more than its shards plus one tensor.
Optimizer state exists only for parameters with gradients: a frozen parameter has none, saved or loaded.
A checkpoint saved before the optimizer's first step holds its param groups only (saving does not create
state), and loading it leaves the optimizer without state, so training continues as if it never stopped.

Pipeline modules (`runtime.pipeline_module.PipelineModule`) use the same checkpoint format: each stage is a
`ParallelModule` on its (dp, tp) sub-mesh, so every rank hands DCP the shards of the stages it runs, as
DTensors on that stage's sub-mesh, under the model's own FQNs. A tensor several stages hold (a tied
embedding / lm_head, BitPipe's twin copies: equal after `step`) is saved from its first copy on the rank
and loaded into every copy, optimizer state included. The optimizer state is flattened by the same key
scheme as torch's (`state.<fqn>.<key>`, `param_groups.<fqn>.<key>`), written here because torch's
`get_optimizer_state_dict` maps parameters of one module, and a pipeline rank's optimizer spans several
stages. So a checkpoint saved on any plan, pipeline or not, loads into any other plan of the same model.

Private torch API: `DeviceMesh(..., _init_backend=False)` (a mesh that describes ranks without creating
process groups: DTensor metadata needs coordinates only), checked on torch 2.13.0.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from .core.layout import Layout, Shard, local_region
from .rewriter.collectives import carried_view
from .errors import CheckpointFilesError, StateDictError
from .runtime import shard_origin
from .rewriter.spec import mesh_coords
from .runtime.module import ParallelModule
from .runtime.pipeline_module import PipelineModule

__all__ = ["save", "load", "export_full_state_dict", "read_full_state_dict", "INDEX_FILE"]

INDEX_FILE = "model.safetensors.index.json"
"""The index file name transformers' `from_pretrained` looks for in a sharded safetensors checkpoint."""
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def save(pm: ParallelModule | PipelineModule, optimizer: torch.optim.Optimizer | None,
         path: str | os.PathLike) -> None:
    """Write this rank's shards of the model and of `optimizer`'s state to directory `path` (collective: call
    on every rank with the same path; ranks of one machine, or a shared file system). See the module
    docstring for the layout of the checkpoint; `pm` may be a pipeline rank's `PipelineModule`.

    Raises:
        StateDictError: an optimizer state tensor is neither a scalar nor of its parameter's local shape
            (it could not be resharded); a ZeroRedundancyOptimizer (`_refuse_partitioned`).
    """
    _refuse_partitioned(optimizer, "save")
    dcp.save(_tree(pm, optimizer, _optimizer_state(pm, optimizer) if optimizer is not None else None),
             checkpoint_id=str(path))


def _read_metadata(path: str | os.PathLike):
    """DCP's metadata of the checkpoint at `path`, after checking that this rank sees every file it lists.

    Raises:
        CheckpointFilesError: `.metadata` missing (DCP writes it last: a save interrupted before its end has
            none), or data files it lists missing here (a save interrupted on some rank, or node-local storage:
            resuming on another mesh reads files other ranks wrote). Before, DCP's raw FileNotFoundError on the
            ranks lacking a file, mid-load.
    """
    root = Path(path)
    try:
        metadata = dcp.FileSystemReader(str(root)).read_metadata()
    except FileNotFoundError as exc:
        raise CheckpointFilesError(
            f"no checkpoint at {root}: {root / '.metadata'} is missing (DCP writes it after every rank's file, so a "
            "save interrupted before its end has none). Remedy: load an earlier, complete checkpoint, or give the "
            "directory `parallelizer.checkpoint.save` wrote", str(root), [".metadata"]) from exc
    listed = sorted({info.relative_path for info in metadata.storage_data.values()})
    missing = [name for name in listed if not (root / name).is_file()]
    if missing:
        rank = dist.get_rank() if dist.is_initialized() else 0
        raise CheckpointFilesError(
            f"checkpoint {root}: {len(missing)} of the {len(listed)} data files its .metadata lists are missing on "
            f"rank {rank}: {', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}. A save interrupted on some "
            "rank, or storage this rank does not share (node-local disks: a resume on another mesh reads files "
            "other ranks wrote). Remedy: save to and load from a filesystem every rank reads, or load an earlier, "
            "complete checkpoint", str(root), missing)
    return metadata


def load(pm: ParallelModule | PipelineModule, optimizer: torch.optim.Optimizer | None,
         path: str | os.PathLike) -> None:
    """Fill this rank's parameters, buffers and `optimizer` state from the checkpoint at `path`, resharded to
    `pm`'s plan and mesh (collective; a checkpoint of any plan of the same model, pipeline or not).
    `optimizer` must be built over `pm.parameters()`; it ends up holding state for exactly the parameters the
    checkpoint holds state for, as after torch's `Optimizer.load_state_dict` (`_match_saved_state`: state is
    created where missing, `_create_state`, which clears existing gradients, and then overwritten; a parameter
    frozen now keeps its saved state without stepping, one without saved state starts at its first step). On a
    `PipelineModule` every copy of a tensor several stages hold receives the loaded value.

    Raises:
        StateDictError: the checkpoint's keys differ from this model's and optimizer's (lists both sides),
            or a tensor has another global shape (names it, both shapes): on a `PipelineModule` checked against
            the keys of all ranks, so every rank raises it (none enters DCP's collective load alone); an
            optimizer parameter that no stage of a `PipelineModule` holds.
        CheckpointFilesError (a FileNotFoundError): no `.metadata` at `path` (none, or a save interrupted before
            its end), or files it lists missing on this rank (`_read_metadata`), before any tensor is read.
    A checkpoint saved before the optimizer's first step (param groups only) leaves `optimizer` without state.
    Param-group settings come from the checkpoint as `Optimizer.load_state_dict` takes them (`_group_settings`:
    an LR scheduler may be built before or after the load, as on one device).
    A ZeroRedundancyOptimizer raises StateDictError (`_refuse_partitioned`).
    """
    _refuse_partitioned(optimizer, "load")
    metadata = _read_metadata(path)
    # saved before the optimizer's first step: no state to load, and the optimizer must have none either (its
    # first step then initialises it, as in the run that saved)
    stateless = not any(k.startswith("optimizer.state.") for k in metadata.state_dict_metadata)
    if optimizer is not None and stateless:
        optimizer.state.clear()
    elif optimizer is not None:
        _match_saved_state(pm, optimizer, metadata)
    osd = _optimizer_state(pm, optimizer) if optimizer is not None else None
    kept, added = _group_settings(osd, metadata) if osd is not None else ({}, {})
    if osd is not None:
        osd = {**{k: v for k, v in osd.items() if k not in kept}, **added}
    tree = _tree(pm, optimizer, osd)
    _check_against(_all_wanted(pm, tree), metadata, path)
    dcp.load(tree, checkpoint_id=str(path))  # in place: the DTensors share storage with the local tensors
    if added:
        _add_group_settings(pm, optimizer, {k: tree["optimizer"][k] for k in added})
    if isinstance(pm, PipelineModule) or (optimizer is not None and stateless):
        _fill_copies(pm, optimizer, tree)
    elif optimizer is not None:
        local = {k: v.to_local() if isinstance(v, DTensor) else v for k, v in tree["optimizer"].items()}
        # torch's set_optimizer_state_dict skips parameters without requires_grad: their state, loaded in place
        # by DCP above, is put back, as torch's Optimizer.load_state_dict keeps it on one device
        frozen = {p: state for p, state in optimizer.state.items() if not p.requires_grad}
        set_optimizer_state_dict(pm, optimizer, {**kept, **local}, options=_OPTIONS)
        optimizer.state.update(frozen)


def _group_settings(osd: dict, metadata) -> tuple[dict, dict]:
    """Param-group settings (lr, betas, an LR scheduler's 'initial_lr', ...) loaded as torch's
    `Optimizer.load_state_dict` loads them, the saved groups' settings taking over: (this optimizer's flattened
    "param_groups.<fqn>.<key>" entries that the checkpoint lacks -> their current values, kept; the
    checkpoint's entries for parameters of this optimizer that its groups lack -> None, to be loaded and added
    to the groups). So an LR scheduler built after `load` finds the saved 'initial_lr' as on one device (round
    12: the load refused the key difference, StateDictError), and one built before a load of a checkpoint saved
    without it keeps its own."""
    prefix = "optimizer."
    saved = {k[len(prefix):] for k in metadata.state_dict_metadata if k.startswith(prefix + "param_groups.")}
    mine = {k for k in osd if k.startswith("param_groups.")}
    fqns = {k.rpartition(".")[0] for k in mine}
    kept = {k: osd[k] for k in mine - saved}
    added = {k: None for k in saved - mine if k.rpartition(".")[0] in fqns}
    return kept, added


def _add_group_settings(pm: ParallelModule | PipelineModule, optimizer: torch.optim.Optimizer, loaded: dict) -> None:
    """Set each loaded "param_groups.<fqn>.<key>" entry (`_group_settings`' added ones) on the group of <fqn>."""
    for group, _, fqn in _optimizer_params(optimizer, _copies(pm)):
        prefix = f"param_groups.{fqn}."
        group.update({k[len(prefix):]: v for k, v in loaded.items() if k.startswith(prefix)})


def _refuse_partitioned(optimizer: torch.optim.Optimizer | None, what: str) -> None:
    """Raise StateDictError for torch's ZeroRedundancyOptimizer (ZeRO-1, `runtime.zero1`): each rank holds the
    state of its own partition of the parameters in a wrapped optimizer, which this format (state by parameter
    FQN from every rank's optimizer) does not see; saving it wrote the param groups only, and a resume then
    restarted Adam's moments and step count silently (parameters 1.4e-2 to 3.2e-2 off one device, trial r12e)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        raise StateDictError(
            f"parallelizer.checkpoint.{what}: a ZeroRedundancyOptimizer's state is partitioned over its process "
            "group (each rank holds its share in a wrapped optimizer), which this checkpoint does not record. "
            f"Remedy: checkpoint.{what}(pm, None, path) for the model, and torch's recipe for the optimizer, per "
            "replica group: opt.consolidate_state_dict(to=0) on every rank; on each group's first rank (lead = "
            "dist.get_global_rank(pm.process_group('dp'), 0) == dist.get_rank()) torch.save(opt.state_dict(), "
            "f'opt.{lead}.pt'); on resume, after the model's load, every rank opt.load_state_dict(torch.load("
            "f'opt.{lead}.pt')) of its group's first rank (README, ZeRO-1). That resumes on the same plan only (the "
            "state holds this plan's local pieces); to move optimizer state between plans, train with a plain "
            "torch.optim optimizer, whose state this checkpoint reshards",
            missing=[], unexpected=[])


def export_full_state_dict(pm: ParallelModule | PipelineModule, directory: str | os.PathLike,
                           config=None) -> list[str]:
    """Write the full model as a transformers-style sharded safetensors checkpoint in `directory`, one tensor
    at a time (collective: call on every rank). Keys are those of the model's `state_dict()` (tied aliases
    included, each in its own file; non-persistent buffers left out), so `read_full_state_dict(directory)`
    loads into the original model with strict=True, and with `config` (a transformers config: written as
    config.json) `AutoModel...from_pretrained(directory)` reads it.

    On a `PipelineModule` the tensors come from `pm.full_state_dict()`, which gives every rank the whole model
    (for models that fit one device), instead of one tensor at a time.

    Returns the files written (on rank 0; [] on the others).
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    me = dist.get_rank()
    if me == 0:
        directory.mkdir(parents=True, exist_ok=True)
    weight_map, written, total = {}, [], 0
    entries = [(fqn, info) for fqn, info in pm.traced.parameters.items() if info.persistent]
    whole = pm.full_state_dict() if isinstance(pm, PipelineModule) else None
    for i, (fqn, info) in enumerate(entries):
        if whole is not None:
            full = whole[fqn] if me == 0 else None
        else:
            local = pm.get_buffer(fqn) if info.is_buffer else pm.get_parameter(fqn)
            full = _gather_to_first(local.detach(), pm, fqn)
        if full is None:
            continue
        for j, name in enumerate((fqn, *info.aliases)):
            file = f"model-{i + 1:05d}-{j}-of-{len(entries):05d}.safetensors"
            save_file({name: full.contiguous()}, str(directory / file), metadata={"format": "pt"})  # any strides
            weight_map[name] = file
            written.append(str(directory / file))
            total += full.numel() * full.element_size()
        del full
    if me != 0:
        return []
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    if config is not None:
        config.save_pretrained(str(directory))
    return written + [str(directory / INDEX_FILE)]


def read_full_state_dict(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict written by `export_full_state_dict` (all of it in this process's memory)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    index = json.loads((directory / INDEX_FILE).read_text())
    out: dict[str, torch.Tensor] = {}
    for file in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(directory / file)))
    return out


# --------------------------------------------------------------------------------------------- internals
def _mesh(pm: ParallelModule) -> DeviceMesh:
    """The DeviceMesh of `pm`'s ranks (no process groups created)."""
    mesh = pm.spec.mesh
    ranks = torch.arange(mesh.world_size).reshape(mesh.shape) + pm.spec.rank_offset
    return DeviceMesh("cpu", ranks, mesh_dim_names=mesh.axis_names, _init_backend=False)


def _dtensor(local: torch.Tensor, layout: Layout, mesh: DeviceMesh, shape: tuple[int, ...]) -> DTensor:
    stride = torch.empty(shape, device="meta").stride()  # the full tensor's (contiguous) strides
    return DTensor.from_local(local, mesh, list(layout.normalized(len(shape)).placements), run_check=False,
                              shape=torch.Size(shape), stride=stride)


def _create_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """Create `optimizer`'s state for `params` (to be overwritten) by steps with zero gradients and lr 0, as
    torch's `_init_optim_state` does, but one parameter at a time, so that one zero gradient exists at a time
    instead of a gradient for every parameter (a parameter without requires_grad too: its gradient is set
    directly, as torch allows)."""
    if not params:
        return
    lrs = [group.get("lr") for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
    optimizer.zero_grad(set_to_none=True)
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
            optimizer.step()
            p.grad = None
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            if lr is not None:
                group["lr"] = lr


def _match_saved_state(pm: ParallelModule | PipelineModule, optimizer: torch.optim.Optimizer, metadata) -> None:
    """Make `optimizer` hold state for exactly the parameters that have state in the checkpoint, as torch's
    `Optimizer.load_state_dict` leaves them on one device: a parameter without saved state (frozen when saved, or
    never reached by a gradient) has none and starts it at its first step (progressive unfreezing across a
    resume: round 12); one with saved state gets it even when it is frozen now (it keeps that state without
    stepping, and an unfreezing later continues from it). Before, either difference raised StateDictError
    listing the state keys (the second one: round 12's left item)."""
    saved = {key[len("optimizer.state."):].rpartition(".")[0] for key in metadata.state_dict_metadata
             if key.startswith("optimizer.state.")}
    params = list(_optimizer_params(optimizer, _copies(pm)))
    for _, p, fqn in params:
        if fqn not in saved:
            optimizer.state.pop(p, None)
    _create_state(optimizer, [p for _, p, fqn in params if fqn in saved and not optimizer.state.get(p)])


def _copies(pm: ParallelModule | PipelineModule) -> dict[str, list[tuple[ParallelModule, torch.Tensor]]]:
    """fqn -> [(module, local tensor), ...] for every persistent parameter and buffer this rank holds: one entry
    on a `ParallelModule`; on a `PipelineModule` one per stage holding it (tied copies, BitPipe twins), the
    first of which is saved."""
    out: dict[str, list[tuple[ParallelModule, torch.Tensor]]] = {}
    for module in (pm.run.stages if isinstance(pm, PipelineModule) else [pm]):
        for fqn, info in module.traced.parameters.items():
            if info.persistent:
                local = module.get_buffer(fqn) if info.is_buffer else module.get_parameter(fqn)
                out.setdefault(fqn, []).append((module, local))
    return out


def _optimizer_state(pm: ParallelModule | PipelineModule, optimizer: torch.optim.Optimizer) -> dict:
    """torch's flattened, FQN-keyed optimizer state dict of `pm`'s local parameters (module docstring: on a
    `PipelineModule` built here by the same keys, each tensor's first copy only)."""
    if not isinstance(pm, PipelineModule) and optimizer.state:
        # without the record of which pieces a per-rank state dict holds (`runtime.shard_origin`): a checkpoint
        # is resharded onto whatever pieces the loading plan holds
        return {k: v for k, v in get_optimizer_state_dict(pm, optimizer, options=_OPTIONS).items()
                if not k.endswith("." + shard_origin.KEY)}
    # (torch's get_optimizer_state_dict would first create the state of an optimizer that has none by a step
    # with zero gradients: Adam's step count 1 before the first real step, a silently different training run
    # after a checkpoint saved before the first step. Without state only the param groups are written.)
    copies = _copies(pm)
    out = {}
    for group, p, fqn in _optimizer_params(optimizer, copies):
        if copies[fqn][0][1] is not p:
            continue  # a second copy of a tied / twinned parameter: saved from its first copy
        out.update({f"state.{fqn}.{k}": v for k, v in optimizer.state.get(p, {}).items()})
        out.update({f"param_groups.{fqn}.{k}": v for k, v in group.items() if k not in ("params", shard_origin.KEY)})
    return out


def _optimizer_params(optimizer: torch.optim.Optimizer, copies: dict):
    """(param group, parameter, its model FQN) for every parameter of `optimizer` (`copies`: `_copies`).

    Raises StateDictError for a parameter the module does not hold."""
    fqn_of = {id(local): fqn for fqn, held in copies.items() for _, local in held}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in fqn_of:
                raise StateDictError(f"the optimizer holds a parameter of shape {tuple(p.shape)} that no stage of this "
                                     "PipelineModule holds. Remedy: build the optimizer over pm.parameters()")
            yield group, p, fqn_of[id(p)]


def _tree(pm: ParallelModule | PipelineModule, optimizer, osd: dict | None) -> dict:
    """{"model": {fqn: DTensor}, "optimizer": {flattened key: DTensor | tensor | value}} over local storage
    (on a `PipelineModule`, the first copy of each tensor, a DTensor on its stage's sub-mesh)."""
    meshes: dict[int, DeviceMesh] = {}
    model, holder = {}, {}
    for fqn, ((module, local), *_) in _copies(pm).items():
        if id(module) not in meshes:
            meshes[id(module)] = _mesh(module)
        holder[fqn] = (module, meshes[id(module)])
        model[fqn] = _dtensor(local.detach(), module.spec.params[fqn], meshes[id(module)],
                              tuple(module.traced.parameters[fqn].shape))
    tree = {"model": model}
    if osd is not None:
        tree["optimizer"] = {key: _state_entry(holder, key, value) for key, value in osd.items()}
    return tree


def _fill_copies(pm: ParallelModule | PipelineModule, optimizer, tree: dict) -> None:
    """After DCP loaded the first copies in place: every copy of each tensor, every copy's optimizer state
    (tensors in place, other values assigned) and each parameter group's hyperparameters (lr, betas, ...).
    Also used for a ParallelModule's checkpoint saved before the first optimizer step (param groups only)."""
    copies = _copies(pm)
    with torch.no_grad():
        for (_, first), *others in copies.values():
            for _, local in others:
                local.copy_(first)
    if optimizer is None:
        return
    loaded = {k: v.to_local() if isinstance(v, DTensor) else v for k, v in tree["optimizer"].items()}
    for group, p, fqn in _optimizer_params(optimizer, copies):
        state = optimizer.state.get(p, {})
        for key in list(state):
            value = loaded.get(f"state.{fqn}.{key}")
            if isinstance(state[key], torch.Tensor) and isinstance(value, torch.Tensor):
                state[key].copy_(value)  # the first copy's tensor is `value` itself (loaded in place)
            elif value is not None:
                state[key] = value
        group.update({k: loaded[f"param_groups.{fqn}.{k}"] for k in group
                      if k != "params" and f"param_groups.{fqn}.{k}" in loaded})


def _wanted(tree: dict) -> dict[str, tuple[int, ...] | None]:
    """"<top>.<key>" -> the global shape of each tensor loaded into (None for other values)."""
    return {f"{top}.{key}": tuple(value.shape) if isinstance(value, torch.Tensor) else None
            for top, entries in tree.items() for key, value in entries.items()}


def _all_wanted(pm: ParallelModule | PipelineModule, tree: dict) -> dict[str, tuple[int, ...] | None]:
    """The keys (and global shapes) loaded into, of ALL ranks on a `PipelineModule` (each rank holds only its
    stages' part; gathered under the default group's timeout), so that every rank checks the same set and
    raises the same error: a key only some ranks miss (a deeper model's last stage) or a shape only some
    ranks hold must not let the other ranks enter DCP's collective load alone (a hang). This rank's
    otherwise (every rank of a `ParallelModule` holds every key)."""
    mine = _wanted(tree)
    if not isinstance(pm, PipelineModule):
        return mine
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    merged: dict = {}
    for wanted in everyone:
        merged.update(wanted)
    return merged


def _state_entry(holder: dict[str, tuple[ParallelModule, DeviceMesh]], key: str, value):
    """A flattened optimizer-state entry: a per-parameter tensor becomes a DTensor sharded like its parameter
    (`holder`: fqn -> the module whose copy is saved, and its mesh)."""
    if not isinstance(value, torch.Tensor) or not key.startswith("state.") or value.ndim == 0:
        return value
    fqn = key[len("state."):].rpartition(".")[0]
    pm, mesh = holder.get(fqn, (None, None))
    info = pm.traced.parameters.get(fqn) if pm is not None else None
    if info is None or tuple(value.shape) != tuple(pm.get_parameter(fqn).shape):
        raise StateDictError(
            f"optimizer state {key!r} has shape {tuple(value.shape)}, which is neither a scalar nor the local shape "
            f"of its parameter ({None if info is None else tuple(pm.get_parameter(fqn).shape)}), so it cannot be "
            "saved as a shard of the parameter's layout. Remedy: use an optimizer whose state is per element "
            "(SGD, Adam, AdamW, ...)")
    return _dtensor(value, pm.spec.params[fqn], mesh, tuple(info.shape))


def _check_against(wanted: dict[str, tuple[int, ...] | None], metadata, path) -> None:
    """Raise StateDictError when the checkpoint's keys or global shapes differ from `wanted` ("<top>.<key>" ->
    global shape or None, `_all_wanted`: the same on every rank, so every rank raises alike)."""
    saved = metadata.state_dict_metadata
    tops = {k.split(".")[0] for k in wanted}
    missing = sorted(k for k in wanted if k not in saved)
    unexpected = sorted(k for k in saved if k not in wanted and k.split(".")[0] in tops)
    if missing or unexpected:
        raise StateDictError(
            f"checkpoint {str(path)!r}: {len(missing)} key(s) this model/optimizer needs are not in it {missing[:8]}, "
            f"{len(unexpected)} key(s) in it are not in this model/optimizer {unexpected[:8]}. Remedy: load with "
            "the model and optimizer configuration the checkpoint was saved with (a frozen parameter has no "
            "optimizer state)", missing=missing, unexpected=unexpected)
    for key, shape in sorted(wanted.items()):
        size = getattr(saved[key], "size", None)
        if shape is not None and size is not None and tuple(size) != shape:
            raise StateDictError(
                f"checkpoint {str(path)!r}: {key!r} has global shape {tuple(size)} there but {shape} "
                "here. Remedy: load into a model of the configuration the checkpoint was saved from")


def _gather_to_first(local: torch.Tensor, pm: ParallelModule, fqn: str) -> torch.Tensor | None:
    """The full tensor `fqn` on the mesh's first rank (None elsewhere): each rank that holds a distinct chunk
    (coordinate 0 on the axes that replicate the tensor) sends it; the first rank receives into place. Uses
    the default group's timeout for every send/recv."""
    spec, info = pm.spec, pm.traced.parameters[fqn]
    mesh, layout, shape = spec.mesh, spec.params[fqn], tuple(info.shape)
    first = spec.rank_offset
    owners = []
    for r in range(mesh.world_size):
        coords = mesh_coords(mesh, r)
        if all(c == 0 for c, p in zip(coords, layout) if not isinstance(p, Shard)):
            owners.append((r + spec.rank_offset, local_region(shape, layout, mesh, coords)))
    me = dist.get_rank()
    if me != first:
        if any(r == me for r, (_, lengths) in owners if 0 not in lengths):
            dist.send(carried_view(local.contiguous()), dst=first)
        return None
    full = torch.empty(shape, dtype=local.dtype)
    for r, (starts, lengths) in owners:
        if 0 in lengths:  # an empty chunk (uneven shards)
            continue
        target = full
        for d, (s, n) in enumerate(zip(starts, lengths)):
            target = target.narrow(d, s, n)
        if r == me:
            target.copy_(local)
        elif target.is_contiguous():
            dist.recv(carried_view(target), src=r)
        else:
            piece = torch.empty(lengths, dtype=local.dtype)
            dist.recv(carried_view(piece), src=r)
            target.copy_(piece)
    return full


