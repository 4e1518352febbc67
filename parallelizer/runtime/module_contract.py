"""What the two parallel modules (`runtime.module.ParallelModule`, `runtime.pipeline_module.PipelineModule`)
share of nn.Module's contract (DESIGN.md rule 10): the keys a full state dict has, the refusal to pickle a
module that holds one rank's pieces, and the check that every rank computed the same full values before they
are written back into the user's model."""
from __future__ import annotations

import torch

from ..errors import PlanMismatchError, StateDictError, UnsupportedOpError
from ..tracer.graph import TracedGraph
from .replicas import _differing


def pickling_refused(kind: str) -> UnsupportedOpError:
    """The error for pickling a parallel module (`torch.save(pm, path)`, `pickle.dumps(pm)`, `copy.copy(pm)`): it
    holds this rank's pieces, its process groups and programs, which another process cannot take up."""
    return UnsupportedOpError(
        f"torch.save / pickle of a {kind}: it holds this rank's pieces of the model, process groups and compiled "
        "programs, which another process cannot take up. Remedy: save its state instead: "
        "parallelizer.checkpoint.save(pm, opt, dir) (model and optimizer, loads on any plan), "
        "torch.save(pm.state_dict(), f'ckpt-rank{dist.get_rank()}.pt') per rank (same rank and plan), or the "
        "whole model for one device: parallelizer.checkpoint.export_full_state_dict(pm, dir) (a ParallelModule "
        "also: `with pm.full_model() as model: torch.save(model, path)` on every rank)")


def check_equal_across_ranks(values: dict[str, torch.Tensor], world_size: int) -> None:
    """Raise PlanMismatchError naming the first tensor whose digest differs between the ranks (collective
    over the default group, which a non-pipeline ParallelModule's mesh spans; `replicas._differing`, whose digest
    sees NaN and +-inf: before, a plain sum with NaN read as 0 let a NaN on one rank pass against a zero sum on
    another, r23g)."""
    import torch.distributed as dist

    if not values or not dist.is_initialized() or dist.get_world_size() != world_size or world_size == 1:
        return
    differs = [list(values)[i] for i in _differing(values.values())]
    if differs:
        raise PlanMismatchError(
            f"full_model / apply: the ranks computed different values for {differs[0]!r}"
            f"{f' (and {len(differs) - 1} more)' if len(differs) > 1 else ''}, e.g. random draws from generators "
            "seeded differently; nothing was written back. Remedy: torch.manual_seed(same seed) on every rank "
            "before it")


def check_state_keys(traced: TracedGraph, state_dict: dict, strict: bool, where: str
                     ) -> tuple[dict[str, str], list[str], list[str]]:
    """The keys a full state dict of the traced model has (name -> canonical FQN: persistent tensors and their
    tied aliases), and `state_dict`'s missing and unexpected keys against them.

    Raises:
        StateDictError: with strict=True, keys missing or unexpected (lists them, with the remedy).
    """
    expected = {name: fqn for fqn, info in traced.parameters.items() if info.persistent
                for name in (fqn, *info.aliases)}
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if strict and (missing or unexpected):
        raise StateDictError(
            f"{where}: {len(missing)} missing key(s) {_some(missing)}, {len(unexpected)} unexpected "
            f"key(s) {_some(unexpected)}. The state dict must have the keys of the model's state_dict() "
            "(tied aliases included, non-persistent buffers left out). Remedy: save it with "
            "model.state_dict() / full_state_dict(), or pass strict=False to load the keys "
            "that match", missing=missing, unexpected=unexpected)
    return expected, missing, unexpected


def _some(keys: list[str], n: int = 8) -> str:
    return "[" + ", ".join(keys[:n]) + (f", ... ({len(keys) - n} more)" if len(keys) > n else "") + "]"
