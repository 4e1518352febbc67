"""Op patterns from public bug reports of other auto-parallel systems (branch trial2). Each builder() ->
(model, args), seeded; the model returns a scalar loss or a tensor (rehearse: mean of squares)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

B, T, H, E = 4, 8, 32, 4


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class MoEScatter(nn.Module):
    """top-2 routing: gates by scatter, expert outputs index_add'ed per token, load-balancing aux loss."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(H, H)
        self.router = nn.Linear(H, E, bias=False)
        self.w1 = nn.Parameter(torch.randn(E, H, 2 * H) * 0.1)
        self.w2 = nn.Parameter(torch.randn(E, 2 * H, H) * 0.1)
        self.out = nn.Linear(H, H)

    def forward(self, x):
        h = self.inp(x).reshape(-1, H)                              # (N, H)
        logits = self.router(h)
        probs = logits.softmax(-1)
        topv, topi = probs.topk(2, dim=-1)                          # (N, 2)
        gates = torch.zeros_like(probs).scatter(1, topi, topv)      # (N, E)
        n = h.shape[0]
        tok = torch.arange(n).repeat_interleave(2)                  # (2N,)
        exp = topi.reshape(-1)
        hin = h[tok]                                                # (2N, H)
        mid = F.gelu(torch.einsum("nh,nhf->nf", hin, self.w1[exp]))
        eo = torch.einsum("nf,nfh->nh", mid, self.w2[exp]) * topv.reshape(-1, 1)
        y = torch.zeros_like(h).index_add(0, tok, eo)
        frac = F.one_hot(topi[:, 0], E).float().mean(0)
        aux = E * (frac * probs.mean(0)).sum()
        out = self.out(y + gates.sum(-1, keepdim=True) * h).reshape(B, T, H)
        return out.pow(2).mean() + 0.01 * aux


def moe_scatter():
    torch.manual_seed(0)
    return MoEScatter(), (_x(B, T, H),)


class MaskedMean(nn.Module):
    """masked mean pooling (sum / count of a mask) and a loss divided by a data-dependent token count."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, H)
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)
        self.cls = nn.Linear(H, 50)

    def forward(self, ids, mask, labels):
        h = self.b(F.gelu(self.a(self.emb(ids))))
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        logits = self.cls(h)
        per_tok = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none")
        count = (labels != -100).sum()
        return per_tok.sum() / count + pooled.pow(2).mean()


def masked_mean():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 3:] = 0
    mask[1, 6:] = 0
    mask[3, 1:] = 0
    labels = ids.clone()
    labels[mask == 0] = -100
    labels[2, :5] = -100
    return MaskedMean(), (ids, mask, labels)


class MeanOfSharded(nn.Module):
    """loss = main + 0.1 * mean of the (tp-sharded) hidden + 0.05 * amax + prod of a small slice."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):
        h = F.gelu(self.a(x))
        out = self.b(h)
        return (out.pow(2).mean() + 0.1 * h.mean() + 0.05 * h.amax() + 0.01 * h.amax(-1).mean()
                + 0.01 * (1 + 0.1 * h[..., :6]).prod(-1).mean())


def mean_of_sharded():
    torch.manual_seed(0)
    return MeanOfSharded(), (_x(B, T, H),)


class NormsOverSharded(nn.Module):
    """LayerNorm and a hand-written RMSNorm on the output of a column-parallel linear (hidden 4H sharded)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
        self.ln = nn.LayerNorm(4 * H)
        self.rms_w = nn.Parameter(torch.ones(4 * H) + 0.1 * torch.randn(4 * H))

    def forward(self, x):
        h = self.a(x)
        h1 = self.ln(h)
        h2 = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.rms_w
        return self.b(F.gelu(h1 + h2))


def norms_over_sharded():
    torch.manual_seed(0)
    return NormsOverSharded(), (_x(B, T, H),)


class FusedQKVBias(nn.Module):
    """fused QKV linear, chunk(3) / split along the (tp-sharded) output dim, heads, an additive attention bias
    parameter (heads, T, T), repeat_interleave of kv heads, softmax, output projection."""

    def __init__(self, nh=4, nkv=2):
        super().__init__()
        self.nh, self.nkv, self.d = nh, nkv, H // nh
        self.qkv = nn.Linear(H, H + 2 * nkv * self.d)
        self.bias = nn.Parameter(0.1 * torch.randn(nh, T, T))
        self.o = nn.Linear(H, H)
        self.qkv2 = nn.Linear(H, 3 * H)

    def forward(self, x):
        q, k, v = self.qkv(x).split([H, self.nkv * self.d, self.nkv * self.d], dim=-1)
        q = q.view(B, T, self.nh, self.d).transpose(1, 2)
        k = k.view(B, T, self.nkv, self.d).transpose(1, 2).repeat_interleave(self.nh // self.nkv, dim=1)
        v = v.view(B, T, self.nkv, self.d).transpose(1, 2).repeat_interleave(self.nh // self.nkv, dim=1)
        s = q @ k.transpose(-1, -2) / self.d ** 0.5 + self.bias
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H)
        q2, k2, v2 = self.qkv2(x).chunk(3, dim=-1)
        return self.o(a) + (q2 * k2).sigmoid() * v2


def fused_qkv_bias():
    torch.manual_seed(0)
    return FusedQKVBias(), (_x(B, T, H),)


class GatherMaxOps(nn.Module):
    """gather along a (tp-sharded) hidden dim, max(dim) values + indices, cummax, F.pad, torch.stack."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x, idx):
        h = self.a(x)                                           # (B, T, 2H)
        g = torch.gather(h, -1, idx)                             # (B, T, 5)
        mv, mi = h.max(dim=-1)                                   # (B, T)
        cm = torch.cummax(h, dim=1).values                       # along T
        p = F.pad(h, (1, 2))[..., 1:-2]                          # pad the sharded dim, then cut back
        st = torch.stack([h, cm, p], dim=0).sum(0)
        out = self.b(st)
        return out.pow(2).mean() + g.pow(2).mean() + mv.mean() + (mi.float() * 1e-3).mean()


def gather_max_ops():
    torch.manual_seed(0)
    idx = torch.randint(0, 2 * H, (B, T, 5), generator=torch.Generator().manual_seed(4))
    return GatherMaxOps(), (_x(B, T, H), idx)


class ImageOps(nn.Module):
    """F.unfold (im2col) -> linear -> F.fold-free reshape -> pixel_shuffle -> conv."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3 * 4 * 4, 16)
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.head = nn.Linear(8 * 16 * 16, 5)

    def forward(self, x):                                       # (B, 3, 16, 16)
        cols = F.unfold(x, 4, stride=4).transpose(1, 2)          # (B, 16, 48)
        h = self.proj(cols).transpose(1, 2).reshape(B, 16, 4, 4)
        h = F.pixel_shuffle(h, 2)                                # (B, 4, 8, 8)
        h = F.interpolate(self.conv(h), scale_factor=2.0, mode="nearest")
        return self.head(h.flatten(1))


def image_ops():
    torch.manual_seed(0)
    return ImageOps(), (_x(B, 3, 16, 16),)


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(H, 4, batch_first=True)
        self.ff = nn.Linear(H, H)

    def forward(self, x, kpm):
        a, w = self.mha(x, x, x, key_padding_mask=kpm, need_weights=True)
        return self.ff(a).pow(2).mean() + w.pow(2).mean()


def mha():
    torch.manual_seed(0)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, 5:] = True
    return MHA(), (_x(B, T, H), kpm)


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(H, H)
        self.gru = nn.GRU(H, H, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * H, 5)

    def forward(self, x):
        o, hn = self.gru(self.emb(x))
        return self.head(o).pow(2).mean() + hn.pow(2).mean()


def gru():
    torch.manual_seed(0)
    return GRUNet(), (_x(B, T, H),)


class WeightNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.utils.parametrizations.weight_norm(nn.Linear(H, 2 * H))
        self.b = nn.utils.parametrizations.weight_norm(nn.Linear(2 * H, H), dim=1)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


def weight_norm():
    torch.manual_seed(0)
    return WeightNormNet(), (_x(B, T, H),)


class TwoViews(nn.Module):
    """one parameter W used as x @ W and as y @ W.t() (an autoencoder with tied transposed decoder) and as
    W.view(-1) in a penalty."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(H, 2 * H) * 0.1)
        self.b = nn.Parameter(torch.zeros(2 * H))

    def forward(self, x):
        z = F.relu(x @ self.w + self.b)
        rec = z @ self.w.t()
        return (rec - x).pow(2).mean() + 1e-3 * self.w.view(-1).pow(2).sum()


def two_views():
    torch.manual_seed(0)
    return TwoViews(), (_x(B, T, H),)


class Uneven(nn.Module):
    """vocab 257, hidden 60 (not divisible by 4), heads of 15: embedding -> attention-ish -> tied head, CE."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(257, 60)
        self.a, self.b = nn.Linear(60, 150), nn.Linear(150, 60)
        self.ln = nn.LayerNorm(60)

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = h + self.b(F.gelu(self.a(self.ln(h))))
        logits = h @ self.emb.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def uneven():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    return Uneven(), (torch.randint(0, 257, (B, T), generator=g), torch.randint(0, 257, (B, T), generator=g))


class DropoutTP(nn.Module):
    """dropout between column- and row-parallel linears (masks compared only for determinism)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.b(self.drop(F.gelu(self.a(x))))


def dropout_tp():
    torch.manual_seed(0)
    return DropoutTP(), (_x(B, T, H),)


PATTERNS = {f.__name__: f for f in (moe_scatter, masked_mean, mean_of_sharded, norms_over_sharded, fused_qkv_bias,
                                    gather_max_ops, image_ops, mha, gru, weight_norm, two_views, uneven)}
