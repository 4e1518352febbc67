"""Op patterns for trial3b (not tried before). Each builder() -> (model, args[, kwargs]), seeded."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

B, T, H, V = 4, 8, 32, 101


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _ids(*shape, hi=V, seed=3):
    return torch.randint(0, hi, shape, generator=torch.Generator().manual_seed(seed))


class LM(nn.Module):
    """embedding -> mlp -> vocab head; loss chosen by `kind`."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.emb = nn.Embedding(V, H)
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)
        self.head = nn.Linear(H, V)
        self.register_buffer("cw", torch.rand(V, generator=torch.Generator().manual_seed(7)) + 0.5)

    def forward(self, ids, labels):
        h = self.b(F.gelu(self.a(self.emb(ids))))
        logits = self.head(h).flatten(0, 1)
        y = labels.flatten()
        k = self.kind
        if k == "smooth":
            return F.cross_entropy(logits, y, label_smoothing=0.1)
        if k == "smooth_weight":
            return F.cross_entropy(logits, y, weight=self.cw, label_smoothing=0.2, ignore_index=-100)
        if k == "weight_ignore":
            return F.cross_entropy(logits, y, weight=self.cw, ignore_index=-100)
        if k == "sum":
            return F.cross_entropy(logits, y, reduction="sum", ignore_index=-100) * 0.01
        if k == "zloss":
            lse = torch.logsumexp(logits, -1)
            return F.cross_entropy(logits, y) + 1e-2 * (lse ** 2).mean()
        if k == "kl_logt":
            t = F.log_softmax(self.head(h.detach() * 0.5).flatten(0, 1), -1)
            return F.kl_div(F.log_softmax(logits, -1), t, log_target=True, reduction="batchmean")
        if k == "nll":
            return F.nll_loss(F.log_softmax(logits, -1), y, ignore_index=-100)
        if k == "bf16_float":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lg = self.head(h)
            return F.cross_entropy(lg.float().flatten(0, 1), y)
        raise ValueError(k)


def _lm(kind, all_ignored_half=True):
    def build():
        torch.manual_seed(0)
        ids = _ids(B, T)
        labels = _ids(B, T, seed=4)
        if all_ignored_half:
            labels[: B // 2] = -100  # every target of the first half of the batch ignored
            labels[B // 2, :3] = -100
        return LM(kind), (ids, labels)
    build.__name__ = f"lm_{kind}"
    return build


lm_smooth = _lm("smooth", all_ignored_half=False)
lm_smooth_weight = _lm("smooth_weight")
lm_weight_ignore = _lm("weight_ignore")
lm_sum = _lm("sum")
lm_zloss = _lm("zloss", all_ignored_half=False)
lm_kl_logt = _lm("kl_logt", all_ignored_half=False)
lm_nll = _lm("nll")
lm_bf16_float = _lm("bf16_float", all_ignored_half=False)


class PadEmb(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H, padding_idx=0)
        self.w = nn.Parameter(torch.randn(V, H) * 0.1)
        self.a = nn.Linear(H, H)

    def forward(self, ids):
        h = self.emb(ids) + F.embedding(ids, self.w, padding_idx=1)
        return self.a(h)


def pad_emb():
    torch.manual_seed(0)
    ids = _ids(B, T)
    ids[:, :2] = 0
    ids[:, 2] = 1
    return PadEmb(), (ids,)


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag_mean = nn.EmbeddingBag(V, H, mode="mean")
        self.bag_sum = nn.EmbeddingBag(V, H, mode="sum")
        self.a = nn.Linear(H, H)

    def forward(self, ids, flat, offsets):
        return self.a(self.bag_mean(ids) + self.bag_sum(flat, offsets))


def bag():
    torch.manual_seed(0)
    flat = _ids(20)
    return Bag(), (_ids(B, T), flat, torch.tensor([0, 3, 3, 11]))


class Geometry(nn.Module):
    """normalize / cosine_similarity / cdist over the hidden dim (sharded under tp)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.c = nn.Linear(H, H)

    def forward(self, x):
        p, q = self.a(x), self.b(x)
        n = F.normalize(p, dim=-1)
        cs = F.cosine_similarity(p, q, dim=-1)  # (B, T)
        d = torch.cdist(p, q)  # (B, T, T)
        return self.c(n * cs.unsqueeze(-1)) + d.mean(-1, keepdim=True)


def geometry():
    torch.manual_seed(0)
    return Geometry(), (_x(B, T, H),)


class ScanArg(nn.Module):
    """logcumsumexp over T; argmax over H used as an index; argmin too."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.table = nn.Parameter(torch.randn(H, H) * 0.1)

    def forward(self, x):
        h = self.a(x)
        s = torch.logcumsumexp(h, dim=1)
        i = h.argmax(-1)  # (B, T) index into H
        j = h.argmin(-1)
        g = self.table[i] + self.table[j] * 0.5  # (B, T, H)
        return self.b(s + g)


def scan_arg():
    torch.manual_seed(0)
    return ScanArg(), (_x(B, T, H),)


class Bucket(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.emb = nn.Embedding(9, H)
        self.register_buffer("bounds", torch.linspace(-1.5, 1.5, 8))

    def forward(self, x):
        h = self.a(x)
        idx = torch.bucketize(h.mean(-1).detach(), self.bounds)  # (B, T) in 0..8
        idx2 = torch.searchsorted(self.bounds, h[..., 0].detach().contiguous())
        return self.b(h + self.emb(idx) + self.emb(idx2))


def bucket():
    torch.manual_seed(0)
    return Bucket(), (_x(B, T, H),)


class Attn(nn.Module):
    def __init__(self, mode, nh=4, nkv=4):
        super().__init__()
        self.mode, self.nh, self.nkv, self.hd = mode, nh, nkv, H // nh
        self.q = nn.Linear(H, H)
        self.kv = nn.Linear(H, 2 * nkv * self.hd)
        self.o = nn.Linear(H, H)

    def forward(self, x, mask=None):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.nkv, self.hd).permute(2, 0, 3, 1, 4)
        if self.mode == "causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.mode == "mask":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif self.mode == "float_mask":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=0.3)
        elif self.mode == "gqa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, t, H))


def sdpa_causal():
    torch.manual_seed(0)
    return Attn("causal"), (_x(B, T, H),)


def sdpa_bool_mask():
    torch.manual_seed(0)
    m = torch.ones(B, 1, T, T, dtype=torch.bool).tril()
    m[1, :, :, 5:] = False
    m[1, :, :, 0] = True
    return Attn("mask"), (_x(B, T, H), m)


def sdpa_float_mask():
    torch.manual_seed(0)
    m = _x(B, 4, T, T, seed=9)
    return Attn("float_mask"), (_x(B, T, H), m)


def sdpa_gqa():
    torch.manual_seed(0)
    return Attn("gqa", nh=4, nkv=2), (_x(B, T, H),)


class PartialNonLinear(nn.Module):
    """a row-parallel output (Partial under tp) fed into non-linear ops."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H, bias=False)
        self.c = nn.Linear(H, H)

    def forward(self, x):
        p = self.b(F.relu(self.a(x)))
        k = self.kind
        if k == "abs":
            y = p.abs()
        elif k == "clamp":
            y = p.clamp(-0.1, 0.2)
        elif k == "relu":
            y = F.relu(p)
        elif k == "square":
            y = p * p
        elif k == "exp":
            y = torch.exp(p * 0.1)
        elif k == "where":
            y = torch.where(p > 0, p, 0.5)
        elif k == "maxmin":
            y = torch.maximum(p, x) + torch.minimum(p, -x) + p.amax(-1, keepdim=True)
        elif k == "cmp":
            y = x * (p > 0.05).float() + p
        elif k == "div_by":
            y = x / (p.abs() + 1.0) + 1.0 / (p * p + 1.0)
        elif k == "norm":
            y = x * torch.sqrt((p * p).sum(-1, keepdim=True)) + torch.linalg.vector_norm(p, dim=-1, keepdim=True)
        elif k == "twice":
            y = p + torch.tanh(p)  # linear and non-linear use of one Partial
        elif k == "sign_pow":
            y = torch.sign(p) * p.abs().pow(1.5) + p.pow(2)
        elif k == "sigmoid_mul":
            y = torch.sigmoid(p) * p  # silu written out
        elif k == "reciprocal_rsqrt":
            y = torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + 1e-6) * p  # RMSNorm without weight
        return self.c(y)


def _pnl(kind):
    def build():
        torch.manual_seed(0)
        return PartialNonLinear(kind), (_x(B, T, H),)
    build.__name__ = f"pnl_{kind}"
    return build


PNL = {f"pnl_{k}": _pnl(k) for k in ["abs", "clamp", "relu", "square", "exp", "where", "maxmin", "cmp", "div_by",
                                     "norm", "twice", "sign_pow", "sigmoid_mul", "reciprocal_rsqrt"]}


@dataclasses.dataclass
class Out:
    loss: torch.Tensor
    aux: torch.Tensor
    inp: torch.Tensor


class Inputs(nn.Module):
    """0-d tensor input, float64 parameter, int input in arithmetic, bool flag / None kwargs, no-grad input."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H).double()
        self.c = nn.Linear(H, H)

    def forward(self, x, scale, pos, extra, flag=True, missing=None):
        h = self.a(x) * scale  # 0-d tensor
        h = h + pos.unsqueeze(-1).float() * 0.01 + (pos % 3).unsqueeze(-1) * 0.1  # int arithmetic
        d = self.b(h.double()).float()  # float64 parameter
        if flag:
            d = d + extra
        if missing is not None:
            d = d * 2
        return {"loss": self.c(d).pow(2).mean(), "aux": d.sum(-1), "inp": x}


def inputs_mixed():
    torch.manual_seed(0)
    return Inputs(), (_x(B, T, H), torch.tensor(0.7), torch.arange(T).repeat(B, 1), _x(B, T, H, seed=2)), \
        {"flag": True, "missing": None}


class AliasOut(nn.Module):
    """output that is a parameter, a buffer, an input unchanged; only one output in the loss."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.register_buffer("buf", torch.ones(H))

    def forward(self, x):
        y = self.b(self.a(x) * self.buf)
        return y.pow(2).mean(), self.a.weight, self.buf, x, y.detach().amax()


def alias_out():
    torch.manual_seed(0)
    return AliasOut(), (_x(B, T, H),)


class DCOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        return Out(self.b(h).pow(2).mean(), h.sum(), x)


def dc_out():
    torch.manual_seed(0)
    return DCOut(), (_x(B, T, H),)


class Buffers(nn.Module):
    """non-persistent buffer; running mean buffer updated in forward (no_grad and not); GroupNorm, InstanceNorm,
    BatchNorm without running stats and momentum=None."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, H), persistent=False)
        self.register_buffer("running", torch.zeros(H))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.gn = nn.GroupNorm(4, H)
        self.inorm = nn.InstanceNorm1d(H, affine=True)
        self.bn_nostat = nn.BatchNorm1d(H, track_running_stats=False)
        self.bn_cma = nn.BatchNorm1d(H, momentum=0.3)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x) * self.scale  # (B, T, H)
        with torch.no_grad():
            self.running.mul_(0.9).add_(h.mean((0, 1)) * 0.1)
            self.count.add_(1)
        h = h - self.running
        hc = h.transpose(1, 2)  # (B, H, T)
        hc = self.gn(hc) + self.inorm(hc)
        hc = self.bn_nostat(hc) + self.bn_cma(hc)
        return self.b(hc.transpose(1, 2))


def buffers():
    torch.manual_seed(0)
    return Buffers(), (_x(B, T, H),)


class BN2(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.bn = nn.BatchNorm1d(H, momentum=None)
        self.ln = nn.LayerNorm(H, elementwise_affine=False)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        return self.b(self.ln(self.bn(self.a(x))))


def bn_cma_2d():
    torch.manual_seed(0)
    return BN2(), (_x(2 * B + 1, H),)


class Params(nn.Module):
    """one parameter used on different dims by two consumers; a sliced parameter; a reshaped parameter; a
    parameter with no gradient in the step; a bias-only module; parameters of size 1 and 2."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(H, 2 * H) * 0.1)
        self.v = nn.Parameter(torch.randn(2 * H * H) * 0.05)
        self.unused = nn.Parameter(torch.randn(H, H))
        self.bias_only = nn.Parameter(torch.zeros(H))
        self.tiny = nn.Parameter(torch.ones(1, H))
        self.two = nn.Parameter(torch.randn(2, H))
        self.one = nn.Parameter(torch.ones(1))
        self.o = nn.Linear(H, H)

    def forward(self, x):
        h = x @ self.w  # (B, T, 2H)
        g = h @ self.w.t()  # (B, T, H) same parameter, other dim
        s = x @ self.w[:, :H]  # sliced
        r = g @ self.v.view(2 * H, H)[:H]  # reshaped then sliced
        y = (g + s + r + self.bias_only) * self.tiny + self.two[0] - self.two[1] * self.one
        return self.o(y)


def params():
    torch.manual_seed(0)
    return Params(), (_x(B, T, H),)


class ConvNorms(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.c2 = nn.Conv2d(8, 6, 3, padding=1)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        h = F.relu(self.gn(self.c1(x)))
        h = self.inorm(h)
        return self.fc(self.c2(h).mean((2, 3)))


def conv_norms():
    torch.manual_seed(0)
    return ConvNorms(), (_x(5, 3, 6, 6),)


class DataDep(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        sel = h.masked_select(h > 0)
        return sel.sum() + h.nonzero().shape[0] * 0.0


def data_dep():
    torch.manual_seed(0)
    return DataDep(), (_x(B, T, H),)


class Unique(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.a = nn.Linear(H, H)

    def forward(self, ids):
        u = torch.unique(ids)
        return self.a(self.emb(u)).pow(2).mean()


def unique():
    torch.manual_seed(0)
    return Unique(), (_ids(B, T),)


class EmbFreq(nn.Module):
    """embedding with scale_grad_by_freq (gradient of a row divided by the row's count in the BATCH)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H, scale_grad_by_freq=True)
        self.a = nn.Linear(H, H)

    def forward(self, ids):
        return self.a(self.emb(ids))


def emb_freq():
    torch.manual_seed(0)
    ids = _ids(B, T, hi=12)  # few distinct ids: counts of 2-8 per row
    return EmbFreq(), (ids,)


class EmbMaxNorm(nn.Module):
    """embedding with max_norm: forward renormalises the looked-up rows of the weight IN PLACE."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H, max_norm=1.0)
        self.a = nn.Linear(H, H)

    def forward(self, ids):
        return self.a(self.emb(ids))


def emb_max_norm():
    torch.manual_seed(0)
    return EmbMaxNorm(), (_ids(B, T),)


class BagWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(V, H, mode="sum")
        self.a = nn.Linear(H, H)
        self.w = nn.Linear(H, 1)

    def forward(self, ids, x):
        psw = torch.sigmoid(self.w(x)).squeeze(-1)  # (B, T) per-sample weights with a gradient
        return self.a(self.bag(ids, per_sample_weights=psw))


def bag_weights():
    torch.manual_seed(0)
    return BagWeights(), (_ids(B, T), _x(B, T, H))


class Scans(nn.Module):
    """cumprod / cummin / diff / logaddexp / quantile / kthvalue along T (sharded under some plans)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = torch.tanh(self.a(x)) * 0.5 + 1.0
        c = torch.cumprod(h, dim=1)
        m = torch.cummin(h, dim=1).values
        d = torch.diff(h, dim=1, prepend=h[:, :1])
        q = torch.quantile(h, 0.3, dim=1, keepdim=True)
        k = torch.kthvalue(h, 3, dim=-1, keepdim=True).values
        return self.b(c + m + d + q + k + torch.logaddexp(h, -h))


def scans():
    torch.manual_seed(0)
    return Scans(), (_x(B, T, H),)


class Losses2(nn.Module):
    """losses whose mean has its own denominator: BCE with pos_weight, multi-margin, triplet, cosine
    embedding, poisson nll, huber, margin ranking, soft-target cross-entropy with label smoothing."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, 10)
        self.register_buffer("pw", torch.linspace(0.5, 2.0, 10))

    def forward(self, x, y, cls, sign):
        h = self.a(x)
        lg = self.b(h)  # (N, 10)
        l = F.binary_cross_entropy_with_logits(lg, y, pos_weight=self.pw)
        l = l + F.multi_margin_loss(lg, cls)
        l = l + F.triplet_margin_loss(h, x, h * 0.5)
        l = l + F.cosine_embedding_loss(h, x, sign)
        l = l + F.poisson_nll_loss(lg, y)
        l = l + F.huber_loss(lg, y, delta=0.5)
        l = l + F.margin_ranking_loss(lg[:, 0], lg[:, 1], sign)
        l = l + F.cross_entropy(lg, y.softmax(-1), label_smoothing=0.1)
        return l


def losses2():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    n = 10
    return Losses2(), (_x(n, H), torch.rand(n, 10, generator=g), torch.randint(0, 10, (n,), generator=g),
                       torch.randint(0, 2, (n,), generator=g).float() * 2 - 1)


class BatchStats(nn.Module):
    """reductions over the batch dim (sharded under dp): normalize/softmax/centering/max/logsumexp over dim 0,
    a per-feature standardisation (whitening) and a contrastive (N x N) similarity with a diagonal target."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)  # (N, H)
        z = (h - h.mean(0)) / (h.std(0) + 1e-3)
        n = F.normalize(h, dim=0) + h.softmax(0) + h.amax(0) - torch.logsumexp(h, 0)
        e = F.normalize(self.b(x), dim=-1)
        sim = e @ e.t() / 0.5  # (N, N)
        con = F.cross_entropy(sim, torch.arange(sim.shape[0]))
        return (z * n).pow(2).mean() + con


def batch_stats():
    torch.manual_seed(0)
    return BatchStats(), (_x(9, H),)


class CE3d(nn.Module):
    """cross-entropy on (N, C, T) logits with class weights and ignored targets (the class dim is 1), and an
    nll_loss with weights; T may be sharded."""

    def __init__(self):
        super().__init__()
        self.a, self.head = nn.Linear(H, H), nn.Linear(H, 11)
        self.register_buffer("cw", torch.linspace(0.2, 2.0, 11))

    def forward(self, x, y):
        lg = self.head(torch.tanh(self.a(x))).transpose(1, 2)  # (B, 11, T)
        l1 = F.cross_entropy(lg, y, weight=self.cw, ignore_index=-1)
        l2 = F.nll_loss(F.log_softmax(lg, 1), y, weight=self.cw, ignore_index=-1, reduction="mean")
        return l1 + 0.5 * l2


def ce3d():
    torch.manual_seed(0)
    y = _ids(B, T, hi=11, seed=6)
    y[0] = -1
    y[1, :5] = -1
    return CE3d(), (_x(B, T, H), y)


class DataMul(nn.Module):
    """forward decays a weight through .data (no autograd, no no_grad block)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        self.a.weight.data.mul_(0.9)
        return self.b(self.a(x))


def data_mul():
    torch.manual_seed(0)
    return DataMul(), (_x(B, T, H),)


class BufferReassign(nn.Module):
    """a buffer reassigned (not written in place) in forward: self.steps = self.steps + 1, read next step."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("avg", torch.zeros(H))

    def forward(self, x):
        h = self.a(x)
        self.steps = self.steps + 1
        self.avg = (self.avg * 0.5 + h.detach().mean((0, 1)) * 0.5)
        return self.b(h - self.avg) * (1.0 / self.steps)


def buffer_reassign():
    torch.manual_seed(0)
    return BufferReassign(), (_x(B, T, H),)


class PyCounter(nn.Module):
    """Python state changed by forward (a call counter used as a warm-up scale)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.b(self.a(x)) * min(1.0, self.calls / 4)


def py_counter():
    torch.manual_seed(0)
    return PyCounter(), (_x(B, T, H),)


class ClampWeights(nn.Module):
    """WGAN-style weight clipping in forward: p.clamp_ under no_grad on a parameter."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        with torch.no_grad():
            self.a.weight.clamp_(-0.1, 0.1)
        return self.b(self.a(x))


def clamp_weights():
    torch.manual_seed(0)
    return ClampWeights(), (_x(B, T, H),)


PATTERNS = {f.__name__: f for f in [lm_smooth, lm_smooth_weight, lm_weight_ignore, lm_sum, lm_zloss, lm_kl_logt,
                                     lm_nll, lm_bf16_float, pad_emb, bag, geometry, scan_arg, bucket, sdpa_causal,
                                     sdpa_bool_mask, sdpa_float_mask, sdpa_gqa, emb_freq, emb_max_norm,
                                     bag_weights, scans, losses2, batch_stats, ce3d, data_mul, buffer_reassign, py_counter, clamp_weights, inputs_mixed, alias_out, dc_out,
                                     buffers, bn_cma_2d, params, conv_norms, data_dep, unique]}
PATTERNS.update(PNL)


def build(name):
    """module-level entry for spawned ranks (closures do not pickle)."""
    return PATTERNS[name]()
