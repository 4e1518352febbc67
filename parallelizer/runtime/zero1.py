"""ZeRO-1 on a parallel module: torch's ZeroRedundancyOptimizer over the ranks that hold the same pieces.

ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
SC'20, Sec. 5.1, P_os) keeps the optimizer state of a data-parallel model once per replica group instead of
once per rank: each of the N replicas steps 1/N of the parameters and then sends the updated values to the
others. torch implements it as `torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class,
process_group=...)`: every rank of `process_group` owns a partition of `params` (whole tensors, greedily by
size), steps it with `optimizer_class` and broadcasts each parameter from its owner after the step.

On a parallel module that is one device's step exactly when every rank of the group holds the SAME piece of
every parameter it passes: the group may only span mesh axes over which each parameter is replicated (the
data-parallel axis of a ddp plan, 'dp' of a dp x tp plan whose tp shards differ between tp ranks, a stage's
dp ranks in a pipeline). Over other ranks the owner's broadcast overwrites their different shards or stages
(parameters 0.33-0.51 off after 2 AdamW steps on tp=2 / fsdp with the default, whole-world group).
`pm.process_group("dp")` gives the group to pass; `runtime.optimizer_check` refuses any other (`overwritten`).
Gradients reach the optimizer already reduced over the replicas (the plan's gradient sync), as
ZeroRedundancyOptimizer expects of DDP.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from ..core.layout import Replicate
from ..core.mesh import MeshSpec
from ..rewriter.collectives import find_group


def axis_group(groups: dict[str, list[int]], mesh: MeshSpec, axis: str, where: str) -> dist.ProcessGroup:
    """The ProcessGroup of this rank's ranks along mesh axis `axis` (`groups`: axis -> global ranks, as a
    ParallelModule holds them), created when the module was built (`runtime.create_groups`).

    Raises:
        ValueError: `axis` is not an axis of `mesh`, or has one device (nothing to partition over); names
            the mesh. `where` names the caller in the message.
    """
    if axis not in mesh.axis_names:
        raise ValueError(f"{where}: {axis!r} is not an axis of mesh {mesh} (axes: {', '.join(mesh.axis_names)}); "
                         "for ZeRO-1 pass the data-parallel axis, e.g. process_group('dp')")
    ranks = sorted(groups[axis])
    if len(ranks) < 2:
        raise ValueError(f"{where}: axis {axis!r} of mesh {mesh} has one device, so there is no group to "
                         "partition over. Remedy: a plan with a data-parallel axis of 2 or more devices")
    group = find_group(ranks)
    if group is None and ranks == list(range(dist.get_world_size())):
        group = dist.group.WORLD  # the whole world is the default group (`create_groups` skips it)
    if group is None:
        raise ValueError(f"{where}: no process group over ranks {ranks} (axis {axis!r} of mesh {mesh}) was "
                         "created; build the module with auto_parallelize or ParallelModule, which create them")
    return group


def overwritten(ranks: list[int], rank: int, owners: list) -> object | None:
    """The first of `owners` (`runtime.grad_norm.Owner`: a local parameter's layout, mesh and this rank's groups)
    whose piece some rank of `ranks` (a ZeroRedundancyOptimizer's process group, global ranks) does not hold
    too, i.e. the group reaches it along an axis over which the parameter is sharded or on another pipeline
    stage; None when every rank of the group holds the same piece of each. `rank`: this rank."""
    for owner in owners:
        same = {rank}
        for axis, placement in zip(owner.mesh.axis_names, owner.layout.placements):
            if isinstance(placement, Replicate) and len(owner.groups.get(axis, ())) > 1:
                same = {r + (other - rank) for r in same for other in owner.groups[axis]}
        if not set(ranks) <= same:
            return owner
    return None


def runs_zero1(spec) -> bool:
    """Whether `spec` (a ShardingSpec) partitions the optimizer state: `spec.zero1` names an axis of more than one
    device of its mesh."""
    axis = spec.zero1
    return axis is not None and axis in spec.mesh.axis_names and spec.mesh.size(axis) > 1


def plan_optimizer(params, spec, holder, lr: float, eps: float):
    """AdamW over `params` as the plan runs it (the rehearsals' optimizer): with `spec.zero1` on an axis of more
    than one device, torch's ZeroRedundancyOptimizer(AdamW) over `holder.process_group(spec.zero1)` (`holder`: a
    ParallelModule or pipeline stage holding `params`), else torch.optim.AdamW."""
    params = list(params)
    if not runs_zero1(spec):
        return torch.optim.AdamW(params, lr=lr, eps=eps)
    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                   process_group=holder.process_group(spec.zero1), lr=lr, eps=eps)
