"""Round-6 trial models (h2): PEFT adapters, quantisation-aware training, batch-level losses inside forward,
norm variants, sequence packing. Each builder returns (model, example_inputs), seeded."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

B, T, H, NH = 4, 8, 32, 4
V, C = 120, 10


def _g(seed=1):
    return torch.Generator().manual_seed(seed)


def _x(b=B, t=T, h=H, seed=1):
    return torch.randn(b, t, h, generator=_g(seed))


def _ids(b=B, t=T, v=V, seed=2):
    return torch.randint(0, v, (b, t), generator=_g(seed))


def _frozen_linear(i, o, bias=True):
    lin = nn.Linear(i, o, bias=bias)
    lin.requires_grad_(False)
    return lin


def _attn(q, k, v, mask=None):
    b, tq, h = q.shape
    tk = k.shape[1]
    q = q.view(b, tq, NH, h // NH).transpose(1, 2)
    k = k.view(b, tk, NH, h // NH).transpose(1, 2)
    v = v.view(b, tk, NH, h // NH).transpose(1, 2)
    s = q @ k.transpose(-1, -2) / math.sqrt(h // NH)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(b, tq, h)


# ---------------------------------------------------------------- PEFT
class LoRALinear(nn.Module):
    def __init__(self, i, o, r=4, alpha=8, merged=False):
        super().__init__()
        self.base = _frozen_linear(i, o)
        self.A = nn.Parameter(torch.randn(r, i) * 0.1)
        self.B = nn.Parameter(torch.randn(o, r) * 0.1)  # non-zero so that A gets a gradient at step 0
        self.scaling, self.merged = alpha / r, merged

    def forward(self, x):
        if self.merged:
            return F.linear(x, self.base.weight + self.scaling * (self.B @ self.A), self.base.bias)
        return self.base(x) + self.scaling * F.linear(F.linear(x, self.A), self.B)


class LoRAMLP(nn.Module):
    def __init__(self, merged=False):
        super().__init__()
        self.up, self.down = LoRALinear(H, 2 * H, merged=merged), LoRALinear(2 * H, H, merged=merged)
        self.head = nn.Linear(H, H)

    def forward(self, x):
        return self.head(self.down(F.gelu(self.up(x))) + x)


def lora_unmerged():
    torch.manual_seed(0)
    return LoRAMLP(False), (_x(),)


def lora_merged():
    torch.manual_seed(0)
    return LoRAMLP(True), (_x(),)


class LoRAQKV(nn.Module):
    """A frozen fused QKV with LoRA on q and v only (peft's target_modules on a fused c_attn: lora output for
    q, zeros for k, lora for v, concatenated)."""

    def __init__(self, r=4, alpha=16):
        super().__init__()
        self.qkv = _frozen_linear(H, 3 * H)
        self.Aq, self.Bq = nn.Parameter(torch.randn(r, H) * 0.1), nn.Parameter(torch.randn(H, r) * 0.1)
        self.Av, self.Bv = nn.Parameter(torch.randn(r, H) * 0.1), nn.Parameter(torch.randn(H, r) * 0.1)
        self.o = nn.Linear(H, H)
        self.s = alpha / r

    def forward(self, x):
        base = self.qkv(x)
        dq = self.s * (x @ self.Aq.T @ self.Bq.T)
        dv = self.s * (x @ self.Av.T @ self.Bv.T)
        qkv = base + torch.cat([dq, torch.zeros_like(dq), dv], dim=-1)
        q, k, v = qkv.split(H, dim=-1)
        return self.o(_attn(q, k, v))


def lora_qkv():
    torch.manual_seed(0)
    return LoRAQKV(), (_x(),)


class DoRA(nn.Module):
    def __init__(self, detach_norm=True, r=4, alpha=8):
        super().__init__()
        self.base = _frozen_linear(H, 2 * H)
        self.A = nn.Parameter(torch.randn(r, H) * 0.1)
        self.B = nn.Parameter(torch.randn(2 * H, r) * 0.1)
        self.m = nn.Parameter(self.base.weight.norm(p=2, dim=1).detach().clone())
        self.s, self.detach_norm = alpha / r, detach_norm
        self.out = nn.Linear(2 * H, H)

    def forward(self, x):
        w = self.base.weight + self.s * self.B @ self.A
        norm = w.norm(p=2, dim=1)
        if self.detach_norm:
            norm = norm.detach()
        w = (self.m / norm)[:, None] * w
        return self.out(F.silu(F.linear(x, w, self.base.bias)))


def dora():
    torch.manual_seed(0)
    return DoRA(True), (_x(),)


def dora_grad_norm():
    torch.manual_seed(0)
    return DoRA(False), (_x(),)


class IA3(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = _frozen_linear(H, H), _frozen_linear(H, H), _frozen_linear(H, H)
        self.up, self.down = _frozen_linear(H, 2 * H), _frozen_linear(2 * H, H)
        self.lk = nn.Parameter(torch.ones(H) + 0.1 * torch.randn(H))
        self.lv = nn.Parameter(torch.ones(H) + 0.1 * torch.randn(H))
        self.lff = nn.Parameter(torch.ones(2 * H) + 0.1 * torch.randn(2 * H))

    def forward(self, x):
        h = x + _attn(self.q(x), self.k(x) * self.lk, self.v(x) * self.lv)
        return h + self.down(F.gelu(self.up(h)) * self.lff)


def ia3():
    torch.manual_seed(0)
    return IA3(), (_x(),)


class PrefixTuning(nn.Module):
    def __init__(self, p=3):
        super().__init__()
        self.q, self.k, self.v, self.o = (_frozen_linear(H, H) for _ in range(4))
        self.pk = nn.Parameter(torch.randn(p, H) * 0.5)
        self.pv = nn.Parameter(torch.randn(p, H) * 0.5)

    def forward(self, x):
        b = x.shape[0]
        k = torch.cat([self.pk.unsqueeze(0).expand(b, -1, -1), self.k(x)], dim=1)
        v = torch.cat([self.pv.unsqueeze(0).expand(b, -1, -1), self.v(x)], dim=1)
        return self.o(_attn(self.q(x), k, v))


def prefix_tuning():
    torch.manual_seed(0)
    return PrefixTuning(), (_x(),)


class BitFit(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(H, 2 * H), nn.Linear(2 * H, H), nn.Linear(H, H)
        self.ln = nn.LayerNorm(H)
        for n, p in self.named_parameters():
            p.requires_grad_(n.endswith("bias"))

    def forward(self, x):
        return self.c(self.ln(x + self.b(F.gelu(self.a(x)))))


def bitfit():
    torch.manual_seed(0)
    return BitFit(), (_x(),)


class PromptEmbeddings(nn.Module):
    def __init__(self, p=4):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.emb.requires_grad_(False)
        self.prompt = nn.Parameter(torch.randn(p, H))
        self.q, self.k, self.v = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.head = nn.Linear(H, C)

    def forward(self, ids):
        e = self.emb(ids)
        h = torch.cat([self.prompt.unsqueeze(0).expand(ids.shape[0], -1, -1), e], dim=1)
        h = h + _attn(self.q(h), self.k(h), self.v(h))
        return self.head(h[:, 0])


def prompt_embeddings():
    torch.manual_seed(0)
    return PromptEmbeddings(), (_ids(),)


class NewRows(nn.Module):
    """A frozen embedding of V rows plus K trainable new rows (added tokens), looked up as one table."""

    def __init__(self, k=6):
        super().__init__()
        self.old = nn.Parameter(torch.randn(V, H), requires_grad=False)
        self.new = nn.Parameter(torch.randn(k, H))
        self.head = nn.Linear(H, V + k)

    def forward(self, ids):
        table = torch.cat([self.old, self.new], dim=0)
        h = F.embedding(ids, table)
        logits = self.head(h)
        return F.cross_entropy(logits.flatten(0, 1), ids.flatten())


def new_rows():
    torch.manual_seed(0)
    ids = _ids(v=V + 6)
    ids[:, ::3] = V + torch.arange(ids[:, ::3].numel()).view(B, -1) % 6  # make sure new rows are used
    return NewRows(), (ids,)


# ---------------------------------------------------------------- QAT
def _ste(x, q):
    return x + (q - x).detach()


def _fq(x, scale, qmax=127):
    return (x / scale).round().clamp(-qmax, qmax) * scale


class FakeQuant(nn.Module):
    """mode: tensor (per-tensor amax of weight and activation), channel (per-output-channel weight scale and
    per-token activation scale)."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def _q(self, w, dim):
        if self.mode == "tensor":
            s = w.detach().abs().amax() / 127
        else:
            s = w.detach().abs().amax(dim=dim, keepdim=True) / 127
        return _ste(w, _fq(w, s.clamp(min=1e-8)))

    def forward(self, x):
        h = F.linear(self._q(x, -1), self._q(self.a.weight, 1), self.a.bias)
        h = F.relu(h)
        return F.linear(self._q(h, -1), self._q(self.b.weight, 1), self.b.bias)


def fq_tensor():
    torch.manual_seed(0)
    return FakeQuant("tensor"), (_x(),)


def fq_channel():
    torch.manual_seed(0)
    return FakeQuant("channel"), (_x(),)


class DelayedScaling(nn.Module):
    """fp8-style: scale from an amax history buffer (previous steps), the history rolled and updated in forward
    under no_grad with this step's amax of the activation and the weight."""

    def __init__(self, hist=4):
        super().__init__()
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)
        self.register_buffer("amax_x", torch.full((hist,), 1.0))
        self.register_buffer("amax_w", torch.full((hist,), 1.0))

    def forward(self, x):
        h = self.a(x)
        sx = self.amax_x.max() / 448.0
        sw = self.amax_w.max() / 448.0
        hq = _ste(h, (h / sx).clamp(-448, 448).round() * sx)
        wq = _ste(self.b.weight, (self.b.weight / sw).clamp(-448, 448).round() * sw)
        with torch.no_grad():
            self.amax_x.copy_(torch.roll(self.amax_x, 1))
            self.amax_x[0] = h.abs().max()
            self.amax_w.copy_(torch.roll(self.amax_w, 1))
            self.amax_w[0] = self.b.weight.abs().max()
        return F.linear(F.gelu(hq), wq, self.b.bias)


def delayed_scaling():
    torch.manual_seed(0)
    return DelayedScaling(), (_x(),)


class Int8Absmax(nn.Module):
    """int8 absmax per token (bitsandbytes-style): round(x * 127 / absmax), matmul of the int values as floats,
    rescaled; straight-through."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x):
        h = self.a(x)
        amax = h.abs().amax(-1, keepdim=True)
        hi = torch.round(h * 127 / amax)
        h = _ste(h, hi * amax / 127)
        wa = self.b.weight.abs().amax(0, keepdim=True)  # per input column
        wi = torch.round(self.b.weight * 127 / wa)
        w = _ste(self.b.weight, wi * wa / 127)
        return F.linear(h, w, self.b.bias)


def int8_absmax():
    torch.manual_seed(0)
    return Int8Absmax(), (_x(),)


class StochasticRound(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x):
        h = self.a(x) * 8
        q = torch.floor(h + torch.rand_like(h)) / 8
        return self.b(_ste(h / 8, q))


def stochastic_round():
    torch.manual_seed(0)
    return StochasticRound(), (_x(),)


class LSQ(nn.Module):
    """Learned step size quantisation: trainable step s per tensor, gradient scaled by 1/sqrt(numel * Qp)."""

    def __init__(self, qp=7):
        super().__init__()
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)
        self.sw = nn.Parameter(torch.tensor(0.05))
        self.sx = nn.Parameter(torch.tensor(0.3))
        self.qp = qp

    def _lsq(self, v, s):
        g = 1.0 / math.sqrt(v.numel() * self.qp)
        s = (s - s * g).detach() + s * g  # grad scale
        q = (v / s).clamp(-self.qp, self.qp)
        q = _ste(q, q.round())
        return q * s

    def forward(self, x):
        h = F.relu(self.a(x))
        return F.linear(self._lsq(h, self.sx), self._lsq(self.b.weight, self.sw), self.b.bias)


def lsq():
    torch.manual_seed(0)
    return LSQ(), (_x(),)


# ---------------------------------------------------------------- batch-level losses in forward
class Encoder(nn.Module):
    def __init__(self, i=H, o=H):
        super().__init__()
        self.a, self.b = nn.Linear(i, 2 * H), nn.Linear(2 * H, o)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


class CLIPLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.img, self.txt = Encoder(), Encoder()
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, x, y):
        a = F.normalize(self.img(x).mean(1), dim=-1)
        b = F.normalize(self.txt(y).mean(1), dim=-1)
        logits = self.logit_scale.exp() * a @ b.T
        labels = torch.arange(a.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def clip_loss():
    torch.manual_seed(0)
    return CLIPLoss(), (_x(), _x(seed=3))


class NTXent(nn.Module):
    def __init__(self, tau=0.5):
        super().__init__()
        self.enc, self.tau = Encoder(), tau

    def forward(self, x1, x2):
        z = F.normalize(torch.cat([self.enc(x1).mean(1), self.enc(x2).mean(1)], 0), dim=-1)
        n = z.shape[0] // 2
        sim = z @ z.T / self.tau
        sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
        targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
        return F.cross_entropy(sim, targets)


def nt_xent():
    torch.manual_seed(0)
    return NTXent(), (_x(), _x(seed=3))


class TripletHard(nn.Module):
    def __init__(self, margin=0.3):
        super().__init__()
        self.enc, self.margin = Encoder(), margin

    def forward(self, x, labels):
        e = self.enc(x).mean(1)
        d = torch.cdist(e, e)
        same = labels[:, None] == labels[None, :]
        pos = (d * same).max(1).values
        neg = d.masked_fill(same, float("inf")).min(1).values
        hard = torch.where(same, d, torch.zeros_like(d)).argmax(1)
        pos2 = d.gather(1, hard[:, None]).squeeze(1)
        return F.relu(pos - neg + self.margin).mean() + 0.1 * pos2.mean()


def triplet_hard():
    torch.manual_seed(0)
    return TripletHard(), (_x(), torch.tensor([0, 1, 0, 1]))


class VICReg(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = Encoder()

    def forward(self, x1, x2):
        z1, z2 = self.enc(x1).flatten(0, 1), self.enc(x2).flatten(0, 1)
        n, d = z1.shape
        inv = F.mse_loss(z1, z2)
        std1, std2 = torch.sqrt(z1.var(0) + 1e-4), torch.sqrt(z2.var(0) + 1e-4)
        var = F.relu(1 - std1).mean() + F.relu(1 - std2).mean()
        z1c, z2c = z1 - z1.mean(0), z2 - z2.mean(0)
        c1, c2 = z1c.T @ z1c / (n - 1), z2c.T @ z2c / (n - 1)
        off = lambda c: (c - torch.diag(torch.diagonal(c))).pow(2).sum() / d  # noqa: E731
        return 25 * inv + 25 * var + off(c1) + off(c2)


def vicreg():
    torch.manual_seed(0)
    return VICReg(), (_x(), _x(seed=3))


class BarlowTwins(nn.Module):
    def __init__(self, lam=5e-3):
        super().__init__()
        self.enc, self.lam = Encoder(), lam

    def forward(self, x1, x2):
        z1, z2 = self.enc(x1).mean(1), self.enc(x2).mean(1)
        z1 = (z1 - z1.mean(0)) / z1.std(0)
        z2 = (z2 - z2.mean(0)) / z2.std(0)
        c = z1.T @ z2 / z1.shape[0]
        on = (torch.diagonal(c) - 1).pow(2).sum()
        offd = c.pow(2).sum() - torch.diagonal(c).pow(2).sum()
        return on + self.lam * offd


def barlow_twins():
    torch.manual_seed(0)
    return BarlowTwins(), (_x(), _x(seed=3))


class CenterLoss(nn.Module):
    def __init__(self, alpha=0.5):
        super().__init__()
        self.enc, self.head = Encoder(), nn.Linear(H, C)
        self.register_buffer("centers", torch.randn(C, H))
        self.alpha = alpha

    def forward(self, x, labels):
        f = self.enc(x).mean(1)
        c = self.centers[labels]
        loss = F.cross_entropy(self.head(f), labels) + 0.1 * (f - c).pow(2).sum(1).mean()
        with torch.no_grad():
            delta = torch.zeros_like(self.centers).index_add_(0, labels, c - f)
            count = torch.zeros(self.centers.shape[0]).index_add_(0, labels, torch.ones_like(labels, dtype=f.dtype))
            self.centers.sub_(self.alpha * delta / (1 + count[:, None]))
        return loss


def center_loss():
    torch.manual_seed(0)
    return CenterLoss(), (_x(), torch.tensor([1, 3, 1, 7]))


class Focal(nn.Module):
    def __init__(self, gamma=2.0):
        super().__init__()
        self.enc, self.head, self.gamma = Encoder(), nn.Linear(H, C), gamma

    def forward(self, x, y):
        logits = self.head(self.enc(x))  # (B, T, C)
        logp = logits.log_softmax(-1).gather(-1, y[..., None]).squeeze(-1)
        pt = logp.exp()
        return (-(1 - pt) ** self.gamma * logp).mean()


def focal():
    torch.manual_seed(0)
    return Focal(), (_x(), torch.randint(0, C, (B, T), generator=_g(5)))


class Distill(nn.Module):
    def __init__(self, temp=2.0):
        super().__init__()
        self.teacher = Encoder(H, V)
        self.teacher.requires_grad_(False)
        self.student = Encoder(H, V)
        self.temp = temp

    def forward(self, x, y):
        s, t = self.student(x), self.teacher(x)
        kd = F.kl_div((s / self.temp).log_softmax(-1).flatten(0, 1), (t / self.temp).softmax(-1).flatten(0, 1),
                      reduction="batchmean") * self.temp ** 2
        return kd + F.cross_entropy(s.flatten(0, 1), y.flatten())


def distill():
    torch.manual_seed(0)
    return Distill(), (_x(), _ids())


class PairRanking(nn.Module):
    def __init__(self, margin=0.5):
        super().__init__()
        self.enc, self.score, self.margin = Encoder(), nn.Linear(H, 1), margin

    def forward(self, x, y):
        s = self.score(self.enc(x).mean(1)).squeeze(-1)  # (B,)
        ds = s[:, None] - s[None, :]
        better = (y[:, None] > y[None, :]).float()
        return (F.relu(self.margin - ds) * better).sum() / better.sum()


def pair_ranking():
    torch.manual_seed(0)
    return PairRanking(), (_x(), torch.tensor([0.3, 2.0, -1.0, 0.7]))


class SoftRank(nn.Module):
    def __init__(self, tau=0.1):
        super().__init__()
        self.enc, self.score, self.tau = Encoder(), nn.Linear(H, 1), tau

    def forward(self, x, y):
        s = self.score(self.enc(x)).squeeze(-1).flatten()  # (B*T,)
        soft = torch.sigmoid((s[:, None] - s[None, :]) / self.tau).sum(1)
        target = y.flatten().argsort().argsort().float()
        srt, idx = s.sort(0, descending=True)
        top = srt[:3].sum() + s.gather(0, idx[-1:]).sum()
        return (soft - target).pow(2).mean() + 0.01 * top


def soft_rank():
    torch.manual_seed(0)
    return SoftRank(), (_x(), torch.randn(B, T, generator=_g(6)))


class TopKWeighted(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.head = Encoder(), nn.Linear(H, C)

    def forward(self, x, y):
        logits = self.head(self.enc(x).mean(1))  # (B, C)
        idx = logits.topk(2, dim=-1).indices
        correct = (idx == y[:, None]).any(-1).float()
        w = 1.0 - correct.mean()
        return F.cross_entropy(logits, y, reduction="none").mul(1 + correct).mean() * (1 + w)


def topk_weighted():
    torch.manual_seed(0)
    return TopKWeighted(), (_x(), torch.tensor([2, 5, 0, 9]))


# ---------------------------------------------------------------- norms
class RMS(nn.Module):
    def __init__(self, d, offset=False, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d) + 0.1 * torch.randn(d) if offset else torch.ones(d) + 0.1 * torch.randn(d))
        self.offset, self.eps = offset, eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * ((1.0 + self.w.float()) if self.offset else self.w.float())).type_as(x)


class QKNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
        self.qn, self.kn = RMS(H // NH), RMS(H // NH)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.qn(self.q(x).view(b, t, NH, -1)).transpose(1, 2)
        k = self.kn(self.k(x).view(b, t, NH, -1)).transpose(1, 2)
        v = self.v(x).view(b, t, NH, -1).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(o.transpose(1, 2).reshape(b, t, H))


def qk_norm():
    torch.manual_seed(0)
    return QKNorm(), (_x(),)


class NormBlock(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)
        if kind == "gemma":
            self.n = RMS(H, offset=True)
        elif kind == "ln_nobias":
            self.n = nn.LayerNorm(H, bias=False)
        elif kind == "scalenorm":
            self.g = nn.Parameter(torch.tensor(math.sqrt(H)))
        elif kind == "seqnorm":
            self.w = nn.Parameter(torch.ones(T, 1) + 0.1 * torch.randn(T, 1))
        elif kind == "dyt":
            self.alpha = nn.Parameter(torch.tensor(0.5))
            self.w, self.bias = nn.Parameter(1 + 0.1 * torch.randn(H)), nn.Parameter(0.1 * torch.randn(H))
        elif kind == "deepnorm":
            self.n, self.alpha = nn.LayerNorm(H), (2 * 2) ** 0.25
        self.head = nn.Linear(H, H)

    def norm(self, x):
        k = self.kind
        if k in ("gemma", "ln_nobias"):
            return self.n(x)
        if k == "scalenorm":
            return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=1e-5)
        if k == "seqnorm":
            m, v = x.mean(1, keepdim=True), x.var(1, keepdim=True, unbiased=False)
            return (x - m) / torch.sqrt(v + 1e-5) * self.w
        if k == "dyt":
            return torch.tanh(self.alpha * x) * self.w + self.bias
        raise AssertionError

    def forward(self, x):
        if self.kind == "deepnorm":
            h = self.n(self.alpha * x + self.b(F.gelu(self.a(x))))
            return self.head(self.n(self.alpha * h + self.b(F.gelu(self.a(h)))))
        h = x + self.b(F.gelu(self.a(self.norm(x))))
        return self.head(self.norm(h))


def gemma_rms():
    torch.manual_seed(0)
    return NormBlock("gemma"), (_x(),)


def ln_nobias():
    torch.manual_seed(0)
    return NormBlock("ln_nobias"), (_x(),)


def scalenorm():
    torch.manual_seed(0)
    return NormBlock("scalenorm"), (_x(),)


def seqnorm():
    torch.manual_seed(0)
    return NormBlock("seqnorm"), (_x(),)


def dyt():
    torch.manual_seed(0)
    return NormBlock("dyt"), (_x(),)


def deepnorm():
    torch.manual_seed(0)
    return NormBlock("deepnorm"), (_x(),)


# ---------------------------------------------------------------- packing
def _boundaries():
    """(B, T) bool: True where a new document starts (always at 0)."""
    s = torch.zeros(B, T, dtype=torch.bool)
    s[:, 0] = True
    s[0, 3] = s[1, 5] = s[2, 2] = s[2, 6] = s[3, 1] = s[3, 4] = s[3, 7] = True
    return s


class PackedPositions(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, H), nn.Embedding(T, H)
        self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
        self.head = nn.Linear(H, V)

    def forward(self, ids, starts):
        doc = starts.long().cumsum(1)  # (B, T) document id
        idx = torch.arange(ids.shape[1]).expand_as(ids)
        first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(1).values
        pos = idx - first
        h = self.tok(ids) + self.pos(pos)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        mask = (doc[:, :, None] == doc[:, None, :]) & causal
        h = h + self.o(_attn(self.q(h), self.k(h), self.v(h), mask[:, None]))
        return F.cross_entropy(self.head(h).flatten(0, 1), ids.flatten())


def packed_positions():
    torch.manual_seed(0)
    return PackedPositions(), (_ids(), _boundaries())


class PackedCuSeqlens(nn.Module):
    """cu_seqlens (B, K) per row -> document id by searchsorted, positions by subtracting the start."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, H), nn.Embedding(T, H)
        self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
        self.head = nn.Linear(H, H)

    def forward(self, ids, cu):
        t = torch.arange(ids.shape[1]).expand(ids.shape[0], -1).contiguous()
        doc = torch.searchsorted(cu, t, right=True) - 1
        pos = t - cu.gather(1, doc)
        h = self.tok(ids) + self.pos(pos)
        mask = doc[:, :, None].eq(doc[:, None, :])
        h = h + self.o(_attn(self.q(h), self.k(h), self.v(h), mask[:, None]))
        return self.head(h)


def packed_cu_seqlens():
    torch.manual_seed(0)
    cu = torch.tensor([[0, 3, 8], [0, 5, 8], [0, 2, 6], [0, 4, 8]])
    return PackedCuSeqlens(), (_ids(), cu)


class SegmentPool(nn.Module):
    def __init__(self, s=3):
        super().__init__()
        self.enc, self.head, self.s = Encoder(), nn.Linear(H, C), s

    def forward(self, x, seg):
        h = self.enc(x)  # (B, T, H)
        b = h.shape[0]
        summed = torch.zeros(b, self.s, H).scatter_add(1, seg[..., None].expand(-1, -1, H), h)
        count = torch.zeros(b, self.s).index_add(1, torch.arange(self.s), torch.zeros(b, self.s))
        count = count.scatter_add(1, seg, torch.ones_like(seg, dtype=h.dtype))
        pooled = summed / count.clamp(min=1)[..., None]
        flat = torch.zeros(b * self.s, H).index_add(0, (seg + torch.arange(b)[:, None] * self.s).flatten(),
                                                    h.flatten(0, 1))
        return self.head(pooled).pow(2).mean() + flat.pow(2).mean() * 0.1


def segment_pool():
    torch.manual_seed(0)
    seg = (_boundaries().long().cumsum(1) - 1).clamp(max=2)
    return SegmentPool(), (_x(), seg)


ALL = [lora_unmerged, lora_merged, lora_qkv, dora, dora_grad_norm, ia3, prefix_tuning, bitfit, prompt_embeddings,
       new_rows, fq_tensor, fq_channel, delayed_scaling, int8_absmax, lsq, clip_loss, nt_xent, triplet_hard,
       vicreg, barlow_twins, center_loss, focal, distill, pair_ranking, soft_rank, topk_weighted, qk_norm,
       gemma_rms, ln_nobias, scalenorm, seqnorm, dyt, deepnorm, packed_positions, packed_cu_seqlens, segment_pool]
RANDOM = [stochastic_round]


class BannedClasses(nn.Module):
    """A head whose logits of some classes are set to -inf (banned tokens; Megatron's padded vocab), then
    cross-entropy: under tp the classes are sharded (vocab-parallel cross-entropy)."""

    def __init__(self, v=16):
        super().__init__()
        self.a, self.head = nn.Linear(H, H), nn.Linear(H, v)
        banned = torch.zeros(v, dtype=torch.bool)
        banned[[3, v // 2]] = True
        self.register_buffer("banned", banned, persistent=False)

    def forward(self, x, y):
        logits = self.head(torch.tanh(self.a(x))).masked_fill(self.banned, float("-inf"))
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def banned_classes():
    torch.manual_seed(0)
    y = torch.randint(0, 16, (B, T), generator=_g(7))
    y[(y == 3) | (y == 8)] = 5
    return BannedClasses(), (_x(), y)
