"""Small hand-written models for the trial (each builder seeded; returns (model, inputs))."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

B, T, H = 4, 8, 16
NH, HD = 4, 4


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _ids(*shape, hi=50, seed=2):
    return torch.randint(0, hi, shape, generator=torch.Generator().manual_seed(seed))


class Wrap(nn.Module):
    """a(x) -> body(h) -> b(.) ; `body` is a function of (self, h)."""

    def __init__(self, body, mid=H, out_in=None, extra=None):
        super().__init__()
        self.a = nn.Linear(H, mid)
        self.b = nn.Linear(out_in or mid, H)
        self.body = body
        if extra:
            for k, v in extra.items():
                setattr(self, k, v)

    def forward(self, x):
        return self.b(self.body(self, self.a(x)))


def _mk(body, **kw):
    def build():
        torch.manual_seed(0)
        return Wrap(body, **kw), (_x(B, T, H),)
    build.__name__ = body.__name__
    return build


# ---------------- split / merge of a sharded dim -------------
def glu(s, h): return F.glu(h, dim=-1)
def interleave(s, h):
    a, b = h[..., ::2], h[..., 1::2]
    ang = torch.arange(T).float()[:, None] * torch.arange(H // 2).float()[None] * 0.3
    c, sn = ang.cos(), ang.sin()
    return torch.stack([a * c - b * sn, a * sn + b * c], dim=-1).flatten(-2)
def heads_softmax(s, h): return h.view(B, T, NH, HD).softmax(-1).view(B, T, H)
def heads_softmax_seq(s, h): return h.view(B, T, NH, HD).transpose(1, 2).softmax(-2).transpose(1, 2).reshape(B, T, H)
def transpose_merge(s, h): return h.view(B, T, NH, HD).transpose(2, 3).contiguous().view(B, T, H)
def tsplit(s, h):
    a, b, c = torch.tensor_split(h, 3, dim=-1)
    return torch.cat([c * 2, a, b.relu()], -1)
def chunk3(s, h):
    a, b, c = h.chunk(3, dim=-1)
    return torch.cat([c, a.sigmoid(), b], -1)
def narrow(s, h): return torch.cat([h.narrow(-1, 3, 7), h.narrow(-1, 0, 3), h[..., 10:]], -1)
def repeat(s, h): return h.repeat(1, 1, 2)
def tile(s, h): return torch.tile(h, (1, 2))
def expand(s, h): return h.unsqueeze(2).expand(B, T, 2, H).reshape(B, T, 2 * H)
def repeat_inter(s, h): return h.repeat_interleave(2, dim=-1)
def movedim(s, h): return h.unflatten(-1, (NH, HD)).movedim(-1, 2).flatten(2)
def as_strided(s, h): return h.contiguous().as_strided((B, T, H // 2), (T * H, H, 2))
def seq_unflatten(s, h): return h.unflatten(1, (2, T // 2)).transpose(1, 2).flatten(1, 2)
def swap_bt(s, h): return h.transpose(0, 1).reshape(T, B, H).transpose(0, 1)
def merge_bt(s, h): return h.reshape(B * T, H).reshape(T, B, H).transpose(0, 1).reshape(B, T, H) * 1.0


# ---------------- non-sum reductions ------------------------
def prod(s, h): return h * torch.tanh(h).add(1.5).prod(-1, keepdim=True)
def cumprod(s, h): return torch.tanh(h).add(1.0).cumprod(-1)
def amax_sub(s, h): return h - h.amax(-1, keepdim=True) + h.amin(1, keepdim=True)
def logcumsumexp(s, h): return torch.logcumsumexp(h, -1)
def kthvalue(s, h): return h - h.kthvalue(3, -1, keepdim=True).values
def mode(s, h): return h + h.round().mode(-1, keepdim=True).values
def var_mean(s, h):
    v0, m0 = torch.var_mean(h, -1, correction=0, keepdim=True)
    v2, m2 = torch.std_mean(h, 1, correction=2, keepdim=True)
    return (h - m0) * v0 + m2 * v2
def norms(s, h):
    return h / (torch.linalg.vector_norm(h, 1, -1, keepdim=True) + torch.linalg.vector_norm(h, float("inf"), -1,
                keepdim=True) + torch.norm(h, "fro", dim=(1, 2), keepdim=True))
def nanmean(s, h):
    m = torch.where(h > 0.8, torch.full_like(h, float("nan")), h)
    return h * m.nanmean(-1, keepdim=True) + m.nansum(1, keepdim=True).nan_to_num()
def anyall(s, h):
    a = (h > 1.0).any(-1, keepdim=True).float()
    b = (h > -1.5).all(1, keepdim=True).float()
    c = torch.count_nonzero(h > 0, dim=-1).unsqueeze(-1).float()
    return h * a + b * h + c * 0.1
def scatter_reduce(s, h):
    idx = torch.arange(H).remainder(5).expand(B, T, H)
    z = torch.zeros(B, T, 5)
    a = z.scatter_reduce(-1, idx, h, "amax", include_self=False)
    m = z.scatter_reduce(-1, idx, h, "mean", include_self=False)
    return torch.cat([a, m, h[..., :6]], -1)
def index_put_acc(s, h):
    idx = torch.tensor([0, 2, 2, 5, 7, 7, 7, 1])
    z = torch.zeros(B, T, H)
    z = z.index_put((torch.arange(B)[:, None], idx[None, :].expand(B, T)), h, accumulate=True)
    return z + h
def bincount_histc(s, h):
    c = torch.histc(h.detach(), bins=H, min=-2, max=2)
    return h * c + h.relu()


# ---------------- elementwise forms ------------------------
def lerp(s, h): return torch.lerp(h, h.flip(-1) * 0 + h.roll(1, 1), 0.3) + torch.lerp(h, h * 2, h.sigmoid())
def addcmul(s, h): return torch.addcmul(h, h, h.tanh(), value=0.5) + torch.addcdiv(h, h, h.exp() + 1, value=-2)
def baddbmm(s, h):
    m = h.reshape(B, T, H)
    return torch.baddbmm(m, m, m.transpose(1, 2) @ m * 0.1, beta=0.5, alpha=0.7)[..., :H] if False else \
        torch.baddbmm(m, m @ m.transpose(1, 2), m, beta=0.5, alpha=0.1)
def where_scalar(s, h): return torch.where(h.mean(-1, keepdim=True) > 0, h, 0.5) + torch.where(h > 0, 1.0, h)
def acts(s, h): return F.softplus(h, beta=2.0) + F.mish(h) + F.hardswish(h) + F.gelu(h, approximate="tanh")
def clamp_t(s, h): return torch.clamp(h, min=-h.abs().mean(-1, keepdim=True), max=s.hi)
def copysign(s, h): return torch.copysign(h, h.roll(1, -1)) + torch.copysign(h, -1.0)
def fmod(s, h): return torch.fmod(h * 3, 1.3) + torch.remainder(h * 3, 0.7) + torch.remainder(h, -0.9)
def floordiv(s, h): return h * torch.floor_divide(h * 4, 1.5) + (h * 3).int().float()


def clamp_t_build():
    torch.manual_seed(0)
    return Wrap(clamp_t, extra={"hi": nn.Parameter(torch.rand(H) * 0.5)}), (_x(B, T, H),)


# ---------------- attention variants ------------------------
class Attn(nn.Module):
    def __init__(self, kind, tq=T, tk=T):
        super().__init__()
        self.kind = kind
        self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
        self.tq, self.tk = tq, tk
        if kind == "temp":
            self.temp = nn.Parameter(torch.tensor(0.7))
        slopes = torch.tensor([2 ** (-8 * (i + 1) / NH) for i in range(NH)])
        self.register_buffer("slopes", slopes, persistent=False)

    def forward(self, x, y=None):
        y = x if y is None else y
        tq, tk = x.shape[1], y.shape[1]
        q = self.q(x).view(B, tq, NH, HD).transpose(1, 2)
        k = self.k(y).view(B, tk, NH, HD).transpose(1, 2)
        v = self.v(y).view(B, tk, NH, HD).transpose(1, 2)
        if self.kind == "rope_offset":
            off = 3
            pos = torch.arange(off, off + tq).float()
            inv = 1.0 / (10000 ** (torch.arange(0, HD, 2).float() / HD))
            f = pos[:, None] * inv[None]
            cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
            rot = lambda t: torch.cat([-t[..., HD // 2:], t[..., :HD // 2]], -1)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        s = q @ k.transpose(-1, -2) / HD ** 0.5
        if self.kind == "alibi":
            rel = torch.arange(tk)[None, :] - torch.arange(tq)[:, None]
            s = s + self.slopes[:, None, None] * rel.float()[None]
            s = s.masked_fill(torch.triu(torch.ones(tq, tk, dtype=torch.bool), 1), float("-inf"))
        if self.kind == "window":
            ones = torch.ones(tq, tk, dtype=torch.bool)
            keep = torch.tril(ones) & torch.triu(ones, -2)
            s = s.masked_fill(~keep, float("-inf"))
        if self.kind == "temp":
            s = s / self.temp
        a = s.softmax(-1) @ v
        return self.o(a.transpose(1, 2).reshape(B, tq, H))


def _attn(kind, cross=False):
    def build():
        torch.manual_seed(0)
        if cross:
            return Attn(kind), (_x(B, T, H), _x(B, 12, H, seed=3))
        return Attn(kind), (_x(B, T, H),)
    build.__name__ = "attn_" + kind + ("_cross" if cross else "")
    return build


# ---------------- weights/buffers modified in forward, norms --------------
class EmbMaxNorm(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.e = nn.Embedding(50, H, **kw)
        self.b = nn.Linear(H, H)

    def forward(self, ids):
        return self.b(self.e(ids))


def emb_max_norm():
    torch.manual_seed(0)
    return EmbMaxNorm(max_norm=1.0), (_ids(B, T),)


def emb_padding_idx():
    torch.manual_seed(0)
    ids = _ids(B, T)
    ids[:, :3] = 0
    return EmbMaxNorm(padding_idx=0), (ids,)


class SpecNorm(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.a = nn.Linear(H, H)
        if kind == "old":
            self.b = nn.utils.spectral_norm(nn.Linear(H, H))
        elif kind == "new":
            self.b = nn.utils.parametrizations.spectral_norm(nn.Linear(H, H))
        else:
            self.b = nn.utils.parametrizations.orthogonal(nn.Linear(H, H))

    def forward(self, x):
        return self.b(self.a(x).relu())


def spectral_old():
    torch.manual_seed(0)
    return SpecNorm("old"), (_x(B, T, H),)


def spectral_new():
    torch.manual_seed(0)
    return SpecNorm("new"), (_x(B, T, H),)


def orthogonal():
    torch.manual_seed(0)
    return SpecNorm("orth"), (_x(B, T, H),)


class Norms(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.kind = kind
        self.n = {"bn_cma": lambda: nn.BatchNorm1d(H, momentum=None),
                  "bn_nostats": lambda: nn.BatchNorm1d(H, track_running_stats=False),
                  "gn": lambda: nn.GroupNorm(4, H),
                  "in": lambda: nn.InstanceNorm1d(H, affine=True),
                  "in_stats": lambda: nn.InstanceNorm1d(H, affine=True, track_running_stats=True)}[kind]()
        self.b = nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x).transpose(1, 2)  # (B, C=H, T)
        return self.b(self.n(h).transpose(1, 2))


def _norm(kind):
    def build():
        torch.manual_seed(0)
        return Norms(kind), (_x(B, T, H),)
    build.__name__ = "norm_" + kind
    return build


# ---------------- parameter reuse ------------------------
class TwiceUse(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H)
        self.scale = nn.Parameter(torch.ones(H) * 0.9)
        self.gate = nn.Parameter(torch.tensor(0.3))
        self.one = nn.Parameter(torch.tensor([1.2]))

    def forward(self, x):
        h = self.a(x)
        if self.kind == "w_and_wt":
            return self.b(h) + torch.einsum("bti,oi->bto", h, self.b.weight.t())
        if self.kind == "shared":
            return self.b(self.b(h).relu()) + self.b(x)
        if self.kind == "scale_and_matmul":
            m = torch.diag(self.scale)
            return self.b(h * self.scale) @ m
        if self.kind == "gates":
            return x + self.gate * self.b(h) * self.one
        raise ValueError


def _twice(kind):
    def build():
        torch.manual_seed(0)
        return TwiceUse(kind), (_x(B, T, H),)
    build.__name__ = "twice_" + kind
    return build


def bias_only():
    torch.manual_seed(0)
    m = Wrap(acts)
    m.a.weight.requires_grad_(False)
    m.b.weight.requires_grad_(False)
    return m, (_x(B, T, H),)


BODIES = [glu, interleave, heads_softmax, heads_softmax_seq, transpose_merge, tsplit, chunk3, narrow, repeat, tile,
          expand, repeat_inter, movedim, as_strided, seq_unflatten, swap_bt, merge_bt,
          prod, cumprod, amax_sub, logcumsumexp, kthvalue, mode, var_mean, norms, nanmean, anyall, scatter_reduce,
          index_put_acc, bincount_histc, lerp, addcmul, baddbmm, where_scalar, acts, copysign, fmod, floordiv]
EXTRA = {"glu": {"mid": 2 * H, "out_in": H}, "repeat": {"out_in": 2 * H}, "tile": {"out_in": 2 * H},
         "expand": {"out_in": 2 * H}, "repeat_inter": {"out_in": 2 * H}, "as_strided": {"out_in": H // 2},
         "scatter_reduce": {"out_in": 16}}

BUILDERS = {}
for _b in BODIES:
    _f = _mk(_b, **EXTRA.get(_b.__name__, {}))
    _f.__qualname__ = _f.__name__ = "m_" + _b.__name__
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f
for _f in [clamp_t_build, emb_max_norm, emb_padding_idx, spectral_old, spectral_new, orthogonal, bias_only]:
    BUILDERS[_f.__name__] = _f
for _k in ["alibi", "window", "rope_offset", "temp"]:
    _f = _attn(_k)
    _f.__qualname__ = _f.__name__
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f
for _f in [_attn("plain", cross=True)]:
    _f.__qualname__ = _f.__name__
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f
for _k in ["bn_cma", "bn_nostats", "gn", "in", "in_stats"]:
    _f = _norm(_k)
    _f.__qualname__ = _f.__name__
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f
for _k in ["w_and_wt", "shared", "scale_and_matmul", "gates"]:
    _f = _twice(_k)
    _f.__qualname__ = _f.__name__
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f


def merge_view(s, h): return h.view(B, T * H).view(B, T, H)
def merge_view_last(s, h): return h.transpose(1, 2).contiguous().view(B, H * T).view(B, T, H) + 0


for _b in [merge_view, merge_view_last]:
    _f = _mk(_b)
    _f.__qualname__ = _f.__name__ = "m_" + _b.__name__
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f


# ---------------- reductions over the BATCH dim (sharded by dp), uneven batch of 5 ------------
B5 = 5


class BatchRed(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)  # (5, T, H)
        k = self.kind
        if k == "prod":
            r = torch.tanh(h).add(1.5).prod(0, keepdim=True)
        elif k == "cumprod":
            r = torch.tanh(h).add(1.0).cumprod(0)
        elif k == "amax":
            r = h - h.amax(0, keepdim=True) + h.amin((0, 1), keepdim=True)
        elif k == "logcumsumexp":
            r = torch.logcumsumexp(h, 0)
        elif k == "kthvalue":
            r = h - h.kthvalue(2, 0, keepdim=True).values + h.median(0, keepdim=True).values
        elif k == "var2":
            v, m = torch.var_mean(h, 0, correction=2, keepdim=True)
            s0 = torch.std(h, (0, 1), correction=0, keepdim=True)
            r = (h - m) * v + s0
        elif k == "nanmean":
            mm = torch.where(h > 0.7, torch.full_like(h, float("nan")), h)
            r = h * mm.nanmean(0, keepdim=True) + mm.nansum((0, 1), keepdim=True)
        elif k == "anyall":
            r = h * (h > 1.2).any(0, keepdim=True) + h * (h > -1.0).all(0, keepdim=True) \
                + torch.count_nonzero(h > 0, dim=0).float() * 0.1
        elif k == "norm_batch":
            r = h / (torch.linalg.vector_norm(h, 1, 0, keepdim=True) + torch.linalg.vector_norm(h, float("inf"),
                     (0, 1), keepdim=True))
        elif k == "sort":
            r = h.sort(0).values * 0.5 + h.argsort(0).float() * 0.1 + h.topk(2, 0).values.sum(0, keepdim=True)
        elif k == "mean_corr":  # mean over batch then broadcast subtract, batch-size-dependent scale
            r = (h - h.mean(0, keepdim=True)) * (h.shape[0] / (h.shape[0] - 1))
        elif k == "softmax_batch":
            r = h.softmax(0) + h.log_softmax(0)
        elif k == "flip_batch":
            r = h.flip(0) + h.roll(2, 0) + torch.cummax(h, 0).values
        elif k == "diff":
            r = torch.diff(h, dim=0, prepend=h[:1]) + torch.diff(h, dim=1, append=h[:, -1:])
        elif k == "index_batch":
            r = h[torch.tensor([4, 0, 2, 2, 1])] + h[-1:] + h.narrow(0, 1, 1)
        else:
            raise ValueError(k)
        return self.b(r)


BATCH_KINDS = ["prod", "cumprod", "amax", "logcumsumexp", "kthvalue", "var2", "nanmean", "anyall", "norm_batch",
               "sort", "mean_corr", "softmax_batch", "flip_batch", "diff", "index_batch"]


def _batch(kind):
    def build():
        torch.manual_seed(0)
        return BatchRed(kind), (_x(B5, T, H),)
    build.__name__ = build.__qualname__ = "batch_" + kind
    return build


for _k in BATCH_KINDS:
    _f = _batch(_k)
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f


def as_strided_t(s, h): return h.transpose(1, 2).as_strided((B, H, T // 2), (T * H, 1, 2 * H))
def as_strided_tc(s, h): return h.transpose(1, 2).contiguous().as_strided((B, H, T // 2), (T * H, T, 2)).transpose(1, 2).reshape(B, T // 2, H)
def as_strided_off(s, h): return h[:, 1:].as_strided((B, T // 2, H), (T * H, 2 * H, 1))
def as_strided_off2(s, h): return h[:, 1:].as_strided((B, T // 2, H), (T * H, 2 * H, 1), 3 * H)


for _b in [as_strided_t, as_strided_tc, as_strided_off, as_strided_off2]:
    _f = _mk(_b, out_in={"as_strided_t": T // 2}.get(_b.__name__, H))
    _f.__qualname__ = _f.__name__ = "m_" + _b.__name__
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f


# ---------------- batch 3: pooling/pad/conv/kron along the (sharded) hidden dim ------------
def pad_reflect(s, h): return F.pad(h, (3, 2), mode="reflect")[..., :H] + F.pad(h, (2, 2), mode="circular")[..., 1:H + 1]
def pad_replicate(s, h): return F.pad(h, (1, 4), mode="replicate")[..., 3:H + 3]
def avgpool(s, h): return torch.cat([F.avg_pool1d(h.reshape(B * T, 1, H), 3, 2, 1, ceil_mode=True).reshape(B, T, -1),
                                     F.max_pool1d(h.reshape(B * T, 1, H), 3, 2, 1).reshape(B, T, -1)], -1)
def adapool(s, h): return F.adaptive_avg_pool1d(h.reshape(B * T, 1, H), 5).reshape(B, T, 5).repeat(1, 1, 4)[..., :H] \
    + F.adaptive_max_pool1d(h.reshape(B * T, 1, H), 3).reshape(B, T, 3).sum(-1, keepdim=True)
def lrn(s, h): return F.local_response_norm(h.transpose(1, 2), 3).transpose(1, 2)
def kron(s, h): return torch.kron(h, torch.tensor([1.0, -0.5]))[..., ::2] + torch.outer(h[0, 0], h[1, 1]).sum(0)
def index_add_dup(s, h):
    idx = torch.tensor([0, 3, 3, 15, 7, 7, 7, 1, 2, 2, 9, 10, 11, 12, 13, 14])
    return torch.zeros_like(h).index_add(-1, idx, h) + h.index_select(-1, idx.flip(0))
def take_along(s, h):
    idx = torch.arange(H).flip(0).remainder(7).expand(B, T, H)
    return torch.take_along_dim(h, idx, -1) + h
def searchsorted(s, h):
    edges = torch.linspace(-2, 2, 9)
    return h * torch.bucketize(h.detach(), edges).float() + torch.searchsorted(edges, h.detach().contiguous()).float()
def diff2(s, h): return torch.diff(h, n=2, dim=-1, prepend=h[..., :1], append=h[..., -1:]) + \
    torch.cumulative_trapezoid(h, dim=-1, ).sum(-1, keepdim=True)


class ConvKind(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.conv = {"grouped": lambda: nn.Conv1d(H, H, 3, padding=1, groups=4),
                     "depthwise": lambda: nn.Conv1d(H, H, 3, padding=1, groups=H),
                     "prelu": lambda: nn.PReLU(H),
                     "convT": lambda: nn.ConvTranspose1d(H, H, 2, stride=2, groups=2)}[kind]()

    def forward(self, x):
        h = self.a(x).transpose(1, 2)  # (B, C=H, T)
        c = self.conv(h)
        if self.kind == "convT":
            c = c[..., ::2]
        return self.b(c.transpose(1, 2))


BATCH3 = [pad_reflect, pad_replicate, avgpool, adapool, lrn, kron, index_add_dup, take_along, searchsorted, diff2]
EXTRA3 = {"avgpool": {"out_in": 17}}
for _b in BATCH3:
    _f = _mk(_b, **EXTRA3.get(_b.__name__, {}))
    _f.__qualname__ = _f.__name__ = "m_" + _b.__name__
    globals()[_f.__name__] = _f
    BUILDERS[_f.__name__] = _f
for _k in ["grouped", "depthwise", "prelu", "convT"]:
    def _cb(_k=_k):
        torch.manual_seed(0)
        return ConvKind(_k), (_x(B, T, H),)
    _cb.__name__ = _cb.__qualname__ = "conv_" + _k
    globals()[_cb.__name__] = _cb
    BUILDERS[_cb.__name__] = _cb
