"""Models whose ops ran replicated before their rule rows existed (the class "an op without a rule loses the
parallelism of everything around it"): each builder returns (model, inputs) with a scalar loss output."""
import torch
import torch.nn.functional as F
from torch import nn


class Decoder2d(nn.Module):
    """Image decoder: conv, PReLU, max pooling with indices and unpooling, transposed conv, bilinear and
    nearest-exact upsampling, pixel (un)shuffle, instance norm, GLU, grid sampling, then regression losses
    (mse, smooth L1, BCE with logits, KL)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding="same")
        self.act = nn.PReLU(8)
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.norm = nn.InstanceNorm2d(8, affine=True)
        self.head = nn.Linear(4 * 4 * 4, 6)

    def forward(self, x, y):
        h = self.act(self.conv(x))                              # (N, 8, 8, 8)
        p, idx = self.pool(h)
        h = self.unpool(p, idx) + self.up(p)                    # (N, 8, 8, 8)
        h = F.interpolate(h, scale_factor=0.5, mode="bilinear")  # (N, 8, 4, 4)
        h = F.pixel_unshuffle(F.pixel_shuffle(h, 2), 2)
        h = self.norm(h)
        grid = torch.tanh(h[:, :2].permute(0, 2, 3, 1))         # (N, 4, 4, 2)
        h = F.glu(F.grid_sample(h, grid, align_corners=False), dim=1)  # (N, 4, 4, 4)
        h = F.interpolate(h, size=(4, 4), mode="nearest-exact")
        out = self.head(h.flatten(1))
        return (F.mse_loss(out, y) + F.smooth_l1_loss(out, y) + F.binary_cross_entropy_with_logits(out, y.sigmoid())
                + F.kl_div(out.log_softmax(-1), y.softmax(-1), reduction="batchmean"))


def decoder_2d():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Decoder2d(), (torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 6, generator=g))


class Sequence(nn.Module):
    """Sequence model: GRU, RNN, transposed 1-D conv, 3-D pooling of a (N, C, T, 2, 2) view, SELU / CELU /
    log-sigmoid / shrinks, repeat, then NLL, L1, Huber and margin-ranking losses."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.gru = nn.GRU(8, 8)
        self.rnn = nn.RNN(8, 8)
        self.deconv = nn.ConvTranspose1d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 11)

    def forward(self, ids, target):
        h = self.embed(ids).transpose(0, 1)                     # (T, N, 8): sequence first
        h, _ = self.gru(h)
        h, _ = self.rnn(F.selu(h) + F.celu(h))
        h = h.permute(1, 2, 0)                                  # (N, 8, T)
        h = self.deconv(F.softshrink(h, 0.1) + F.hardshrink(h, 0.1)) + F.logsigmoid(h)
        v = h.reshape(h.shape[0], 2, 4, h.shape[2], 1).repeat(1, 1, 1, 1, 2)
        h = h + F.avg_pool3d(v, (1, 1, 2)).reshape(h.shape) + F.adaptive_max_pool3d(v, (4, h.shape[2], 1)).reshape(h.shape)
        logits = self.head(h.transpose(1, 2))                   # (N, T, 11)
        logp = logits.log_softmax(-1)
        score = logits.mean(-1)
        return (F.nll_loss(logp.transpose(1, 2), target) + F.l1_loss(score, score.detach() * 0.5)
                + F.huber_loss(logits[..., 0], logits[..., 1]) + F.margin_ranking_loss(score, -score, torch.ones_like(score)))


def sequence():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    return Sequence(), (torch.randint(0, 11, (4, 6), generator=g), torch.randint(0, 11, (4, 6), generator=g))


class Contrastive(nn.Module):
    """Two views through an LSTM cell (two steps) and a projection, F.normalize (expand_as), cosine similarity,
    pairwise distance and cdist between the views of each sample (a contrastive / metric-learning head)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(6, 8)
        self.gru = nn.GRUCell(8, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, a, b):
        ha, ca = self.cell(a[:, 0])
        ha, _ = self.cell(a[:, 1], (ha, ca))
        hb = self.gru(self.cell(b[:, 0])[0])
        za, zb = F.normalize(self.proj(ha), dim=-1), F.normalize(self.proj(hb), dim=-1)
        d = torch.cdist(torch.stack([za, zb], 1), torch.stack([zb, za, za], 1))  # (N, 2, 3): per sample
        return (1 - F.cosine_similarity(za, zb)).mean() + F.pairwise_distance(za, zb).mean() + d.mean()


def contrastive():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    return Contrastive(), (torch.randn(4, 2, 6, generator=g), torch.randn(4, 2, 6, generator=g))


class BatchFirstRnn(nn.Module):
    """nn.LSTM (2 layers, bidirectional) and nn.GRU with batch_first=True, the usual way to write them: the
    tracer writes them as the sequence-first op between transposes (normalisation 10), so the batch shards."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 6, 2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(12, 5, batch_first=True)
        self.head = nn.Linear(5, 3)

    def forward(self, x, y):
        o, (h, c) = self.lstm(x)
        p, q = self.gru(o)
        return F.mse_loss(self.head(p[:, -1]), y) + (h.mean() + c.mean() + q.mean()) * 0.1


def batch_first_rnn():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    return BatchFirstRnn(), (torch.randn(4, 7, 4, generator=g), torch.randn(4, 3, generator=g))


class TinyVlm(nn.Module):
    """A LLaVA-style VLM: patch features projected and placed into the text embeddings at the image-token
    positions with masked_scatter (the same number of image tokens per sample), then a GRU LM and CE."""

    IMAGE_TOKEN, TOKENS = 3, 2

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.vision = nn.Linear(6, 8)
        self.lm = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 16)

    def forward(self, ids, patches, labels):
        text = self.embed(ids)                                          # (B, S, 8)
        image = self.vision(patches).reshape(-1, 8)                     # (B * TOKENS, 8), sample-major
        mask = (ids == self.IMAGE_TOKEN).unsqueeze(-1).expand_as(text)
        h, _ = self.lm(text.masked_scatter(mask, image))
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def tiny_vlm():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(4, 16, (4, 6), generator=g)
    ids[:, 1:1 + TinyVlm.TOKENS] = TinyVlm.IMAGE_TOKEN  # each sample: its image tokens after the first token
    return TinyVlm(), (ids, torch.randn(4, TinyVlm.TOKENS, 6, generator=g), torch.randint(0, 16, (4, 6), generator=g))


class TrackedInstanceNorm(nn.Module):
    """InstanceNorm2d(track_running_stats=True) in training between two convs: its running statistics are
    written inside a composite whose schema does not say so."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.InstanceNorm2d(4, affine=True, track_running_stats=True)
        self.head = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x, y):
        return F.mse_loss(self.head(self.norm(self.conv(x)).flatten(1)), y)


def tracked_instance_norm():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(4)
    return TrackedInstanceNorm(), (torch.randn(4, 3, 5, 5, generator=g), torch.randn(4, 3, generator=g))


BUILDERS = {"decoder_2d": decoder_2d, "sequence": sequence, "contrastive": contrastive, "batch_first_rnn": batch_first_rnn,
            "tiny_vlm": tiny_vlm}
