"""Hand-written models of the kinds users bring that the transformers families do not cover.

Each builder returns `(model, args, kwargs)` (seeded random weights, train mode) for `parallelizer.trace`:

- `lstm`: embedding -> nn.LSTM -> linear head (a recurrent op);
- `resnet`: a small ResNet (conv -> BatchNorm -> ReLU, two residual blocks, global pooling, linear head);
- `dict_inputs`: keyword inputs holding a dict of a tensor and Python constants (float, str, bool), and a
  dict output (`return_dict=True`);
- `inplace_buffer`: a buffer updated in place in forward (a running mean and a step counter);
- `weight_sharing`: one linear layer applied twice, and an embedding tied to the output head;
- `mha`: nn.MultiheadAttention self-attention plus a feed-forward layer;
- `odd_dims`: sizes that divide by nothing (7 -> 13 -> 5, batch 6);
- `constants`: tensors made inside forward (`torch.tensor([...])`, Falcon-style list indexing
  `fused[..., [-2], :]`) and `x.to(x.device, dtype)` casts.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def _seeded(seed: int, device: str, make):
    torch.manual_seed(seed)
    with torch.device(device):
        return make().train()


def _randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 1))


class LSTMTagger(nn.Module):
    """ids (B, T) -> logits (B, T, tags): embedding 64 x 16, LSTM 16 -> 32, linear 32 -> 8."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(ids))  # (B, T, 32)
        return self.head(hidden)


class BasicBlock(nn.Module):
    """x + BN(conv(ReLU(BN(conv(x))))), then ReLU: (B, C, H, W) -> (B, C, H, W)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ResNetLike(nn.Module):
    """images (B, 3, 16, 16) -> logits (B, 10): stem conv 3 -> 16 + BN, two BasicBlocks, pooling, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(BasicBlock(16), BasicBlock(16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class DictInputs(nn.Module):
    """forward(x (B, 16), extra={"mask": (B, 16), "scale": float, "mode": str, "center": bool},
    return_dict=bool) -> {"logits": (B, 4), "hidden": (B, 32)} or the logits alone."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, extra: dict, return_dict: bool = False):
        h = F.gelu(self.up(x * extra["mask"])) * extra["scale"]
        if extra["mode"] == "centered" and extra["center"]:
            h = h - h.mean(dim=-1, keepdim=True)
        logits = self.out(h)
        return {"logits": logits, "hidden": h} if return_dict else logits


class InPlaceBuffer(nn.Module):
    """x (B, 16) -> (B, 8); keeps a running mean of the hidden features and a step counter, updated in place."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.out = nn.Linear(16, 8)
        self.register_buffer("running_mean", torch.zeros(16))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        with torch.no_grad():
            self.running_mean.mul_(0.9).add_(0.1 * h.mean(dim=0))
            self.steps += 1
        return self.out(h - self.running_mean)


class WeightSharing(nn.Module):
    """ids (B, T) -> logits (B, T, 64): a tied embedding/head (64 x 32) and one linear layer used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.shared = nn.Linear(32, 32)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + torch.tanh(self.shared(h))
        h = h + torch.tanh(self.shared(h))  # the same weights again
        return self.head(h)


class MHABlock(nn.Module):
    """x (B, T, 32) -> (B, T, 32): pre-norm nn.MultiheadAttention (4 heads, batch_first) and a GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(32), nn.LayerNorm(32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class OddDims(nn.Module):
    """x (6, 7) -> (6, 5) through 13 hidden features and a LayerNorm(13)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(7, 13), nn.LayerNorm(13), nn.Linear(13, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class Constants(nn.Module):
    """x (B, 8) -> (B, 4): a per-feature scale made with torch.tensor in forward, Falcon-style list indexing
    of a fused projection, and `.to(device, dtype)` casts."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = nn.Linear(8, 12)
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.fused(x.to(x.device, torch.float32)).view(x.shape[0], 3, 4)  # (B, 3 heads, 4)
        picked = fused[..., [-2], :].squeeze(1)  # (B, 4): the index list is a tensor made in forward
        scaled = picked * torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)
        return self.out(scaled.to(torch.float64).to(x.device, torch.float32))


def lstm(seed: int = 0, device: str = "cpu"):
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(seed + 1))
    return _seeded(seed, device, LSTMTagger), (ids.to(device),), {}


def resnet(seed: int = 0, device: str = "cpu"):
    return _seeded(seed, device, ResNetLike), (_randn(seed, 4, 3, 16, 16).to(device),), {}


def dict_inputs(seed: int = 0, device: str = "cpu"):
    mask = (_randn(seed + 1, 4, 16) > -1.0).float()
    extra = {"mask": mask.to(device), "scale": 0.5, "mode": "centered", "center": True}
    return _seeded(seed, device, DictInputs), (_randn(seed, 4, 16).to(device),), {"extra": extra,
                                                                                   "return_dict": True}


def inplace_buffer(seed: int = 0, device: str = "cpu"):
    return _seeded(seed, device, InPlaceBuffer), (_randn(seed, 4, 16).to(device),), {}


def weight_sharing(seed: int = 0, device: str = "cpu"):
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(seed + 1))
    return _seeded(seed, device, WeightSharing), (ids.to(device),), {}


def mha(seed: int = 0, device: str = "cpu"):
    return _seeded(seed, device, MHABlock), (_randn(seed, 4, 8, 32).to(device),), {}


def odd_dims(seed: int = 0, device: str = "cpu"):
    return _seeded(seed, device, OddDims), (_randn(seed, 6, 7).to(device),), {}


def constants(seed: int = 0, device: str = "cpu"):
    return _seeded(seed, device, Constants), (_randn(seed, 4, 8).to(device),), {}


KINDS = {"lstm": lstm, "resnet": resnet, "dict_inputs": dict_inputs, "inplace_buffer": inplace_buffer,
         "weight_sharing": weight_sharing, "mha": mha, "odd_dims": odd_dims, "constants": constants}
