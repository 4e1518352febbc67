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
    differ = [named[i][0] for i in _differing(t for _, t in named)]
    if differ:
        raise PlanMismatchError(
            f"the ranks built different weights: {len(differ)} tensor(s) differ between ranks, first "
            f"{differ[0]!r}. Each rank shards its own copy, so they "
            "must be equal. Remedy: seed every generator the model's construction draws from before building it "
            "on every rank: torch.manual_seed(SEED), and random.seed(SEED) / numpy.random.seed(SEED) where it draws "
            "from Python's or numpy's generator (each process starts those elsewhere; lucidrains' "
            "hyper-connections picks a residual stream with random.randrange); or load the same checkpoint on "
            "every rank (or build it on the meta device)")


CHECKED_CALLS = 2
"""Calls of a module whose inputs `check_same_inputs` compares across ranks (`inputs_unchecked`): the first
ones, where a per-rank batch (the DDP habit) shows from the start. Each check costs a host synchronisation and an
all-reduce, so later steps (a GPU's asynchronous ones) do not pay them."""


def inputs_unchecked(module: torch.nn.Module, count: bool) -> bool:
    """Whether `module` is within its first `CHECKED_CALLS` calls, whose inputs are compared across ranks;
    `count`: this is a call (a forward), not a check before one (`step`'s target)."""
    calls = module.__dict__.get("_input_checks", 0)
    if count:
        module.__dict__["_input_checks"] = calls + 1  # a plain counter, outside nn.Module's state
    return calls < CHECKED_CALLS


def check_same_inputs(named: list[tuple[str, object]], where: str) -> None:
    """Collective over the default process group (call on every rank): raise `PlanMismatchError` when a tensor
    of a call's global inputs (`named`: (name, value); values that are not dense tensors are skipped) differs
    between ranks. Every rank passes the SAME global batch and cuts its own piece; a DDP habit (each rank
    loading its own batch with a DistributedSampler) ran silently before (r13d): a ddp rank took its rows of
    its own batch (half the data, another function), tp ranks summed partial products of different samples
    (tp=2: the ranks returned losses 21.68 and 20.32). One all-reduce of 5 float64 numbers per tensor; callers
    check a module's first calls only (`inputs_unchecked`)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    named = [(n, t) for n, t in named if isinstance(t, torch.Tensor) and t.device.type != "meta" and not t.is_sparse]
    differ = [named[i][0] for i in _differing(t for _, t in named)]
    if differ:
        raise PlanMismatchError(
            f"{where}: input(s) {', '.join(repr(n) for n in differ)} differ between ranks. Every rank passes the same "
            "GLOBAL batch and the program cuts each rank's piece of it (a rank's own batch, as for "
            "DistributedDataParallel with a DistributedSampler, would train another function than one device). "
            "Remedy: give every rank the same batch (the same seed for shuffling, no DistributedSampler; "
            "the global batch is what DDP's ranks would load together)")


def _differing(tensors) -> list[int]:
    """Collective: positions of the tensors whose digest is not the same on every rank. The digest of a tensor
    t (float64; complex: both parts, `as_real`): over its finite values (non-finite ones counted as 0) the sum,
    the sum of absolute values and a sum with weights by position along dim 0 (which sees rows in another
    order); over its non-finite values a code per element (NaN 1, +inf 2, -inf 3) summed plainly and by
    position. Equal tensors give equal digests whatever they hold: before, a NaN or an inf beside a -inf made
    the digest NaN, and NaN != NaN, so the SAME batch holding a NaN (a feature the model masks with
    nan_to_num / where, a logit bias) was refused as "differ between ranks" on every plan (r23g); and gloo's
    MAX keeps a NaN only from the group's first rank, so a NaN digest on another rank alone was not seen."""
    wide = [as_real(t.detach()).double() for t in tensors]  # complex: both parts (`as_real`)
    if not wide:
        return []
    digests = []
    for t in wide:
        finite = torch.isfinite(t)
        code = torch.where(finite, 0.0, torch.where(torch.isnan(t), 1.0, torch.where(t > 0, 2.0, 3.0)))
        parts = []
        for x in (torch.where(finite, t, 0.0), code):  # (the values, the codes of the non-finite ones)
            r = x.reshape(x.shape[0] if x.dim() else 1, -1).sum(1)
            w = torch.arange(len(r), device=r.device) % 1009 + 1  # row positions, as the digest's 3rd
            parts += [x.sum(), x.abs().sum(), (r * w).sum()]
        digests.append(torch.stack(parts[:3] + parts[4:]))  # a code's abs sum is its sum
    # a sum of finite float64 values may still overflow (values near 1.8e308): one number for every rank alike
    digest = torch.nan_to_num(torch.stack(digests), nan=0.0).cpu()
    both = torch.cat([digest, -digest])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    high, low = both[:len(wide)], -both[len(wide):]
    return [i for i in range(len(wide)) if not torch.equal(high[i], low[i])]
