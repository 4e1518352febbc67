"""Patterns from public bug reports of silent wrong numbers in other parallel systems (trial5a, h1).
Each builder returns (model, (inputs,)) or (model, args, kwargs); seeded so every rank builds the same model."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

B, T, H, V = 4, 8, 32, 96
NH, HD = 4, 8


def _g(seed=1):
    return torch.Generator().manual_seed(seed)


def _x(b=B, t=T, h=H, seed=1):
    return torch.randn(b, t, h, generator=_g(seed))


# 1. torchtitan#1373 (DeepSeek MLA): a shared rope key k_pe (B,T,1,d) expanded over sharded heads and
#    concatenated with per-head keys: its gradient must sum over every head (all ranks).
class SharedKeyExpand(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(H, NH * (HD + 4))
        self.k = nn.Linear(H, NH * HD)
        self.kpe = nn.Linear(H, 4)
        self.v = nn.Linear(H, NH * HD)
        self.o = nn.Linear(NH * HD, H)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, NH, HD + 4).transpose(1, 2)
        k = self.k(x).view(b, t, NH, HD)
        kpe = self.kpe(x).view(b, t, 1, 4).expand(-1, -1, NH, -1)
        k = torch.cat([k, kpe], dim=-1).transpose(1, 2)
        v = self.v(x).view(b, t, NH, HD).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, NH * HD))


def shared_key_expand():
    torch.manual_seed(0)
    return SharedKeyExpand(), (_x(),)


# 2. pytorch#190746: loss_parallel's log_softmax backward is identity unless consumed by nll_loss:
#    a soft-target (distillation) loss on vocab-parallel log_softmax.
class SoftTargetLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.head = nn.Linear(H, V, bias=False)
        self.teacher = nn.Linear(H, V, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        logp = F.log_softmax(self.head(h), dim=-1)
        tgt = F.softmax(self.teacher(h).detach() * 2.0, dim=-1)
        return -(tgt * logp).sum(-1).mean()


def soft_target_loss():
    torch.manual_seed(0)
    return SoftTargetLoss(), (torch.randint(0, V, (B, T), generator=_g()),)


# 3. Megatron-LM#7452 (GDN out_norm): a per-head RMSNorm whose weight (HD,) is shared by every head, on
#    head-sharded activations: the weight gradient is a sum over all heads (tp ranks).
class PerHeadNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(H, NH * HD)
        self.norm = nn.RMSNorm(HD)
        self.down = nn.Linear(NH * HD, H)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.norm(self.up(x).view(b, t, NH, HD))
        return self.down(h.reshape(b, t, NH * HD))


def per_head_norm():
    torch.manual_seed(0)
    return PerHeadNorm(), (_x(),)


# 4. Megatron-LM#1446 / gpt-neox#1259 (sequence-parallel LayerNorm gradients): LayerNorm between two
#    Megatron MLPs (its input sequence-sharded in SP), final LayerNorm.
class SeqParallelNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.f1, self.f2 = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)
        self.f3, self.f4 = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x):
        x = x + self.f2(F.gelu(self.f1(self.ln1(x))))
        x = x + self.f4(F.gelu(self.f3(x)))
        return self.ln2(x)


def seq_parallel_norm():
    torch.manual_seed(0)
    return SeqParallelNorm(), (_x(),)


# 5. Megatron-LM#7452 (MTP per-token loss with local counts): a masked mean CE whose valid-token counts
#    differ between batch shards (uneven mask) -- the denominator must be global.
class UnevenMaskedCE(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.head = nn.Linear(H, V)

    def forward(self, ids, labels, mask):
        logits = self.head(torch.tanh(self.emb(ids)))
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(mask)
        return (ce * mask).sum() / mask.sum()


def uneven_masked_ce():
    torch.manual_seed(0)
    ids = torch.randint(0, V, (B, T), generator=_g())
    labels = torch.randint(0, V, (B, T), generator=_g(2))
    mask = torch.zeros(B, T)
    mask[0, :7] = 1
    mask[1, :6] = 1
    mask[2, :1] = 1
    mask[3, :2] = 1
    return UnevenMaskedCE(), (ids, labels, mask)


# 6. torchtitan#4637: vocab-parallel Embedding with padding_idx owned by one shard (padding row's gradient
#    must be zero, other shards' rows must not lose gradient).
class PaddedEmbedding(nn.Module):
    def __init__(self, pad=70):
        super().__init__()
        self.emb = nn.Embedding(V, H, padding_idx=pad)
        self.head = nn.Linear(H, V)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def padded_embedding():
    torch.manual_seed(0)
    ids = torch.randint(0, V, (B, T), generator=_g())
    ids[:, -2:] = 70
    ids[0, 0] = 70 - 48  # the same local row on the other shard of 2
    return PaddedEmbedding(), (ids,)


def padded_embedding_neg():
    torch.manual_seed(0)
    ids = torch.randint(0, V, (B, T), generator=_g())
    ids[:, -2:] = V - 1
    return PaddedEmbedding(pad=-1), (ids,)


# 7. SDPA is_causal on a sharded sequence (context-parallel reports): causal attention with T-sharded q.
class CausalSDPA(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(H, 3 * H)
        self.o = nn.Linear(H, H)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, NH, HD).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, H))


def causal_sdpa():
    torch.manual_seed(0)
    return CausalSDPA(), (_x(),)


# 8. Fused QKV / fused SwiGLU under column parallel (Megatron/vLLM fused-weight sharding bugs):
#    qkv(x).chunk(3, -1) and gate_up(x).chunk(2, -1) split the sharded dim by position.
class FusedChunks(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(H, 3 * H)
        self.gate_up = nn.Linear(H, 4 * H)
        self.down = nn.Linear(2 * H, H)
        self.o = nn.Linear(H, H)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, NH, HD).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, H))
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


def fused_chunks():
    torch.manual_seed(0)
    return FusedChunks(), (_x(),)


# 9. F.glu on a column-parallel output (splits the sharded dim in halves).
class GluMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(H, 4 * H)
        self.down = nn.Linear(2 * H, H)

    def forward(self, x):
        return self.down(F.glu(self.up(x), dim=-1))


def glu_mlp():
    torch.manual_seed(0)
    return GluMLP(), (_x(),)


# 10. torch.split with uneven sizes and unbind along the hidden (column-sharded) dim.
class UnevenSplit(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(H, 40)
        self.a = nn.Linear(7, H)
        self.b = nn.Linear(33, H)
        self.c = nn.Linear(H, 4)

    def forward(self, x):
        p, q = self.up(x).split([7, 33], dim=-1)
        h = self.a(torch.relu(p)) * torch.sigmoid(self.b(q))
        u0, u1, u2, u3 = self.c(h).unbind(-1)
        return h + (u0 * u1 - u2 + u3.exp())[..., None]


def uneven_split():
    torch.manual_seed(0)
    return UnevenSplit(), (_x(),)


# 11. new_* factories sized from a sharded tensor, arange positions from a (sharded) seq length.
class NewFactories(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.pos = nn.Embedding(T, H)

    def forward(self, x):
        h = self.a(x)
        pos = torch.arange(h.size(1))
        h = h + self.pos(pos)[None]
        z = h.new_zeros(h.shape)
        o = h.new_ones(h.size(0), h.size(1), 1)
        f = h.new_full((h.size(-1),), 0.5)
        e = h.new_empty(h.shape).fill_(2.0)
        return (h + z) * o + f * e


def new_factories():
    torch.manual_seed(0)
    return NewFactories(), (_x(),)


# 12. cat of two column-sharded values along the sharded dim, then a linear.
class CatSharded(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, 2 * H)
        self.c = nn.Linear(3 * H, H)

    def forward(self, x):
        return self.c(torch.cat([torch.relu(self.a(x)), torch.tanh(self.b(x))], dim=-1))


def cat_sharded():
    torch.manual_seed(0)
    return CatSharded(), (_x(),)


# 13. mean over a padded dim (F.pad then mean over it) and over a padded seq.
class MeanPadded(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        p = F.pad(h, (0, 5))              # hidden dim 32 -> 37
        m = p.mean(-1, keepdim=True)
        s = F.pad(h, (0, 0, 2, 1), value=1.0).mean(1, keepdim=True)   # seq 8 -> 11
        return self.b(h - m + s)


def mean_padded():
    torch.manual_seed(0)
    return MeanPadded(), (_x(),)


# 14. torch.where with a scalar tensor, clamp with tensor bounds (a parameter and an activation).
class WhereClamp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.lo = nn.Parameter(torch.full((H,), -0.3))
        self.b = nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        h = torch.where(h > 0, h, torch.tensor(0.1) * h)
        hi = self.b(x).abs() + 0.2
        return torch.clamp(h, min=self.lo, max=hi)


def where_clamp():
    torch.manual_seed(0)
    return WhereClamp(), (_x(),)


# 15. repeat_interleave along the batch (beam expansion) and along the hidden dim.
class RepeatInterleave(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H // 2)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x).repeat_interleave(2, dim=-1)
        r = x.repeat_interleave(3, dim=0)                  # (3B, T, H)
        return self.b(h * x) + r.view(B, 3, T, H).mean(1)


def repeat_interleave():
    torch.manual_seed(0)
    return RepeatInterleave(), (_x(),)


# 16. index_select / gather with indices computed from (sharded) activations.
class DataIndices(nn.Module):
    def __init__(self):
        super().__init__()
        self.score = nn.Linear(H, 1)
        self.a = nn.Linear(H, H)
        self.table = nn.Parameter(torch.randn(12, H))

    def forward(self, x):
        s = self.score(x).squeeze(-1)                     # (B, T)
        top = s.argmax(dim=1)                             # (B,)
        picked = torch.gather(x, 1, top[:, None, None].expand(-1, 1, H))   # (B, 1, H)
        rows = torch.index_select(self.table, 0, (top % 12))               # (B, H)
        return self.a(x + picked) * rows[:, None]


def data_indices():
    torch.manual_seed(0)
    return DataIndices(), (_x(),)


# 17. in-place ops on views of sharded activations (narrow().mul_, slice add_, select fill).
class InPlaceViews(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        h.narrow(-1, 3, 10).mul_(2.0)
        h[:, 1:5].add_(1.0)
        h[..., 0] = 0.25
        return self.b(torch.tanh(h))


def in_place_views():
    torch.manual_seed(0)
    return InPlaceViews(), (_x(),)


# 18. a parameter used both sharded (in a linear) and replicated (a regularizer on it; W^T W).
class TwoUseWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, 2 * H)
        self.b = nn.Linear(2 * H, H)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        gram = self.a.weight @ self.a.weight.t()          # (2H, 2H)
        reg = (gram - torch.eye(2 * H)).pow(2).mean() + self.b.weight.norm()
        return (y ** 2).mean() + 0.01 * reg


def two_use_weight():
    torch.manual_seed(0)
    return TwoUseWeight(), (_x(),)


# 19. a batch-Partial value (Gram of batch-sharded activations) reaching a non-linear op.
class BatchGram(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x).flatten(0, 1)                       # (B*T, H)
        g = torch.softmax(h.t() @ h / h.size(0), dim=-1)  # Partial over dp before the softmax
        c = h.mean(0, keepdim=True)
        return self.b(h @ g - c).view(B, T, H)


def batch_gram():
    torch.manual_seed(0)
    return BatchGram(), (_x(),)


# 20. row-parallel bias + replicated LayerNorm weight and scalar parameters (gradient reduction of
#     replicated params under TP), plus a learnable temperature.
class ReplicatedParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.up = nn.Linear(H, 4 * H)
        self.down = nn.Linear(4 * H, H)
        self.temp = nn.Parameter(torch.tensor(1.5))
        self.scale = nn.Parameter(torch.ones(4 * H))

    def forward(self, x):
        h = F.gelu(self.up(self.ln(x))) * self.scale
        return self.down(h) * self.temp + x


def replicated_params():
    torch.manual_seed(0)
    return ReplicatedParams(), (_x(),)


# 21. diagonal / trace of a sharded matrix, einsum with a repeated index.
class DiagonalOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.w = nn.Parameter(torch.randn(H, H) * 0.1)

    def forward(self, x):
        h = self.a(x)                                     # (B, T, H)
        m = h.transpose(1, 2) @ h                         # (B, H, H)
        d = torch.diagonal(m, dim1=-2, dim2=-1)           # (B, H)
        e = torch.einsum("bii->bi", m)
        tr = torch.trace(self.w @ self.w.t())
        return h * (d + e)[:, None] + tr


def diagonal_ops():
    torch.manual_seed(0)
    return DiagonalOps(), (_x(),)


# 22. nn.MultiheadAttention (packed in_proj weight, split by position) with a key padding mask.
class TorchMHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(H, NH, batch_first=True, dropout=0.0)
        self.f = nn.Linear(H, H)

    def forward(self, x, pad):
        a, _ = self.mha(x, x, x, key_padding_mask=pad, need_weights=False)
        return self.f(a)


def torch_mha():
    torch.manual_seed(0)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, -3:] = True
    pad[3, -5:] = True
    return TorchMHA(), (_x(), pad)


# 23. logsumexp / one_hot over the (vocab-sharded) class dim, z-loss style + soft labels via one_hot.
class OneHotLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.head = nn.Linear(H, V)

    def forward(self, ids, labels):
        logits = self.head(self.emb(ids))
        oh = F.one_hot(labels, V).float() * 0.9 + 0.1 / V
        lse = torch.logsumexp(logits, -1)
        return (lse - (oh * logits).sum(-1)).mean() + 1e-2 * (lse ** 2).mean()


def one_hot_loss():
    torch.manual_seed(0)
    return OneHotLoss(), (torch.randint(0, V, (B, T), generator=_g()), torch.randint(0, V, (B, T), generator=_g(2)))


# 24. masked_fill with a broadcast (B,1,1,T) mask and a float min on scores; attention via matmul.
class MaskedScores(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(H, 3 * H)
        self.o = nn.Linear(H, H)

    def forward(self, x, am):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, NH, HD).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / HD ** 0.5
        s = s.masked_fill(am[:, None, None, :] == 0, torch.finfo(s.dtype).min)
        return self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, H))


def masked_scores():
    torch.manual_seed(0)
    am = torch.ones(B, T, dtype=torch.long)
    am[0, -2:] = 0
    am[2, -6:] = 0
    return MaskedScores(), (_x(), am)


# 25. A "ddp" uneven batch (5 rows on 2 ranks) with a per-sample normalisation over the batch dim:
#     batch statistics (mean/var over dim 0) without BatchNorm.
class BatchStats(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        mu = h.mean(dim=(0, 1), keepdim=True)
        var = h.var(dim=(0, 1), keepdim=True, unbiased=True)
        return self.b((h - mu) / (var + 1e-5).sqrt())


def batch_stats():
    torch.manual_seed(0)
    return BatchStats(), (_x(b=5),)


# 26. scatter_add of token features into per-bucket slots (MoE dispatch / segment sum) with indices
#     from argmax of activations; index_add_ on an activation.
class SegmentSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(H, 6)
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        flat = x.flatten(0, 1)                            # (B*T, H)
        idx = self.router(flat).argmax(-1)                # (B*T,)
        h = self.a(flat)
        slots = h.new_zeros(6, H).index_add(0, idx, h)    # (6, H)
        back = slots[idx]                                 # (B*T, H)
        return self.b(back + h).view(B, T, H)


def segment_sum():
    torch.manual_seed(0)
    return SegmentSum(), (_x(),)


# 27. F.normalize + cosine similarity logits with a learnable scale (CLIP-like contrastive over batch).
class Contrastive(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x, y):
        u = F.normalize(self.a(x).mean(1), dim=-1)
        w = F.normalize(self.b(y).mean(1), dim=-1)
        logits = u @ w.t() * self.logit_scale.exp()
        lab = torch.arange(u.size(0))
        return (F.cross_entropy(logits, lab) + F.cross_entropy(logits.t(), lab)) / 2


def contrastive():
    torch.manual_seed(0)
    return Contrastive(), (_x(), _x(seed=3))


# 28. scaled dot product with an additive float bias parameter (relative position bias, T5/Swin-like)
#     broadcast over batch and heads, and an unused-output branch.
class AttnBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(H, 3 * H)
        self.bias = nn.Parameter(torch.randn(NH, T, T) * 0.1)
        self.o = nn.Linear(H, H)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, NH, HD).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[None])
        return self.o(a.transpose(1, 2).reshape(b, t, H))


def attn_bias():
    torch.manual_seed(0)
    return AttnBias(), (_x(),)


# 29. cross-entropy on a non-contiguous / transposed logits layout (B, V, T) with ignore_index,
#     reduction='sum' divided by a constant (Megatron loss scaling by microbatches).
class CETransposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.head = nn.Linear(H, V)

    def forward(self, ids, labels):
        logits = self.head(torch.tanh(self.emb(ids))).transpose(1, 2)   # (B, V, T)
        return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / 7.0


def ce_transposed():
    torch.manual_seed(0)
    labels = torch.randint(0, V, (B, T), generator=_g(2))
    labels[1, :3] = -100
    return CETransposed(), (torch.randint(0, V, (B, T), generator=_g()), labels)


# 30. running max / cummax over the sequence and a max-pool over a sharded hidden dim with odd kernel.
class CumMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H // 2, H)

    def forward(self, x):
        h = self.a(x)
        c = torch.cummax(h, dim=1).values
        p = F.max_pool1d(c, kernel_size=3, stride=2, padding=1)   # pools the last (hidden) dim: H -> H/2
        return self.b(p)


def cum_max():
    torch.manual_seed(0)
    return CumMax(), (_x(),)


BUILDERS = {name: fn for name, fn in list(globals().items())
            if callable(fn) and not isinstance(fn, type) and not name.startswith("_")
            and fn.__module__ == __name__}


# ---- batch 2 -------------------------------------------------------------------------------------------
class EmbBagOffsets(nn.Module):
    """EmbeddingBag with 1-D ids + offsets (positions into the flat ids: not per-sample rows)."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(V, H, mode="mean")
        self.f = nn.Linear(H, H)

    def forward(self, ids, offsets):
        return self.f(self.bag(ids, offsets))


def emb_bag_offsets():
    torch.manual_seed(0)
    ids = torch.randint(0, V, (20,), generator=_g())
    return EmbBagOffsets(), (ids, torch.tensor([0, 3, 9, 10, 15, 17]))


class CdistCross(nn.Module):
    """cdist over the (column-sharded) feature dim, cross product over a dim of 3, pixel_shuffle of channels."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, 12)
        self.c = nn.Linear(T, H)

    def forward(self, x):
        u, w = self.a(x), self.a(x.flip(1))
        d = torch.cdist(u, w)                                     # (B, T, T)
        v = self.b(x).view(x.size(0), T, 4, 3)
        cr = torch.linalg.cross(v, v.roll(1, dims=2), dim=-1)     # (B, T, 4, 3)
        ps = F.pixel_shuffle(self.b(x).permute(0, 2, 1).reshape(x.size(0), 12, 2, 4), 2)  # (B, 3, 4, 8)
        return self.c(d) + cr.sum((-1, -2))[..., None] + ps.mean()


def cdist_cross():
    torch.manual_seed(0)
    return CdistCross(), (_x(),)


class LinearAlgebraMix(nn.Module):
    """addmm with beta/alpha, lerp with a tensor weight, bilinear, baddbmm, layer_norm over (T, H)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(H, H) * 0.1)
        self.bias = nn.Parameter(torch.randn(H) * 0.1)
        self.bil = nn.Bilinear(H, H, 8)
        self.f = nn.Linear(H, H)
        self.g = nn.Linear(8, H)

    def forward(self, x):
        flat = x.flatten(0, 1)
        h = torch.addmm(self.bias, flat, self.w, beta=0.5, alpha=2.0).view_as(x)
        k = self.f(x)
        m = torch.lerp(h, k, torch.sigmoid(k))
        bb = torch.baddbmm(m, m, m.transpose(1, 2) @ m * 0.01, beta=0.3, alpha=0.7)
        ln = F.layer_norm(bb, (T, H))
        return ln + self.g(self.bil(x, m))


def linear_algebra_mix():
    torch.manual_seed(0)
    return LinearAlgebraMix(), (_x(),)


class UnfoldTake(nn.Module):
    """Sliding windows over the sequence (Tensor.unfold), torch.take with flat indices, take_along_dim."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(3 * H, H)

    def forward(self, x, flat_idx):
        h = self.a(x)
        win = h.unfold(1, 3, 1)                                   # (B, T-2, H, 3)
        w = self.b(win.flatten(-2))                               # (B, T-2, H)
        t = torch.take(h, flat_idx)                               # (K,)
        order = h.argsort(dim=-1)
        tad = torch.take_along_dim(h, order, dim=-1)
        return w.sum(1, keepdim=True) + tad + t.mean()


def unfold_take():
    torch.manual_seed(0)
    return UnfoldTake(), (_x(), torch.randint(0, B * T * H, (10,), generator=_g()))


class CTCHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Linear(H, 12)

    def forward(self, x, targets, in_len, tgt_len):
        lp = F.log_softmax(self.f(x), -1).transpose(0, 1)         # (T, B, C)
        return F.ctc_loss(lp, targets, in_len, tgt_len, blank=0, reduction="mean", zero_infinity=True)


def ctc_head():
    torch.manual_seed(0)
    targets = torch.randint(1, 12, (B, 3), generator=_g())
    return CTCHead(), (_x(), targets, torch.tensor([8, 7, 8, 6]), torch.tensor([3, 2, 3, 1]))


class SoftmaxOverBatch(nn.Module):
    """Position-reading ops over the BATCH dim (softmax / cumsum / sort over dim 0) under a ddp axis."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        s = torch.softmax(h, dim=0)
        c = torch.cumsum(h, dim=0)
        srt = torch.sort(h, dim=0).values
        return self.b(s * c + srt)


def softmax_over_batch():
    torch.manual_seed(0)
    return SoftmaxOverBatch(), (_x(b=5),)


BUILDERS2 = {n: globals()[n] for n in ("emb_bag_offsets", "cdist_cross", "linear_algebra_mix", "unfold_take",
                                       "ctc_head", "softmax_over_batch")}
BUILDERS.update(BUILDERS2)
