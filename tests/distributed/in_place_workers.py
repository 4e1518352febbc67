"""Rank bodies and models for test_in_place_collectives (importable by name in spawned ranks): in-place c10d
collectives on tensors whose strides differ between ranks (`runtime.in_place`; pytorch#192920)."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import parallelizer
from parallelizer import checkpoint
from parallelizer.runtime.in_place import all_reduce_in_place, broadcast_in_place


# --- the helpers alone: right values for any strides on any rank --------------------------------------------------

def _values(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Integer-valued float32 entries that depend on the rank and the position (sums are exact)."""
    n = torch.Size(shape).numel()
    return (torch.arange(n, dtype=torch.float32) * (rank + 1) + 7 * rank).reshape(shape)


def helpers(rank: int, world_size: int) -> dict:
    """Each helper on tensors laid out otherwise on each rank; returns per case (got, want), the want computed
    from `_values` of every rank without any collective."""
    out = {}
    # a column view (stride 2, with gaps) on every rank
    base = torch.zeros(6, 2)
    base[:, 0] = _values(rank, (6,))
    column = base[:, 0]
    all_reduce_in_place(column)
    out["all_reduce column view"] = (column.clone(), sum(_values(r, (6,)) for r in range(world_size)))
    out["all_reduce leaves the gaps"] = (base[:, 1].clone(), torch.zeros(6))
    # rank 0 holds the (4, 6) values transposed in memory (strides (1, 4)), the others contiguous
    mine = _values(rank, (4, 6))
    held = mine.t().contiguous().t() if rank == 0 else mine.clone()
    all_reduce_in_place(held, op=torch.distributed.ReduceOp.MAX)
    out["all_reduce MAX strides differ"] = (held, torch.stack([_values(r, (4, 6)) for r in range(world_size)]).amax(0))
    # broadcast from the last rank of a channels_last (2, 3, 4, 5) tensor into contiguous tensors
    src = world_size - 1
    sent = _values(src, (2, 3, 4, 5))
    box = sent.to(memory_format=torch.channels_last) if rank == src else torch.zeros(2, 3, 4, 5)
    broadcast_in_place(box, src)
    out["broadcast channels_last"] = (box, sent)
    # a complex tensor (moved as its real view) held transposed on the sender
    z = torch.complex(_values(src, (3, 4)), -_values(src, (3, 4)))
    zbox = z.t().contiguous().t() if rank == src else torch.zeros(3, 4, dtype=torch.complex64)
    broadcast_in_place(zbox, src)
    out["broadcast complex transposed"] = (zbox, z)
    return out


# --- a pipeline's shared-parameter gradient sum: a weight read by blocks on both pipeline ranks --------------------

class SharedBlock(nn.Module):
    """A residual block that also reads a weight shared by every block (`shared`) through an einsum over its
    (out, in) layout, whose weight gradient from `torch.autograd.grad` comes out transposed in memory."""

    def __init__(self, d: int, shared: nn.Linear):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.shared = shared

    def forward(self, h):  # (B, T, d)
        h = h + torch.tanh(self.fc(h))
        return h + torch.tanh(torch.einsum("btd,od->bto", h, self.shared.weight))


class SharedLM(nn.Module):
    """Embedding (16 x 8) -> 4 `SharedBlock`s sharing one bias-free Linear(8, 8) -> head; (B, T) ids -> logits."""

    def __init__(self, vocab: int = 16, d: int = 8, n: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        shared = nn.Linear(d, d, bias=False)
        self.blocks = nn.ModuleList([SharedBlock(d, shared) for _ in range(n)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def shared_lm(batch: int = 8):
    """(model, (ids,)): 8 x 5 token ids (the first `batch` rows), seeded."""
    torch.manual_seed(0)
    return SharedLM(), (torch.randint(0, 16, (8, 5))[:batch],)


def _ce(out, target):
    return F.cross_entropy(out.flatten(0, 1), target.flatten())


def shared_pipeline(rank: int, world_size: int, plan) -> dict:
    """2 SGD steps (lr 0.5) of `plan` on `shared_lm` with `pm.step` and of the model on one device, on the same
    8-row batch: per step (pipeline loss, one device's loss), and both state dicts after the steps."""
    model, (ids,) = shared_lm()
    target = torch.roll(ids, 1, 1)
    reference = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, (ids,), plan=plan)
    opt, ref_opt = torch.optim.SGD(pm.parameters(), lr=0.5), torch.optim.SGD(reference.parameters(), lr=0.5)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        ref_opt.zero_grad()
        loss = pm.step(ids, target=target, loss_fn=_ce)
        ref_loss = _ce(reference(ids), target)
        ref_loss.backward()
        losses.append((loss.detach(), ref_loss.detach()))
        opt.step()
        ref_opt.step()
    return {"losses": losses, "state": pm.full_state_dict(), "reference": reference.state_dict()}


# --- a pipeline's full state dict after pm.to(memory_format=torch.channels_last) -----------------------------------

class ConvBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):  # (B, C, H, W)
        return x + torch.tanh(self.conv(x))


class ConvStack(nn.Module):
    """4 residual 3x3 convolutions over 4 channels, mean-pooled, Linear(4, 3): (B, 4, 5, 5) -> (B, 3)."""

    def __init__(self, c: int = 4, n: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList([ConvBlock(c) for _ in range(n)])
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((2, 3)))


def conv_stack(batch: int = 4):
    """(model, (x,)): a (4, 4, 5, 5) batch (its first `batch` rows), seeded."""
    torch.manual_seed(0)
    return ConvStack(), (torch.randn(4, 4, 5, 5)[:batch],)


def channels_last_state(rank: int, world_size: int, plan, directory: str) -> dict:
    """`pm.to(memory_format=torch.channels_last)` after wrapping, as a CNN recipe does to the model; one SGD step
    (lr 0.5) of a mean-square loss; `pm.full_state_dict()`, the safetensors checkpoint
    `checkpoint.export_full_state_dict` writes to `directory` read back (rank 0; None elsewhere; the error's text
    if it raised), and one device's
    state dict after the same step."""
    model, (x,) = conv_stack()
    reference = copy.deepcopy(model).to(memory_format=torch.channels_last)
    pm = parallelizer.auto_parallelize(model, (x,), plan=plan).to(memory_format=torch.channels_last)
    opt, ref_opt = torch.optim.SGD(pm.parameters(), lr=0.5), torch.optim.SGD(reference.parameters(), lr=0.5)
    loss = pm.step(x, loss_fn=lambda out, target: out.pow(2).mean())
    ref_loss = reference(x).pow(2).mean()
    ref_loss.backward()
    opt.step()
    ref_opt.step()
    held = [name for name, p in pm.named_parameters() if not p.is_contiguous()]
    state = pm.full_state_dict()
    try:  # an error here is returned, not raised: it fails only the test that reads it
        written = checkpoint.export_full_state_dict(pm, directory)
        exported = checkpoint.read_full_state_dict(directory) if written else None
    except Exception as error:  # noqa: BLE001
        exported = f"{type(error).__name__}: {error}"
    return {"loss": (loss.detach(), ref_loss.detach()), "state": state, "exported": exported,
            "reference": reference.state_dict(), "channels_last_held": held}
