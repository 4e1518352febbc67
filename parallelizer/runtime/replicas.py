"""Every rank must start from the same weights: each cuts its shards from its own copy of the model, so a
rank that initialised a weight differently would keep a different "replica" for the whole run (torch's
DistributedDataParallel broadcasts rank 0's parameters at construction for the same reason). Here the
ranks compare instead of overwriting, so that a mistake is reported rather than hidden."""
from __future__ import annotations

import torch
import torch.distributed as dist

import torch.fx

from ..core.layout import Shard
from ..errors import PlanMismatchError
from ..rewriter.spec import ShardingSpec, mesh_coords
from ..tracer.graph import as_real
from ..tracer.node_facts import op_label


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
    digests = [_digest(t) for t in tensors]
    if not digests:
        return []
    digest = torch.stack(digests)
    both = torch.cat([digest, -digest])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    high, low = both[:len(digests)], -both[len(digests):]
    return [i for i in range(len(digests)) if not torch.equal(high[i], low[i])]


def _digest(tensor: torch.Tensor) -> torch.Tensor:
    """The 5 float64 numbers `_differing` compares for one tensor (CPU; equal tensors give equal digests)."""
    t = as_real(tensor.detach()).double()  # complex: both parts (`as_real`)
    finite = torch.isfinite(t)
    code = torch.where(finite, 0.0, torch.where(torch.isnan(t), 1.0, torch.where(t > 0, 2.0, 3.0)))
    parts = []
    for x in (torch.where(finite, t, 0.0), code):  # (the values, the codes of the non-finite ones)
        r = x.reshape(x.shape[0] if x.dim() else 1, -1).sum(1)
        w = torch.arange(len(r), device=r.device) % 1009 + 1  # row positions, as the digest's 3rd
        parts += [x.sum(), x.abs().sum(), (r * w).sum()]
    # a sum of finite float64 values may still overflow (values near 1.8e308): one number for every rank alike
    return torch.nan_to_num(torch.stack(parts[:3] + parts[4:]), nan=0.0).cpu()  # a code's abs sum is its sum


def generator_groups(spec: ShardingSpec, draws: list[torch.fx.Node]) -> list[list[int]]:
    """The groups of global ranks of a program of `spec` whose generators must agree for its random ops `draws`
    (`tracer.node_facts.drawing_ops`): ranks with the same coordinates on each mesh axis over which EVERY one of
    those ops' outputs is sharded (there each rank draws for its own shard, `rewriter.localize.seeded_per_shard`);
    on the other axes ranks hold copies or summands of one drawn value. A batch-sharded dropout under ddp alone
    needs no agreement (singleton groups, left out); a replicated one, or one on a tp axis only, needs it across the
    other ranks. An op without a layout in `spec` (a mode traced again) counts as sharded on no axis."""
    axes = set(range(len(spec.mesh.shape)))
    for node in draws:
        sharding = spec.nodes.get(node.name)
        axes &= {i for i, p in enumerate(sharding.output.placements) if isinstance(p, Shard)} if sharding else set()
    groups: dict[tuple, list[int]] = {}
    for rank in range(spec.mesh.world_size):
        coords = mesh_coords(spec.mesh, rank)
        groups.setdefault(tuple(coords[i] for i in sorted(axes)), []).append(rank)
    return [g for g in groups.values() if len(g) > 1]


def check_same_generator(draws: list[torch.fx.Node], groups: list[list[int]], where: str,
                         device: torch.device | None = None) -> None:
    """Collective over the default process group (call on every rank, with the same `draws` and `groups`): raise
    `PlanMismatchError` on every rank when torch's default generator (the CPU one, and `device`'s when it is an
    accelerator) is not in the same state on all ranks of some group of `groups` (global ranks that run the same
    program and must draw alike: `generator_groups`, within each pipeline stage for a PipelineModule). Nothing to check (no collective) when the program draws nothing or no group has two ranks
    (`draws`: its random ops, `tracer.node_facts.drawing_ops`).

    Why: a random op on a replicated value (dropout on Megatron's replicated residual stream, noise added before a
    slice) draws from the generator as is, and one on a sharded value takes its seed from it
    (`rewriter.localize.seeded_per_shard`); both assume every rank's generator advances alike from one seed. Ranks
    seeded apart (`torch.manual_seed(seed + rank)`, a DDP habit) drew different masks for the copies of one
    replicated value, so replicas silently parted (tp=2, per-rank seeds: a replicated LayerNorm weight 0.056 apart
    on the two ranks after 2 SGD steps, r24g), and the summands of a Partial value got different masks (dropout no
    longer linear in it). One all-gather of 5 float64 numbers per rank; callers check the first calls only
    (`inputs_unchecked`), as for the inputs, so a rank that draws on its own later in the run is not seen."""
    if not draws or not groups or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    states = [torch.get_rng_state()]
    if device is not None and device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    mine = torch.stack([_digest(state) for state in states]).flatten()
    every = torch.empty(dist.get_world_size() * mine.numel(), dtype=mine.dtype)
    dist.all_gather_into_tensor(every, mine)
    every = every.view(dist.get_world_size(), -1)
    apart = [g for g in groups if any(not torch.equal(every[r], every[g[0]]) for r in g)]
    if apart:
        raise PlanMismatchError(
            f"{where}: torch's random generator is in different states on ranks {apart[0]}, which run the same "
            f"program, and the program draws random numbers: {', '.join(op_label(n) for n in draws[:3])}"
            f"{f' and {len(draws) - 3} more' if len(draws) > 3 else ''}. Copies of one value on those ranks would get "
            "different random masks (replicas would silently part). Remedy: torch.manual_seed(SEED) with the SAME "
            "seed on every rank before the first step (not SEED + rank: the program already draws a different mask "
            "for each rank's piece of the batch); keep per-rank randomness (data augmentation) on a "
            "torch.Generator of your own, and do not draw from torch's generator on some ranks only")
