"""Models behind the wrong numbers found by trying outside patterns (branch `trial`), importable by spawned
ranks. Each builder returns (model, example_inputs); seeded, so every rank builds the same weights."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

B, T, H = 4, 8, 16


class ComplexRotary(nn.Module):
    """linear -> view_as_complex -> complex rotation (polar) -> view_as_real -> linear: Meta-Llama's complex
    rotary embedding between two projections. Under tp the second projection is column parallel, so the
    gradient reaching the replicated complex region is Partial and must be all-reduced (Megatron's f)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        z = torch.view_as_complex(h.reshape(B, T, H // 2, 2))
        ang = torch.arange(T).float()[:, None] * torch.arange(H // 2).float()[None] * 0.1
        h = torch.view_as_real(z * torch.polar(torch.ones_like(ang), ang)).reshape(B, T, H)
        return self.b(h)


def complex_rotary():
    torch.manual_seed(0)
    return ComplexRotary(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


class EmaUnderNoGrad(nn.Module):
    """An EMA buffer updated in place inside `torch.no_grad()` from a parameter and an activation, read by the
    next step's forward: the buffer must carry no autograd history (eager: no_grad)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.register_buffer("ema", torch.zeros(H))

    def forward(self, x):
        h = self.a(x)
        out = self.b(h - self.ema)
        with torch.no_grad():
            self.ema.mul_(0.5).add_(self.a.bias * 0.25 + h.mean((0, 1)) * 0.25)
        return out


def ema_under_no_grad():
    torch.manual_seed(0)
    return EmaUnderNoGrad(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


class BatchNormFedBias(nn.Module):
    """linear (with bias) -> BatchNorm -> linear, loss = sum of squares: the first bias's gradient is 0 in exact
    arithmetic (BatchNorm removes any shift), computed in fp32 as a sum of terms of about 1e-2 that cancel, so
    fp32 leaves about 7e-4 of rounding on one device (MobileViT's conv biases before BatchNorm, 1e-4)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn, self.b = nn.Linear(16, 64), nn.BatchNorm1d(64), nn.Linear(64, 8)

    def forward(self, x):
        return self.b(self.bn(self.a(x))).pow(2).sum()


def bn_fed_bias(dtype: str = "float32", scale: float = 1e-3):
    """`BatchNormFedBias` cast whole to `dtype` on inputs of `scale` (a 16-bit model: 0.1, where its own forward
    stays within 1% of float64's)."""
    torch.manual_seed(0)
    return BatchNormFedBias().to(getattr(torch, dtype)), ((torch.randn(64, 16) * scale).to(getattr(torch, dtype)),)


class MakesFloat32BatchNorm(BatchNormFedBias):
    """`BatchNormFedBias` whose forward makes float32 tensors of its own, as DAB-DETR's does (transformers'
    modeling_dab_detr.py): zero queries in the default dtype fed to an anchor head, a softmax computed in float32
    and cast back. `a.bias`'s gradient is 0 in exact arithmetic and ~1e-3 of fp32 rounding; `anchor.bias`'s is
    5e-7 x 64 samples = 3.2e-5 per element, with no cancellation (the size of DAB-DETR's difference)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Linear(64, 8)

    def forward(self, x):
        h = self.bn(self.a(x))
        queries = self.anchor(torch.zeros(x.shape[0], 64))  # float32 whatever the model's dtype
        att = torch.softmax(h, dim=-1, dtype=torch.float32).to(h.dtype)
        return self.b(h * att * 64).pow(2).sum() + 5e-7 * queries.sum()


def makes_float32_bn():
    torch.manual_seed(0)
    return MakesFloat32BatchNorm(), (torch.randn(64, 16) * 1e-3,)


def dropout_mlp():
    """Linear -> Dropout(0.5) -> Linear, loss = sum of squares: each rank draws its own masks, so a rehearsal
    cannot match one device (the report names the random op)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 8)), (torch.randn(8, 16),)


def bn_fed_bias_bf16():
    return bn_fed_bias("bfloat16", 0.1)


def bn_fed_bias_fp16():
    return bn_fed_bias("float16", 0.1)


class NormedLinear(nn.Module):
    """Linear (with bias) -> instance norm over the sequence (per sample and channel, no affine)."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.linear = nn.Linear(h, h)

    def forward(self, x):
        return F.instance_norm(self.linear(x).transpose(1, 2)).transpose(1, 2)


class NormFedBiasStack(nn.Module):
    """4 `NormedLinear` blocks and a head, loss = sum of squares, on inputs of 1e-3: the first block's bias
    gradient is 0 in exact arithmetic (the norm removes any per-channel shift) and a sum of large terms that
    cancel in fp32 (their size grows as the inputs' spread shrinks), as `BatchNormFedBias`, but with a norm
    over each sample alone, so microbatches compute what the whole batch does (a pipeline's model)."""

    def __init__(self, blocks: int = 4, h: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(NormedLinear(h) for _ in range(blocks))
        self.head = nn.Linear(h, 8)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).pow(2).sum()


def norm_fed_bias_stack(batch: int = 8, dtype: str = "float32", scale: float = 1e-3):
    torch.manual_seed(0)
    x = torch.randn(batch, 16, 32, generator=torch.Generator().manual_seed(1)) * scale
    return NormFedBiasStack().to(getattr(torch, dtype)), (x.to(getattr(torch, dtype)),)


class BoolMaskFill(nn.Module):
    """`h[mask] = embed` with a boolean (B, T) mask made in forward (Wav2Vec2's SpecAugment time mask, drawn by
    numpy, becomes a constant of the graph) on a (B, T, H) activation: the mask covers two dims of h."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.embed = nn.Parameter(torch.randn(H))

    def forward(self, x):
        h = self.a(x)
        mask = torch.tensor([[(i + j) % 3 == 0 for i in range(T)] for j in range(B)])
        h[mask] = self.embed
        return self.b(h)


def bool_mask_fill():
    torch.manual_seed(0)
    return BoolMaskFill(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


class AuxLossInPlace(nn.Module):
    """transformers' MoE causal LMs: `loss += coef * aux_loss` written in place on a mean cross-entropy."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.router, self.head = nn.Embedding(32, H), nn.Linear(H, 4), nn.Linear(H, 32)

    def forward(self, ids, labels):
        h = self.emb(ids)
        loss = nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())
        aux = self.router(h).softmax(-1).mean((0, 1)).pow(2).sum()
        loss += 0.1 * aux
        return loss


def aux_loss_in_place():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return AuxLossInPlace(), (torch.randint(0, 32, (B, T), generator=g), torch.randint(0, 32, (B, T), generator=g))


class EmbeddingGradByFreq(nn.Module):
    """nn.Embedding(scale_grad_by_freq=True): the backward divides each row's gradient by the number of times
    its id occurs in the whole batch of indices."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.a = nn.Embedding(12, H, scale_grad_by_freq=True), nn.Linear(H, H)

    def forward(self, ids):
        return self.a(self.emb(ids))


def embedding_grad_by_freq():
    torch.manual_seed(0)
    # id 1 four times in the first half of the batch, 2 twice in each half: local counts differ from global ones
    return EmbeddingGradByFreq(), (torch.tensor([[1, 2, 3, 1], [1, 4, 5, 2], [1, 1, 2, 7], [8, 9, 2, 0]]),)


class UnevenGatherThenStrided(nn.Module):
    """A column-parallel linear of width 15 (no bias) on tp=2 (shards 8 and 7), whose gathered output goes to
    an op that reads memory layout: `as_strided` (every other feature, with the strides of a contiguous
    (B, T, 15) tensor) or `view(B, T * 15)` (merging the last dim with T needs contiguous memory). The
    all-gather pads the short shard for the collective and trims the padding."""

    W = 15

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.a = nn.Linear(H, self.W, bias=False)  # no bias: the gathered tensor itself is read
        self.b = nn.Linear(self.W // 2, H) if kind == "as_strided" else nn.Linear(T * self.W, H)

    def forward(self, x):
        h = self.a(x)
        if self.kind == "as_strided":
            return self.b(h.as_strided((B, T, self.W // 2), (T * self.W, self.W, 2)))
        return self.b(h.view(B, T * self.W))


def uneven_gather_as_strided():
    torch.manual_seed(0)
    return UnevenGatherThenStrided("as_strided"), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


def uneven_gather_view():
    torch.manual_seed(0)
    return UnevenGatherThenStrided("view"), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


class SpectralNormLinear(nn.Module):
    """`nn.utils.spectral_norm`: one power iteration per training forward, written into the `weight_u` /
    `weight_v` buffers with `F.normalize(..., out=u)` under no_grad (exported as `aten.div.out`)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.utils.spectral_norm(nn.Linear(H, H))

    def forward(self, x):
        return self.b(self.a(x).relu())


def spectral_norm_linear():
    torch.manual_seed(0)
    return SpectralNormLinear(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


class AsStridedOfTranspose(nn.Module):
    """`as_strided` on a transposed activation, with strides into the activation's memory (every other
    position of the untransposed (B, T, H) storage): eager reads h's storage, whatever the transpose's strides."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(T // 2, H)

    def forward(self, x):
        h = self.a(x)
        return self.b(h.transpose(1, 2).as_strided((B, H, T // 2), (T * H, 1, 2 * H)))


class _CrossMapLRN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.lrn, self.lin2 = nn.Linear(16, 64), nn.CrossMapLRN2d(3), nn.Linear(64, 8)

    def forward(self, x, y):
        h = self.lrn(self.lin1(x).view(x.shape[0], 4, 4, 4))
        return F.mse_loss(self.lin2(h.reshape(x.shape[0], -1)), y)


def cross_map_lrn():
    """nn.CrossMapLRN2d (a legacy autograd.Function) between two Linears: its forward writes `pow(out=buf)` and
    `copy_` into fresh `input.new()` buffers resized with `resize_as_`; written out of place as aten.copy /
    aten.resize_as (which have no autograd formula), every sharded program failed in backward (trial 9b)."""
    torch.manual_seed(0)
    return _CrossMapLRN(), (torch.randn(4, 16), torch.randn(4, 8))


def as_strided_of_transpose():
    torch.manual_seed(0)
    return AsStridedOfTranspose(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


class InputWrittenInPlace(nn.Module):
    """Forward doubles its input `x` in place (eager mutates the caller's tensor, every row), then reads it;
    `y` is the batch that a "ddp" axis shards."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(H, H)

    def forward(self, x, y):
        x.mul_(2.0)
        return self.a(y) + x.mean(0)


def input_written_in_place():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return InputWrittenInPlace(), (torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g))


class PenaltyNet(nn.Module):
    """LayerNorm -> Linear -> tanh -> Linear: the critic of a gradient penalty (WGAN-GP), whose loss reads the
    gradient with respect to the input (`autograd.grad(..., create_graph=True)`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x):
        return self.b(torch.tanh(self.a(self.ln(x))))


def penalty_net():
    torch.manual_seed(0)
    return PenaltyNet(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


def gradient_penalty_rank(rank: int, world_size: int, spec) -> dict:
    """Rank body: loss = mean(out^2) + mean(d out.sum() / dx ^2) on the ParallelModule and on eager; the
    largest |difference| of x.grad and of this rank's parameter-gradient shards."""
    import copy

    import parallelizer
    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.rewriter.state import shard_tensor
    from parallelizer.runtime.launch import create_groups
    from parallelizer.runtime.module import ParallelModule

    model, (x,) = penalty_net()
    reference = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(parallelizer.trace(copy.deepcopy(model), (x,)), spec, rank, model)
    grads = []
    for m in (pm, reference):
        xi = x.clone().requires_grad_(True)
        out = m(xi)
        (g,) = torch.autograd.grad(out.sum(), xi, create_graph=True)
        (out.pow(2).mean() + g.pow(2).mean()).backward()
        grads.append(xi.grad)
    worst = max(float((p.grad - shard_tensor(reference.get_parameter(fqn).grad, spec.params[fqn], spec.mesh,
                                             pm.coords)).abs().max()) for fqn, p in pm.named_parameters())
    return {"x_grad": float((grads[0] - grads[1]).abs().max()), "param_grad": worst,
            "scale": float(max(p.grad.abs().max() for p in reference.parameters()))}


class InPlaceThroughViews(nn.Module):
    """In-place writes through views of an activation (`narrow().mul_`, a slice's `add_`, `h[..., 0] = c`)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        h.narrow(-1, 3, 10).mul_(2.0)
        h[:, 1:5].add_(1.0)
        h[..., 0] = 0.25
        return self.b(torch.tanh(h))


def in_place_through_views():
    torch.manual_seed(0)
    return InPlaceThroughViews(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


class BannedClasses(nn.Module):
    """linear -> tanh -> head whose logits of two classes are set to -inf (banned tokens; Megatron's padded
    vocabulary; the masked diagonal of SimCLR's in-batch similarities) -> cross-entropy. Class 8 is the first
    class of the second shard on tp=2, where a rank that does not hold a row's target gathers (clamped)."""

    def __init__(self, v: int = 16) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(H, H), nn.Linear(H, v)
        banned = torch.zeros(v, dtype=torch.bool)
        banned[[3, v // 2]] = True
        self.register_buffer("banned", banned, persistent=False)

    def forward(self, x, y):
        logits = self.head(torch.tanh(self.a(x))).masked_fill(self.banned, float("-inf"))
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def banned_classes():
    torch.manual_seed(0)
    y = torch.randint(0, 16, (B, T), generator=torch.Generator().manual_seed(7))
    y[(y == 3) | (y == 8)] = 5
    return BannedClasses(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)), y)
