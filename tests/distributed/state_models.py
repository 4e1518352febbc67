"""Models whose forward writes state in place (parameters, running statistics, EMA buffers), found by trying
outside patterns (rounds 13, r13b and lead), importable by spawned ranks. Each builder returns (model,
example_inputs); seeded, so every rank builds the same weights."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from trial_models import B, H, T


class WrittenParameters(nn.Module):
    """Parameters written in place in forward under no_grad: a frozen key encoder updated as an EMA of the
    query encoder (MoCo's momentum update, `p_k.mul_(m).add_(p_q * (1 - m))`) and trainable prototypes
    re-normalised before use (SwAV's `protos.weight.copy_(normalize(...))`). Under an "fsdp" axis a parameter
    is used whole but a write must hit it where it is stored, so these are stored Replicate there."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(H, H), nn.Linear(H, H)
        self.k.requires_grad_(False)
        self.protos = nn.Linear(H, 6, bias=False)

    def forward(self, x):
        with torch.no_grad():
            for pq, pk in zip(self.q.parameters(), self.k.parameters()):
                pk.mul_(0.9).add_(pq.detach() * 0.1)
            self.protos.weight.copy_(F.normalize(self.protos.weight, dim=1))
        return self.protos(torch.tanh(self.q(x)) + self.k(x).detach())


def written_parameters():
    torch.manual_seed(0)
    return WrittenParameters(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


class SharedBatchNorm(nn.Module):
    """One BatchNorm1d applied twice per forward (SwAV / SimCLR / BYOL run one encoder on two views): a
    one-sample input x (1, H, T), which no plan can batch-shard, then a batch y (B, H, T) sharded under ddp. The
    first call is torch's batch_norm on the whole x, which saves the running buffers for backward, and whose
    kernel updates them without bumping their version counter; the second is the program's SyncBatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn, self.b = nn.Linear(H, H), nn.BatchNorm1d(H), nn.Linear(H, 4)

    def forward(self, x, y):
        hx = self.bn(self.a(x.transpose(1, 2)).transpose(1, 2))
        hy = self.bn(self.a(y.transpose(1, 2)).transpose(1, 2))
        return self.b(hy.transpose(1, 2)).square().mean() + self.b(hx.transpose(1, 2)).square().mean()


def shared_batch_norm():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return SharedBatchNorm(), (torch.randn(1, H, T, generator=g), torch.randn(B, H, T, generator=g))


def max_norm_embedding():
    """nn.Embedding(max_norm=1.0): forward renormalises the looked-up rows of the weight in place
    (embedding_renorm_ on weight.detach()), a parameter written in forward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 8, max_norm=1.0), nn.Linear(8, 8))
    with torch.no_grad():
        model[0].weight.mul_(3.0)  # rows above the max norm, so the renormalisation changes them
    return model, (torch.randint(0, 11, (4, 3), generator=torch.Generator().manual_seed(1)),)


class _StateBlock(nn.Module):
    """x + relu(norm(linear(x))) with a training BatchNorm1d (`ema=False`), or x + relu(linear(x)) that also keeps an
    EMA buffer of the activations' mean, written in place under no_grad (`ema=True`): a block whose forward writes
    state in place, which recomputation would write twice."""

    def __init__(self, ema: bool) -> None:
        super().__init__()
        self.ema_mode = ema
        self.linear = nn.Linear(16, 16)
        self.norm = nn.Identity() if ema else nn.BatchNorm1d(16)
        self.register_buffer("ema", torch.zeros(16))

    def forward(self, x):
        h = self.norm(self.linear(x))
        if self.ema_mode:
            with torch.no_grad():
                self.ema.mul_(0.9).add_(0.1 * h.mean(0))
        return x + torch.relu(h)


class StateBlocks(nn.Module):
    """Two `_StateBlock`s and a head: repeated blocks the planner would recompute under recompute="full"."""

    def __init__(self, ema: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_StateBlock(ema) for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def state_blocks(ema: bool = False, batch: int = 8):
    torch.manual_seed(0)
    return StateBlocks(ema), (torch.randn(batch, 16, generator=torch.Generator().manual_seed(1)),)


def ema_blocks():
    return state_blocks(ema=True)
