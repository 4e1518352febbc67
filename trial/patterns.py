"""Hand-written patterns that broke other auto-parallel systems. build(name) -> (model, args, kwargs)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, H, V = 6, 8, 30, 101


def _x(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Wrap(nn.Module):
    """lin_in -> op(h) -> lin_out; op is a callable on (module, h)."""

    def __init__(self, op, hout=H):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(hout, H)
        self.op = op

    def forward(self, x):
        h = self.a(x)
        return self.b(self.op(self, h))


def _sortvals(m, h):
    return torch.sort(h, dim=-1).values


def _topk(m, h):
    v = torch.topk(h, 5, dim=-1).values
    return torch.cat([v, h[..., 5:]], -1)


def _argmax(m, h):
    i = h.argmax(-1, keepdim=True)
    return h * (i.float() / H)


def _onehot_argmax(m, h):
    i = h.argmax(-1)
    return h + F.one_hot(i, H).float()


OPS = {
    "softmax_last": lambda m, h: torch.softmax(h, -1),
    "softmax_batch": lambda m, h: torch.softmax(h, 0),
    "logsumexp": lambda m, h: h - torch.logsumexp(h, -1, keepdim=True),
    "cumsum_last": lambda m, h: torch.cumsum(h, -1),
    "cumsum_seq": lambda m, h: torch.cumsum(h, 1),
    "cumprod": lambda m, h: torch.cumprod(torch.sigmoid(h), -1),
    "sort": _sortvals,
    "topk": _topk,
    "argmax": _argmax,
    "onehot_argmax": _onehot_argmax,
    "flip": lambda m, h: torch.flip(h, [-1]) * torch.arange(H).float(),
    "roll": lambda m, h: torch.roll(h, 3, -1) * torch.arange(H).float(),
    "roll_seq": lambda m, h: torch.roll(h, 1, 1) * torch.arange(T).float()[:, None],
    "std": lambda m, h: h / (h.std(-1, keepdim=True) + 1),
    "var_batch": lambda m, h: h - h.var(0, keepdim=True),
    "norm": lambda m, h: h / (h.norm(dim=-1, keepdim=True) + 1),
    "normalize": lambda m, h: F.normalize(h, dim=-1),
    "normalize_batch": lambda m, h: F.normalize(h, dim=0),
    "masked_fill_inf": lambda m, h: torch.softmax(h.masked_fill(torch.arange(H) % 3 == 0, float("-inf")), -1),
    "causal_mask_inf": lambda m, h: torch.softmax(
        (h[..., :T] @ h[..., :T].transpose(-1, -2)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1),
                                                                  float("-inf")), -1) @ h,
    "expand_sum": lambda m, h: h.unsqueeze(2).expand(-1, -1, 4, -1).sum(2),
    "expand_mean_batch": lambda m, h: h + h.unsqueeze(0).expand(3, *h.shape).mean(0).sum(0, keepdim=True),
    "where_bcast": lambda m, h: torch.where(h.sum(-1, keepdim=True) > 0, h, -h.mean(0)),
    "where_scalar": lambda m, h: torch.where(h > 0, h, 0.1 * h),
    "cos_sim": lambda m, h: h * F.cosine_similarity(h, h.flip(0), dim=-1).unsqueeze(-1),
    "einsum_diag": lambda m, h: h + torch.einsum("btt->bt", h[..., :T]).sum(-1)[:, None, None],
    "einsum_outer": lambda m, h: torch.einsum("bti,btj->bij", h, h).sum(1)[:, None, :] + h,
    "prod": lambda m, h: h * torch.prod(torch.sigmoid(h) + 0.5, -1, keepdim=True),
    "max_all": lambda m, h: h / (h.abs().max() + 1),
    "amax_batch": lambda m, h: h - h.amax(0),
    "median": lambda m, h: h - h.median(-1, keepdim=True).values,
    "cummax": lambda m, h: torch.cummax(h, -1).values,
    "clamp_minmax": lambda m, h: h.clamp(min=torch.tensor(-0.1), max=h.mean()),
    "pow_mean": lambda m, h: h * h.pow(2).mean(-1, keepdim=True).rsqrt(),
    "layer_norm_noaffine": lambda m, h: F.layer_norm(h, (H,)),
    "interp": lambda m, h: F.interpolate(h.transpose(1, 2), scale_factor=2, mode="linear").transpose(1, 2)[:, ::2],
    "interp_nearest": lambda m, h: F.interpolate(h.transpose(1, 2), size=2 * T, mode="nearest").transpose(1, 2)[:, 1::2],
    "complex_rotary": None,
    "int_ops": lambda m, h: h * ((h > 0).long().cumsum(-1) % 2).float(),
    "bool_any": lambda m, h: h * (h > 1).any(-1, keepdim=True).float(),
    "gather_last": lambda m, h: torch.gather(h, -1, (torch.arange(H) * 7 % H).expand_as(h).contiguous()),
    "index_select": lambda m, h: h.index_select(-1, torch.arange(H - 1, -1, -1)),
    "adv_index": lambda m, h: h[:, :, torch.tensor([3, 1, 4, 1, 5, 9] * 5)],
    "diff": lambda m, h: torch.cat([torch.diff(h, dim=-1), h[..., :1]], -1),
    "unfold": lambda m, h: h.unfold(-1, 5, 5).sum(-1).repeat_interleave(5, -1),
    "chunk_swap": lambda m, h: torch.cat(h.chunk(2, -1)[::-1], -1),
    "view_heads": lambda m, h: h.view(B, T, 5, 6).transpose(1, 2).softmax(-1).transpose(1, 2).reshape(B, T, H),
    "repeat": lambda m, h: h.repeat(1, 1, 2)[..., 3:3 + H],
    "tril_mm": lambda m, h: torch.tril(h[..., :T] @ h[..., :T].transpose(1, 2)) @ h,
    "sum_loss_like": lambda m, h: h * h.sum(),
    "var_all": lambda m, h: h / (h.var() + 1),
    "logcumsumexp": lambda m, h: torch.logcumsumexp(h, 1),
    "softmax_seq": lambda m, h: torch.softmax(h, 1),
    "argsort": lambda m, h: h * h.argsort(-1).float() / H,
    "mul_scalar_tensor": lambda m, h: h * torch.tensor(2.0) + torch.tensor([1.0]),
}


def _rotary(m, h):
    hc = h.reshape(B, T, H // 2, 2)
    z = torch.view_as_complex(hc.contiguous())
    ang = torch.arange(T).float()[:, None] * torch.arange(H // 2).float()[None] * 0.1
    rot = torch.polar(torch.ones_like(ang), ang)
    return torch.view_as_real(z * rot).reshape(B, T, H)


OPS["complex_rotary"] = _rotary


class InplaceView(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        h = h * 1.0
        v = h[:, :, :10]
        v.mul_(3.0)
        h[:, 0].add_(1.0)
        h.narrow(-1, 20, 5).zero_()
        return self.b(torch.relu_(h))


class InplaceTransposeView(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x).clone()
        t = h.transpose(0, 2)
        t[3].mul_(-2.0)
        h.view(B, T * H)[:, ::7].add_(0.5)
        return self.b(h)


class TiedTranspose(nn.Module):
    """Embedding shared with a head used as x @ E.T, and a second head using E directly."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.mid = nn.Linear(H, H)
        self.proj = nn.Linear(V, H, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        h = torch.tanh(self.mid(h))
        logits = h @ self.emb.weight.t()                  # (B, T, V)
        back = self.proj(torch.softmax(logits, -1))        # (B, T, H)
        return F.cross_entropy(logits.flatten(0, 1), ids.flatten()) + (back @ self.emb.weight.T).pow(2).mean()


class SharedLayers(nn.Module):
    """One block applied 3 times, plus a weight used transposed in another layer."""

    def __init__(self):
        super().__init__()
        self.blk = nn.Linear(H, H)
        self.out = nn.Linear(H, H)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.blk(x))
        return self.out(x) + F.linear(x, self.blk.weight.t())


class ScatterAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(10, H)

    def forward(self, x):
        h = self.a(x)
        idx = (torch.arange(H) % 10).expand_as(h).contiguous()
        z = torch.zeros(B, T, 10).scatter_add(-1, idx, h)
        return self.b(z)


class ScatterAddBatch(nn.Module):
    """segment-sum over the batch dim (rows into 3 buckets)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        idx = torch.tensor([0, 1, 2, 0, 1, 2])
        z = torch.zeros(3, T, H).index_add(0, idx, h)
        return self.b(z)


class IndexPut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        z = torch.zeros_like(h)
        z[:, :, torch.tensor([1, 3, 5])] = h[:, :, :3]
        z[torch.tensor([0, 2])] = z[torch.tensor([0, 2])] + 1.0
        return self.b(z + h)


class IndexPutAccumulate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        h = self.a(x)
        z = torch.zeros(B, T, H)
        z = z.index_put((torch.tensor([0, 0, 5]),), h[:3], accumulate=True)
        return self.b(z)


class LossSum(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.a = nn.Linear(H, V)
        self.kind = kind

    def forward(self, ids, y):
        logits = self.a(torch.tanh(self.emb(ids)))
        l2 = logits.flatten(0, 1)
        yf = y.flatten()
        if self.kind == "sum":
            return F.cross_entropy(l2, yf, reduction="sum")
        if self.kind == "ignore":
            return F.cross_entropy(l2, yf, ignore_index=-100)
        if self.kind == "weighted":
            w = (yf % 3).float()
            return (F.cross_entropy(l2, yf.clamp(min=0), reduction="none") * w).sum() / w.sum()
        if self.kind == "smooth":
            return F.cross_entropy(l2, yf, label_smoothing=0.1, ignore_index=-100)
        if self.kind == "nll_weight":
            cw = torch.linspace(0.5, 1.5, V)
            return F.nll_loss(F.log_softmax(l2, -1), yf.clamp(min=0), weight=cw)
        if self.kind == "mse_sum":
            return F.mse_loss(logits, torch.zeros_like(logits), reduction="sum")
        if self.kind == "kl_batchmean":
            return F.kl_div(F.log_softmax(logits, -1), torch.softmax(logits.detach() * 0.5, -1), reduction="batchmean")
        if self.kind == "max_loss":
            return F.cross_entropy(l2, yf, reduction="none").max()
        raise ValueError(self.kind)


class BufferFwd(nn.Module):
    """A buffer read in forward and an EMA buffer updated in forward that feeds the output next step."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, H))
        self.register_buffer("ema", torch.zeros(H))

    def forward(self, x):
        h = self.a(x) * self.scale
        out = self.b(h - self.ema)
        with torch.no_grad():
            self.ema.mul_(0.5).add_(h.mean((0, 1)) * 0.5)
        return out


class BufferCount(nn.Module):
    """A counter buffer and a running max of the batch."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.register_buffer("mx", torch.zeros(H))

    def forward(self, x):
        h = self.a(x)
        out = self.b(h * (1 + self.mx) + self.n.float())
        with torch.no_grad():
            self.n.add_(1)
            self.mx.copy_(torch.maximum(self.mx, h.amax((0, 1))))
        return out


class Convs(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.gc = nn.Conv2d(8, 12, 3, padding=1, groups=4)
        self.gn = nn.GroupNorm(4, 12)
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        h = F.relu(self.c1(x))
        h = self.dw(h)
        h = self.gn(self.gc(h))
        if self.kind == "interp":
            h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
        elif self.kind == "interp_nearest":
            h = F.interpolate(h, scale_factor=2, mode="nearest")
        return self.head(h.mean((2, 3)))


class IntInputs(nn.Module):
    """Integer and boolean inputs used arithmetically; mask from attention_mask-like bool."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.a = nn.Linear(H, H)

    def forward(self, ids, mask):
        h = self.emb(ids) * mask.unsqueeze(-1).float()
        pos = mask.long().cumsum(-1) - 1
        h = h + pos.unsqueeze(-1).float() * 0.01
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return self.a(pooled), pos


class EmbMaxNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H, max_norm=1.0)
        self.a = nn.Linear(H, H)

    def forward(self, ids):
        return self.a(self.emb(ids))


class EmbPadding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H, padding_idx=0)
        self.a = nn.Linear(H, H)

    def forward(self, ids):
        return self.a(self.emb(ids))


class ExpandSumWeight(nn.Module):
    """A weight expanded over the batch then reduced (bias-like), and a parameter used in two dtypes."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.p = nn.Parameter(torch.randn(T, H) * 0.1)

    def forward(self, x):
        h = self.a(x) + self.p.expand(B, T, H)
        return h + self.p.unsqueeze(0).expand(B, -1, -1).sum(0) * h.mean()


class BatchNorm1dUneven(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.bn = nn.BatchNorm1d(H)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        return self.b(self.bn(self.a(x).transpose(1, 2)).transpose(1, 2))


def build(name, device="cpu"):
    torch.manual_seed(0)
    x = _x(B, T, H)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    if name.startswith("op_"):
        return Wrap(OPS[name[3:]]), (x,), {}
    if name.startswith("loss_"):
        y = ids.clone()
        y[0, :3] = -100
        kind = name[5:]
        if kind in ("weighted", "nll_weight", "sum", "mse_sum", "kl_batchmean", "max_loss"):
            y = ids.clone()
        return LossSum(kind), (ids, y), {}
    if name.startswith("conv_"):
        return Convs(name[5:]), (_x(B, 4, 6, 6),), {}
    table = {"inplace_view": (InplaceView, (x,)), "inplace_tview": (InplaceTransposeView, (x,)),
             "tied_transpose": (TiedTranspose, (ids,)), "shared_layers": (SharedLayers, (x,)),
             "scatter_add": (ScatterAdd, (x,)), "index_add_batch": (ScatterAddBatch, (x,)),
             "index_put": (IndexPut, (x,)), "index_put_acc": (IndexPutAccumulate, (x,)),
             "buffer_fwd": (BufferFwd, (x,)), "buffer_count": (BufferCount, (x,)),
             "int_inputs": (IntInputs, (ids, torch.arange(T)[None].expand(B, T) < torch.tensor([[8], [5], [3], [8], [1], [6]]))),
             "emb_maxnorm": (EmbMaxNorm, (ids,)), "emb_padding": (EmbPadding, (ids,)),
             "expand_weight": (ExpandSumWeight, (x,)), "bn1d": (BatchNorm1dUneven, (x,))}
    cls, args = table[name]
    return cls(), args, {}


ALL = (["op_" + k for k in OPS] + ["loss_" + k for k in ("sum", "ignore", "weighted", "smooth", "nll_weight",
                                                          "mse_sum", "kl_batchmean", "max_loss")]
       + ["conv_plain", "conv_interp", "conv_interp_nearest", "inplace_view", "inplace_tview", "tied_transpose",
          "shared_layers", "scatter_add", "index_add_batch", "index_put", "index_put_acc", "buffer_fwd",
          "buffer_count", "int_inputs", "emb_maxnorm", "emb_padding", "expand_weight", "bn1d"])
