"""Trial r9e: three small models of a new user's own (not from the zoo)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvAE(nn.Module):
    """Conv autoencoder: conv/BN/ReLU encoder, ConvTranspose decoder; mse loss outside."""

    def __init__(self, ch: int = 8) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, ch, 3, stride=2, padding=1), nn.BatchNorm2d(ch), nn.ReLU(),
                                 nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1), nn.ReLU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(2 * ch, ch, 4, stride=2, padding=1), nn.ReLU(),
                                 nn.ConvTranspose2d(ch, 3, 4, stride=2, padding=1), nn.Sigmoid())

    def forward(self, x):
        return self.dec(self.enc(x))


class GRUTagger(nn.Module):
    """Token tagger: (frozen) embedding, bidirectional GRU, linear head over tags."""

    def __init__(self, vocab: int = 100, dim: int = 32, hidden: int = 48, tags: int = 7, freeze_embed=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.embed.weight.requires_grad_(not freeze_embed)
        self.gru = nn.GRU(dim, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, ids):
        h, _ = self.gru(self.embed(ids))
        return self.head(h)


def small_vit(image: int = 32, labels: int = 10):
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=image, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, num_labels=labels,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(cfg)


def ae_loss(out, x):
    return F.mse_loss(out, x)


def tag_loss(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)


def focal_loss(out, y, gamma: float = 2.0):
    """Custom loss on a transformers output: focal loss with label smoothing."""
    logits = out.logits
    logp = F.log_softmax(logits, -1)
    pt = logp.gather(1, y[:, None]).squeeze(1).exp()
    ce = F.cross_entropy(logits, y, reduction="none", label_smoothing=0.1)
    return ((1 - pt) ** gamma * ce).mean()


def build(kind: str, batch: int):
    g = torch.Generator().manual_seed(1)
    if kind == "ae":
        m = ConvAE()
        x = torch.rand(batch, 3, 16, 16, generator=g)
        return m, (x,), x, ae_loss
    if kind == "gru":
        m = GRUTagger()
        ids = torch.randint(0, 100, (batch, 12), generator=g)
        y = torch.randint(0, 7, (batch, 12), generator=g)
        y[0, 6:] = -100
        return m, (ids,), y, tag_loss
    if kind == "vit":
        m = small_vit()
        x = torch.randn(batch, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        return m, (x,), y, focal_loss
    raise ValueError(kind)


# CLI factories (`parallelizer plan --model trial.r9e_models:ae_factory`)
def ae_factory(batch: int = 8, seq_len=None, **kw):
    torch.manual_seed(0)
    m, args, _, _ = build("ae", batch)
    return m, args


def gru_factory(batch: int = 8, seq_len=None, **kw):
    torch.manual_seed(0)
    m, args, _, _ = build("gru", batch)
    return m, args
