"""Rank bodies of tests/distributed/test_special_values.py (importable by spawned ranks): values that are not
ordinary finite numbers (NaN, +-inf) through collectives, global norms and the ranks' input checks, against one
device (round 23, r23g: public reports on NaN in vocab-parallel CE / masked softmax, FSDP's ShardedGradScaler,
clip_grad_norm_(error_if_nonfinite=True) with sharded gradients)."""
from __future__ import annotations

import contextlib
import copy
import io
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.rewriter import collectives
from parallelizer.rewriter.state import gather_tensor
from parallelizer.runtime import grad_norm
from parallelizer.runtime.part_writes import local_writes

NAN, INF = float("nan"), float("inf")


def max_of_ranks(rank: int, world_size: int) -> list[dict]:
    """`collectives.all_reduce_max` over the world of tensors holding NaN / +-inf / -0.0 on one rank each, in 4
    dtypes: per dtype the result and `torch.amax` over the ranks' stacked tensors (the one-device value)."""
    def mine(k: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([[NAN if r == k else 1.0 for r in range(world_size)],  # NaN on rank r in column r
                             [-INF] * world_size,
                             [INF if k == world_size - 1 else -5.0 - k] + [2.0 * k] * (world_size - 1),
                             [-0.0 if k == 0 else -1.0] + [NAN if k == world_size - 1 else INF] * (world_size - 1)],
                            dtype=dtype)
    out = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        got = collectives.all_reduce_max(mine(rank, dtype), list(range(world_size)))
        eager = torch.stack([mine(k, dtype) for k in range(world_size)]).amax(0)
        out.append({"dtype": str(dtype), "got": got, "eager": eager})
    return out


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def _quiet_pm(model: nn.Module, inputs: tuple, mesh: dict, roles: dict):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return parallelizer.auto_parallelize(model, inputs, mesh=mesh, axis_roles=roles)


def nonfinite_shard_norms(rank: int, world_size: int, mesh: dict, roles: dict, bad: float, on_rank: int) -> dict:
    """A gradient element set to `bad` (NaN or inf) in the piece of ONE rank (`on_rank`) of the first parameter
    stored sharded, then torch's `clip_grad_norm_` over pm.parameters(): per norm type (2, inf) the total and
    the one-device total (torch's own `clip_grad_norm_` over the gathered full gradients), whether
    `error_if_nonfinite=True` raised (torch raises for a nan/inf total), then the full gradients after a clip at
    1.0 beside torch's own clipping of the same full gradients on one device."""
    torch.manual_seed(0)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    pm = _quiet_pm(Mlp(), (x,), mesh, roles)
    pm(x).pow(2).mean().backward()
    sharded = next(f for f, p in pm.named_parameters()
                   if not pm.spec.params[f].is_replicated and p.numel())
    if rank == on_rank:
        with local_writes():  # one rank's piece, on purpose (`runtime.part_writes` refuses it otherwise)
            pm.get_parameter(sharded).grad.view(-1)[-1] = bad

    def full_grads() -> list[torch.Tensor]:
        return [gather_tensor(p.grad, pm.spec.params[f], pm.spec.mesh, pm.groups,
                              tuple(pm.traced.parameters[f].shape), pm.coords) for f, p in pm.named_parameters()]
    out = {"sharded": sharded}
    for norm_type in (2.0, INF):
        full = full_grads()
        eager_params = [nn.Parameter(torch.zeros_like(g)) for g in full]  # one device: torch's own clipping
        for e, g in zip(eager_params, full):
            e.grad = g.clone()
        eager = grad_norm._TORCH_CLIP(eager_params, 1.0, norm_type)
        try:
            torch.nn.utils.clip_grad_norm_(pm.parameters(), 1.0, norm_type, error_if_nonfinite=True)
            raised = False
        except RuntimeError as e:
            raised = "non-finite" in str(e)
        total = torch.nn.utils.clip_grad_norm_(pm.parameters(), 1.0, norm_type)
        out[str(norm_type)] = {"total": total.item(), "eager": eager.item(), "raised": raised,
                               "grads": list(zip(full_grads(), [e.grad for e in eager_params]))}
        pm.zero_grad()
        pm(x).pow(2).mean().backward()
        if rank == on_rank:
            with local_writes():
                pm.get_parameter(sharded).grad.view(-1)[-1] = bad
    return out


class MaskedFeatures(nn.Module):
    """A tabular model that reads features with missing or unbounded values (NaN, +-inf) and zeroes them, as a
    data loader's NaN for 'missing' is commonly handled: (B, 8) -> (B, 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.head = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.where(torch.isfinite(x), x, 0.0)
        return self.head(torch.tanh(self.fc1(x)))


def nan_in_the_batch(rank: int, world_size: int, mesh: dict, roles: dict, fill: str) -> dict:
    """The SAME batch on every rank holding NaN (or +inf and -inf) features: pm's loss and gradients against
    the eager model (or the error's type and message)."""
    torch.manual_seed(0)
    model = MaskedFeatures()
    reference = copy.deepcopy(model)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    if fill == "nan":
        x[1, 2] = x[4, 5] = NAN
    else:  # +inf and -inf in one tensor: its plain float64 sum is NaN
        x[1, 2], x[4, 5] = INF, -INF
    try:
        pm = _quiet_pm(model, (x,), mesh, roles)
        loss = pm(x).pow(2).mean()
        loss.backward()
    except Exception as e:  # noqa: BLE001 (the report names it)
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    eager = reference(x).pow(2).mean()
    eager.backward()
    grads = {f: gather_tensor(p.grad, pm.spec.params[f], pm.spec.mesh, pm.groups,
                              tuple(pm.traced.parameters[f].shape), pm.coords) for f, p in pm.named_parameters()}
    return {"loss": (loss.detach(), eager.detach()),
            "grads": {f: (g, reference.get_parameter(f).grad) for f, g in grads.items()}}


def special_logits(case: str, rows: int = 10, classes: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (rows, classes) and class-id targets (every 4th row ignored, -100) with special values:
    "ignored_row_all_neginf": row 0 (ignored) all -inf; "all_ignored": every target ignored (a mean of 0/0)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, classes, generator=gen) * 3
    target = torch.randint(0, classes, (rows,), generator=gen)
    target[::4] = -100
    if case == "ignored_row_all_neginf":
        logits[0] = -INF
    elif case == "all_ignored":
        target[:] = -100
    return logits, target


def vocab_shard_special(rank: int, world_size: int, case: str, reduction: int) -> dict:
    """The vocab-parallel cross-entropy (`localize.sharded_cross_entropy` with the classes split over the world)
    of `special_logits(case)`: the loss and this rank's logits-shard gradient of 1.5 x the (summed) loss."""
    from parallelizer.rewriter.localize import sharded_cross_entropy
    from parallelizer.runtime.launch import create_groups

    group = list(range(world_size))
    create_groups([group])
    logits, target = special_logits(case)
    sizes = [len(c) for c in torch.arange(logits.shape[1]).chunk(world_size)]
    start = sum(sizes[:rank])
    local = logits[:, start:start + sizes[rank]].clone().requires_grad_(True)
    loss = sharded_cross_entropy(local, target, None, reduction, -100, 0.0, [], [group], start, logits.shape[1])
    (loss.sum() * 1.5).backward()
    return {"loss": loss.detach(), "grad": local.grad}


class Residuals(nn.Module):
    """(B, 8) -> cross-entropy over 3 classes through 4 residual tanh blocks (pp=2: two blocks per stage)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return F.cross_entropy(self.head(x), y)


def pipeline_nonfinite_norms(rank: int, world_size: int, bad: float, on_rank: int) -> dict:
    """pp=2 (GPipe, 2 microbatches): `bad` written into one gradient element of the stage on `on_rank` only (and
    into the eager model's same element); per norm type (2, inf) pm.clip_grad_norm_'s total, torch's
    `get_total_norm` of the eager gradients, and whether `error_if_nonfinite=True` raised."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model = Residuals()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        pm = parallelizer.auto_parallelize(model, (x, y), mesh={"pp": 2}, microbatches=2, schedule="gpipe")
    out = {}
    for norm_type in (2.0, INF):
        pm.zero_grad()
        reference.zero_grad()
        pm.step(x, y)
        reference(x, y).backward()
        held_here = [(n, p) for n, p in pm.named_parameters() if p.grad is not None]
        names = [n for n, _ in held_here]
        if rank == on_rank:
            with local_writes():  # one rank's piece, on purpose (`runtime.part_writes` refuses it otherwise)
                held_here[-1][1].grad.view(-1)[0] = bad
        held = [None] * world_size
        dist.all_gather_object(held, names[-1] if rank == on_rank else None)
        reference.get_parameter(held[on_rank]).grad.view(-1)[0] = bad
        eager = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()], norm_type)
        try:
            pm.clip_grad_norm_(1.0, norm_type, error_if_nonfinite=True)
            raised = False
        except RuntimeError as e:
            raised = "non-finite" in str(e)
        out[str(norm_type)] = {"total": pm.clip_grad_norm_(1.0, norm_type).item(), "eager": eager.item(),
                               "raised": raised}
    return out


def apply_with_nan(rank: int, world_size: int, nan_on: str) -> str:
    """`pm.apply(init)` on ddp dp=2 where `init` zeroes every Linear weight and then writes NaN into element
    (0, 0) on rank 1 only ("one") or on every rank ("all"): "written" or the error's type and message."""
    torch.manual_seed(0)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    pm = _quiet_pm(Mlp(), (x,), {"dp": 2}, {"dp": "ddp"})

    def init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            with torch.no_grad():
                m.weight.zero_()
                if nan_on == "all" or rank == 1:
                    m.weight[0, 0] = NAN
    try:
        pm.apply(init)
    except Exception as e:  # noqa: BLE001 (the report names it)
        return f"{type(e).__name__}: {e}"
    return "written"
