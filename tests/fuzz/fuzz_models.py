"""A seeded random-model generator for the fuzzer (issue R1): small models composed of the op families the
planner supports, at odd sizes, with the loss inside the model.

`build(seed)` returns `(model, args, kwargs)`; the same seed always gives the same architecture, weights and
inputs (spawned ranks rebuild it). `describe(seed)` names the families a model uses, for the results table.

Families: token embedding (odd vocabularies, optionally tied to the output head), features input, MLP blocks
(linear with/without bias, GELU/SiLU/ReLU), attention through SDPA or through matmul + causal mask (tril /
masked_fill) + softmax with head splits, LayerNorm / RMSNorm / BatchNorm, residuals, dropout p=0, dtype casts
(bf16 round trip of a sharded value), reductions plus Python scalars, zeros_like, an einsum over experts,
frozen parameters, a buffer updated in place in forward, and a conv stem (conv2d, batch norm, pooling) for
image inputs.
"""
from __future__ import annotations

import random

import torch
from torch import nn

# sizes: odd and small, so that shards are uneven on meshes of 2, 3 and 4
WIDTHS = (6, 10, 12, 14)
HEADS = {6: (2, 3), 10: (2, 5), 12: (2, 3, 4), 14: (2, 7)}
BATCHES = (3, 5, 6, 7, 8)
SEQS = (3, 5, 7)
VOCABS = (11, 13, 29, 37)


class MLP(nn.Module):
    def __init__(self, c: int, hidden: int, act: str, bias: bool, norm: str) -> None:
        super().__init__()
        self.norm = _norm(norm, c)
        self.up = nn.Linear(c, hidden, bias=bias)
        self.down = nn.Linear(hidden, c, bias=bias)
        self.act = {"gelu": nn.GELU(), "silu": nn.SiLU(), "relu": nn.ReLU(), "tanh_gelu": nn.GELU("tanh")}[act]
        self.drop = nn.Dropout(0.0)

    def forward(self, x):  # (B, T, C)
        return x + self.drop(self.down(self.act(self.up(self.norm(x)))))


class Attention(nn.Module):
    def __init__(self, c: int, heads: int, sdpa: bool, norm: str) -> None:
        super().__init__()
        self.norm, self.heads, self.sdpa = _norm(norm, c), heads, sdpa
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):  # (B, T, C)
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        if self.sdpa:
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-1, -2)) * (c // self.heads) ** -0.5
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return x + self.proj(y.transpose(1, 2).reshape(b, t, c))


class Experts(nn.Module):
    """An einsum over a bank of experts, averaged (a dense mixture)."""

    def __init__(self, c: int, experts: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(experts, c, c) * c ** -0.5)

    def forward(self, x):  # (B, T, C)
        return x + torch.einsum("btc,ecd->bted", x, self.w).mean(2)


class Quirks(nn.Module):
    """Reductions plus scalars, a bf16 round trip, zeros_like, a buffer updated in place, a frozen weight."""

    def __init__(self, c: int, kinds: tuple[str, ...]) -> None:
        super().__init__()
        self.kinds = kinds
        self.register_buffer("ema", torch.zeros(c))
        self.frozen = nn.Linear(c, c, bias=False)
        self.frozen.weight.requires_grad_(False)

    def forward(self, x):
        for kind in self.kinds:
            if kind == "center":
                x = x - x.mean(-1, keepdim=True) + 0.5
            elif kind == "scale":
                x = x * (x.pow(2).sum(-1, keepdim=True) + 1.0).rsqrt() * 2.0
            elif kind == "cast":
                x = x.to(torch.bfloat16).float()
            elif kind == "zeros_like":
                x = torch.zeros_like(x) + x
            elif kind == "buffer":
                self.ema.mul_(0.9).add_(x.detach().mean((0, 1)) * 0.1)
                x = x + self.ema
            elif kind == "frozen":
                x = x + self.frozen(x)
            elif kind == "batch_norm":
                x = x + nn.functional.batch_norm(x.transpose(1, 2), None, None, training=True).transpose(1, 2)
        return x


class ConvStem(nn.Module):
    """(B, 3, H, W) -> (B, T, C): conv, batch norm, relu, pooling, flattened to a sequence."""

    def __init__(self, c: int, pool: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.pool = nn.MaxPool2d(2) if pool == "max" else nn.AvgPool2d(2)

    def forward(self, img):
        h = self.pool(torch.relu(self.bn(self.conv(img))))  # (B, C, H/2, W/2)
        return h.flatten(2).transpose(1, 2)                # (B, T, C)


class FuzzModel(nn.Module):
    def __init__(self, spec: dict) -> None:
        super().__init__()
        c, self.spec = spec["width"], spec
        if spec["input"] == "tokens":
            self.embed = nn.Embedding(spec["vocab"], c)
        elif spec["input"] == "image":
            self.stem = ConvStem(c, spec["pool"])
        else:
            self.inp = nn.Linear(5, c)
        self.blocks = nn.ModuleList(_block(b, c) for b in spec["blocks"])
        self.norm = _norm(spec["final_norm"], c)
        self.head = nn.Linear(c, spec["classes"], bias=not spec["tied"])
        if spec["tied"]:
            self.head.weight = self.embed.weight

    def forward(self, x, labels):
        h = self.embed(x) if self.spec["input"] == "tokens" else self.stem(x) if self.spec["input"] == "image" \
            else self.inp(x)
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.norm(h))                   # (B, T, classes)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=0,
                                           label_smoothing=self.spec["smoothing"])


def _norm(kind: str, c: int) -> nn.Module:
    return {"layer": nn.LayerNorm(c), "rms": nn.RMSNorm(c), "none": nn.Identity()}[kind]


def _block(spec: dict, c: int) -> nn.Module:
    kind = spec["kind"]
    if kind == "mlp":
        return MLP(c, spec["hidden"], spec["act"], spec["bias"], spec["norm"])
    if kind == "attention":
        return Attention(c, spec["heads"], spec["sdpa"], spec["norm"])
    if kind == "experts":
        return Experts(c, spec["experts"])
    return Quirks(c, tuple(spec["quirks"]))


def architecture(seed: int) -> dict:
    """The random architecture of `seed` (plain data, so it can be printed and compared)."""
    rng = random.Random(seed)
    c = rng.choice(WIDTHS)
    inp = rng.choice(("tokens", "tokens", "features", "image"))
    blocks = []
    repeat = rng.random() < 0.4  # identical blocks exercise the repeated-block clustering
    kinds = [rng.choice(("mlp", "attention", "mlp", "attention", "experts", "quirks")) for _ in range(rng.randint(1, 3))]
    template = None
    for kind in (kinds * 2 if repeat else kinds):
        if kind == "mlp":
            b = {"kind": kind, "hidden": rng.choice((7, 9, 16, 2 * c)), "act": rng.choice(("gelu", "silu", "relu", "tanh_gelu")),
                 "bias": rng.random() < 0.6, "norm": rng.choice(("layer", "rms", "none"))}
        elif kind == "attention":
            b = {"kind": kind, "heads": rng.choice(HEADS[c]), "sdpa": rng.random() < 0.5,
                 "norm": rng.choice(("layer", "rms", "none"))}
        elif kind == "experts":
            b = {"kind": kind, "experts": rng.choice((2, 3, 5))}
        else:
            b = {"kind": kind, "quirks": rng.sample(("center", "scale", "cast", "zeros_like", "buffer", "frozen",
                                                      "batch_norm"), rng.randint(1, 3))}
        blocks.append(b if not repeat or template is None or template["kind"] != kind else dict(template))
        template = template or b
    return {"seed": seed, "width": c, "input": inp, "vocab": rng.choice(VOCABS), "pool": rng.choice(("max", "avg")),
            "blocks": blocks, "final_norm": rng.choice(("layer", "rms", "none")), "tied": False,
            "classes": rng.choice(VOCABS), "smoothing": rng.choice((0.0, 0.0, 0.1)),
            "batch": rng.choice(BATCHES), "seq": rng.choice(SEQS), "tie": rng.random() < 0.5}


def build(seed: int):
    """(model, (inputs, labels), {}) for `seed`, identical on every call."""
    spec = architecture(seed)
    if spec["input"] == "tokens" and spec["tie"]:
        spec["tied"], spec["classes"] = True, spec["vocab"]
    torch.manual_seed(seed)
    model = FuzzModel(spec)
    gen = torch.Generator().manual_seed(seed)
    b, t = spec["batch"], spec["seq"]
    if spec["input"] == "tokens":
        x = torch.randint(0, spec["vocab"], (b, t), generator=gen)
    elif spec["input"] == "image":
        x = torch.randn(b, 3, 2, 2 * t, generator=gen)
        t = t  # (H/2) * (W/2) = 1 * t positions
    else:
        x = torch.randn(b, t, 5, generator=gen)
    labels = torch.randint(0, spec["classes"], (b, t), generator=gen)
    return model, (x, labels)


def describe(seed: int) -> list[str]:
    """The op families model `seed` uses (for the results table)."""
    spec = architecture(seed)
    fams = {spec["input"]}
    for b in spec["blocks"]:
        if b["kind"] == "attention":
            fams.add("sdpa" if b["sdpa"] else "matmul-attention")
        elif b["kind"] == "quirks":
            fams.update(b["quirks"])
        else:
            fams.add(b["kind"])
        if b.get("norm") in ("layer", "rms"):
            fams.add(f"{b['norm']}-norm")
    if spec["input"] == "tokens" and spec["tie"]:
        fams.add("tied")
    return sorted(fams)
