"""A ParallelModule's state dicts: this rank's local shards (`state_dict` / `load_state_dict`, marked with the pieces
they hold, `runtime.shard_origin`) and the model's full tensors (`full_state_dict` / `load_full_state_dict`).
Mixed into `runtime.module.ParallelModule` (split out of `runtime/module.py` in round 24, over 600 lines; no behaviour
changed); expects its `traced`, `spec`, `groups`, `coords`, `_local_shapes` and `_registered`.
"""
from __future__ import annotations

import torch
from torch.nn.modules.module import _IncompatibleKeys

from ..errors import StateDictError
from ..rewriter.state import gather_tensor, shard_tensor
from . import shard_origin
from .module_contract import check_state_keys
from .stale_model import tag_snapshot


class ShardedState:
    """The state-dict methods of `ParallelModule` (module docstring)."""

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Gather every tensor of the model's `state_dict()` to its full value (collective: call on all ranks).

        Keys are exactly those of the original model's `state_dict()` (tied aliases included, non-persistent
        buffers and tensors created in forward left out), so `model.load_state_dict(sd, strict=True)` works
        on the unparallelised model. Every rank holds every full tensor: for models that fit one device;
        `parallelizer.checkpoint` saves and exports tensor by tensor. Like `nn.Module.state_dict`, a tensor
        stored replicated shares storage with the live parameter: clone it to keep a snapshot.
        """
        out = {}
        for fqn, info in self.traced.parameters.items():
            if not info.persistent:
                continue
            local = self._registered(fqn)
            full = gather_tensor(local, self.spec.params[fqn], self.spec.mesh, self.groups, tuple(info.shape),
                                 self.coords)
            for name in (fqn, *info.aliases):
                out[name] = full
        return tag_snapshot(self, out)

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """`nn.Module.state_dict` (this rank's local pieces), whose pieces of sharded tensors are marked so that
        torch.distributed.checkpoint refuses them (`shard_origin.install_dcp_guard`)."""
        out = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        shard_origin.mark(self, out, prefix)
        return out

    def _save_to_state_dict(self, destination, prefix: str, keep_vars: bool) -> None:
        """nn.Module's hook for this module's own tensors (it has none: its submodules hold them), used to record
        in the state dict's metadata which piece of each tensor this rank holds (`runtime.shard_origin`), so that
        loading it on another rank or plan is refused instead of training from another rank's shards."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        metadata = getattr(destination, "_metadata", None)
        if metadata is not None:
            entry = metadata.setdefault(prefix[:-1], {})
            entry[shard_origin.KEY] = shard_origin.module_pieces(self)
            entry[shard_origin.KEY + "_rank"] = shard_origin.process_rank(self.rank)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        """Refuse (StateDictError, before anything is copied: torch loads this module before its submodules) a
        state dict that records other pieces than this rank holds (`_save_to_state_dict`): rank 0's file
        loaded on every rank, or a file saved under another plan."""
        saved = local_metadata.get(shard_origin.KEY)
        if saved is not None:
            loaded = {name: value for name, value in saved.items() if prefix + name in state_dict}
            by = local_metadata.get(shard_origin.KEY + "_rank")
            shard_origin.check(f"{type(self).__name__}.load_state_dict", shard_origin.module_pieces(self), loaded,
                               f" (saved by rank {by}, loaded on rank {shard_origin.process_rank(self.rank)})"
                               if by is not None else "")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """`nn.Module.load_state_dict` of LOCAL shards (what `pm.state_dict()` holds on this rank).

        Raises:
            StateDictError: a tensor has the full shape of the model's tensor where this rank holds a shard
                (a state dict of the unparallelised model): names it and the remedy, `load_full_state_dict`.
                Before, torch's "size mismatch" RuntimeError named only the shapes (tp, fsdp); under ddp it
                loads, as local and full shapes are equal.
        """
        expected, _, _ = check_state_keys(self.traced, state_dict, False, "load_state_dict")
        full = [key for key, value in state_dict.items() if key in expected and isinstance(value, torch.Tensor)
                and tuple(value.shape) == tuple(self.traced.parameters[expected[key]].shape)
                != self._local_shapes.get(expected[key], tuple(value.shape))]
        # a ParallelModule's state dict (it records its pieces, `_save_to_state_dict`) whose whole tensors are shards
        # here was saved on another plan, not by the unparallelised model: `_load_from_state_dict` names that
        recorded = ((getattr(state_dict, "_metadata", None) or {}).get("") or {}).get(shard_origin.KEY) is not None
        if full and not recorded:
            raise StateDictError(
                f"load_state_dict: {len(full)} tensor(s) have the model's full shape where this rank holds a shard, "
                f"e.g. {full[0]!r} {tuple(state_dict[full[0]].shape)} (local shard "
                f"{self._local_shapes[expected[full[0]]]}): pm.load_state_dict takes this rank's local shards, as "
                "pm.state_dict() gives them. Remedy: pm.load_full_state_dict(state_dict, strict=...) for a state "
                "dict of the unparallelised model (each rank cuts its shards), or parallelizer.checkpoint.load "
                "for a sharded checkpoint", missing=[], unexpected=[])
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True) -> _IncompatibleKeys:
        """Copy this rank's shard of each full tensor in `state_dict` (the model's `state_dict()` keys) into the
        local parameters and buffers. No communication.

        A tied tensor is read from its canonical key or, when absent, from one of its aliases.
        Returns (missing_keys, unexpected_keys) like `nn.Module.load_state_dict`.
        Raises:
            StateDictError: with strict=True, keys missing or unexpected (lists them); in any case a tensor
                whose shape is not the model's (names it, both shapes, and what to do).
        """
        expected, missing, unexpected = check_state_keys(self.traced, state_dict, strict, "load_full_state_dict")
        loadable = {fqn: next((state_dict[n] for n in (fqn, *self.traced.parameters[fqn].aliases) if n in state_dict),
                              None) for fqn in set(expected.values())}
        for fqn, value in loadable.items():
            shape = tuple(self.traced.parameters[fqn].shape)
            if value is not None and tuple(value.shape) != shape:
                raise StateDictError(
                    f"load_full_state_dict: {fqn!r} has shape {tuple(value.shape)} in the state dict but {shape} in "
                    "the model. Remedy: load a state dict saved from a model of the same configuration (or build "
                    "the model with the configuration the checkpoint was saved from)", missing=[], unexpected=[])
        with torch.no_grad():
            for fqn, value in loadable.items():
                if value is None:
                    continue
                local = self._registered(fqn)
                local.copy_(shard_tensor(value, self.spec.params[fqn], self.spec.mesh, self.coords))
        return _IncompatibleKeys(missing, unexpected)
