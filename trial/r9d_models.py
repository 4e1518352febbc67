"""Round 9 (d): small realistic models using this morning's new rule rows. Each builder: (model, args)."""
import math
import torch
import torch.nn.functional as F
from torch import nn


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    a = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, c, tdim):
        super().__init__()
        self.n1 = nn.GroupNorm(4, c); self.c1 = nn.Conv2d(c, c, 3, padding=1)
        self.t = nn.Linear(tdim, c)
        self.n2 = nn.GroupNorm(4, c); self.c2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
        return x + self.c2(F.silu(self.n2(h)))


class TinyUNet(nn.Module):
    """Diffusion UNet: timestep embedding, GroupNorm, strided conv down, conv_transpose up and nearest upsample,
    skip cat, mse loss on the noise."""
    def __init__(self, c=8, tdim=16):
        super().__init__()
        self.tdim = tdim
        self.temb = nn.Sequential(nn.Linear(tdim, 16), nn.SiLU(), nn.Linear(16, 16))
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.r1 = ResBlock(c, 16)
        self.down = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        self.r2 = ResBlock(2 * c, 16)
        self.up = nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1)
        self.up2 = nn.Conv2d(2 * c, c, 3, padding=1)
        self.r3 = ResBlock(2 * c, 16)
        self.out = nn.Conv2d(2 * c, 3, 3, padding=1)

    def forward(self, x0, noise, t):
        a = (1 - t.float() / 10).clamp(0.05, 1)[:, None, None, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        temb = self.temb(timestep_embedding(t, self.tdim))
        h1 = self.r1(self.inp(xt), temb)
        h2 = self.r2(self.down(h1), temb)
        u = self.up(h2) + self.up2(F.interpolate(h2, scale_factor=2.0, mode="nearest"))
        h = self.r3(torch.cat([u, h1], 1), temb)
        return F.mse_loss(self.out(h), noise)


def unet(batch=4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return TinyUNet(), (torch.randn(batch, 3, 8, 8, generator=g), torch.randn(batch, 3, 8, 8, generator=g),
                        torch.randint(0, 10, (batch,), generator=g))


class VAE(nn.Module):
    def __init__(self, d=24, z=6):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 32), nn.ReLU())
        self.mu = nn.Linear(32, z); self.logvar = nn.Linear(32, z)
        self.dec = nn.Sequential(nn.Linear(z, 32), nn.ReLU(), nn.Linear(32, d))

    def forward(self, x, eps):
        h = self.enc(x)
        mu, lv = self.mu(h), self.logvar(h)
        zz = mu + eps * torch.exp(0.5 * lv)
        rec = self.dec(zz)
        kl = -0.5 * torch.mean(torch.sum(1 + lv - mu.pow(2) - lv.exp(), dim=1))
        return F.mse_loss(rec, x, reduction="mean") + F.binary_cross_entropy(torch.sigmoid(rec), torch.sigmoid(x)) + 0.1 * kl


def vae(batch=4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    return VAE(), (torch.randn(batch, 24, generator=g), torch.randn(batch, 6, generator=g))


class SRGen(nn.Module):
    """SRGAN-like generator: conv + PReLU residual blocks with BatchNorm off (instance norm), pixel shuffle x2,
    L1 + BCE-with-logits (adversarial term against a fixed tiny discriminator)."""
    def __init__(self, c=8):
        super().__init__()
        self.head = nn.Conv2d(3, c, 5, padding=2); self.act = nn.PReLU()
        self.b1 = nn.Conv2d(c, c, 3, padding=1); self.a1 = nn.PReLU(c); self.b2 = nn.Conv2d(c, c, 3, padding=1)
        self.upc = nn.Conv2d(c, c * 4, 3, padding=1); self.ps = nn.PixelShuffle(2); self.a2 = nn.PReLU()
        self.tail = nn.Conv2d(c, 3, 5, padding=2)
        self.disc = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.LeakyReLU(0.2), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten(), nn.Linear(4, 1))

    def forward(self, lr, hr):
        h = self.act(self.head(lr))
        h = h + self.b2(self.a1(self.b1(h)))
        sr = self.tail(self.a2(self.ps(self.upc(h))))
        d = self.disc(sr)
        return F.l1_loss(sr, hr) + 1e-1 * F.binary_cross_entropy_with_logits(d, torch.ones_like(d)) \
            + F.smooth_l1_loss(F.avg_pool2d(sr, 2), lr, beta=0.5)


def srgan(batch=4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    return SRGen(), (torch.randn(batch, 3, 6, 6, generator=g), torch.randn(batch, 3, 12, 12, generator=g))


class Seq2Seq(nn.Module):
    def __init__(self, v=13, d=12):
        super().__init__()
        self.emb = nn.Embedding(v, d); self.enc = nn.GRU(d, d, batch_first=True)
        self.dec = nn.GRU(d, d, batch_first=True); self.out = nn.Linear(d, v)

    def forward(self, src, tgt_in, tgt_out):
        _, h = self.enc(self.emb(src))
        o, _ = self.dec(self.emb(tgt_in), h)
        logp = F.log_softmax(self.out(o), -1)
        return F.nll_loss(logp.reshape(-1, logp.shape[-1]), tgt_out.reshape(-1), ignore_index=0)


def seq2seq(batch=4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(4)
    tgt = torch.randint(0, 13, (batch, 6), generator=g)
    tgt[0, 3:] = 0  # padding
    return Seq2Seq(), (torch.randint(1, 13, (batch, 5), generator=g), torch.randint(1, 13, (batch, 6), generator=g), tgt)


class Clip(nn.Module):
    def __init__(self):
        super().__init__()
        self.img = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16))
        self.emb = nn.Embedding(20, 16); self.txt = nn.Linear(16, 16)
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, im, ids):
        a = F.normalize(self.img(im), dim=-1)
        b = F.normalize(self.txt(self.emb(ids).mean(1)), dim=-1)
        logits = self.scale.exp() * a @ b.t()
        lab = torch.arange(a.shape[0])
        return (F.cross_entropy(logits, lab) + F.cross_entropy(logits.t(), lab)) / 2 \
            + (1 - F.cosine_similarity(self.img(im), self.txt(self.emb(ids).mean(1)))).mean()


def clip(batch=4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    return Clip(), (torch.randn(batch, 3, 8, 8, generator=g), torch.randint(0, 20, (batch, 5), generator=g))


BUILDERS = {"unet": unet, "vae": vae, "srgan": srgan, "seq2seq": seq2seq, "clip": clip}


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.n = nn.LayerNorm(d); self.f = nn.Linear(d, d)

    def forward(self, x):
        return x + F.gelu(self.f(self.n(x)))


class LossStack(nn.Module):
    """4 repeated blocks (pipeline cuts) and an elementwise loss: kl_div (mean), Poisson NLL, hinge, margin ranking."""
    def __init__(self, loss="kl"):
        super().__init__()
        self.loss = loss
        self.inp = nn.Linear(8, 16); self.blocks = nn.ModuleList(Block() for _ in range(4)); self.out = nn.Linear(16, 8)

    def forward(self, x, y):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        h = self.out(h)
        if self.loss == "kl":
            return F.kl_div(h.log_softmax(-1), y.softmax(-1), reduction="mean")
        if self.loss == "poisson":
            return F.poisson_nll_loss(h, y.abs())
        if self.loss == "hinge":
            return F.hinge_embedding_loss(h, torch.where(y > 0, 1.0, -1.0))
        return F.mse_loss(h, y)


def loss_stack(batch=4, loss="kl", **kw):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(6)
    return LossStack(loss), (torch.randn(batch, 6, 8, generator=g), torch.randn(batch, 6, 8, generator=g))


BUILDERS["kl_stack"] = loss_stack
