"""Every rank must start from the same weights: each cuts its shards from its own copy of the model, so a
rank that initialised a weight differently would keep a different "replica" for the whole run (torch's
DistributedDataParallel broadcasts rank 0's parameters at construction for the same reason). Here the
ranks compare instead of overwriting, so that a mistake is reported rather than hidden."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import PlanMismatchError
from ..tracer.graph import as_real


def check_same_weights(model: torch.nn.Module) -> None:
    """Collective over the default process group (call on every rank, same model structure): compare a digest
    of each parameter and buffer (float64 sum and sum of absolute values of the full tensor) across ranks.
    Tensors on the meta device are skipped (each rank then initialises only its own shards).

    Raises:
        PlanMismatchError: some tensor differs between ranks; names the first one and the remedy.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    named = [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]
             if t.device.type != "meta" and (t.is_floating_point() or t.is_complex() or t.dtype == torch.int64)]
    if not named:
        return
    wide = [as_real(t.detach()).double() for _, t in named]  # complex: both parts (`as_real`)
    digest = torch.stack([torch.stack([t.sum(), t.abs().sum()]) for t in wide]).cpu()
    low, high = digest.clone(), digest.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    differ = [name for (name, _), a, b in zip(named, low, high) if not torch.equal(a, b)]
    if differ:
        raise PlanMismatchError(
            f"the ranks built different weights: {len(differ)} tensor(s) differ between ranks, first "
            f"{differ[0]!r}. Each rank shards its own copy, so they "
            "must be equal. Remedy: call torch.manual_seed(SEED) before building the model on every rank, or "
            "load the same checkpoint on every rank (or build it on the meta device)")
