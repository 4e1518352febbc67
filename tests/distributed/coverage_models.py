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


class BatchedLinalg(nn.Module):
    """Per-sample 3x3 matrices from a Linear, through torch.linalg (cholesky, solve, solve_triangular,
    cholesky_solve, lu_factor + lu_solve, det, slogdet, inv, qr, svdvals, eigh, matrix_exp, matrix_power,
    matrix and vector norms, vecdot, cross, diagonal, vander, matrix_rank), then a Linear head and MSE: round
    10's batched matrix rows."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(6, 9)
        self.lin2 = nn.Linear(6, 9)
        self.head = nn.Linear(9 * 10 + 3 * 8 + 3, 4)

    def forward(self, x, y):
        n = x.shape[0]
        m = self.lin1(x).view(n, 3, 3)
        a = m @ m.transpose(1, 2) / 3 + 3 * torch.eye(3)              # (N, 3, 3) symmetric positive definite
        b = self.lin2(x).view(n, 3, 3)
        w = b + 4 * torch.eye(3)                                      # (N, 3, 3) well conditioned
        chol = torch.linalg.cholesky(a)
        lu, piv = torch.linalg.lu_factor(w)
        mats = [chol, torch.linalg.solve(a, b), torch.linalg.solve_triangular(chol, b, upper=False),
                torch.cholesky_solve(b, chol), torch.linalg.lu_solve(lu, piv, b), torch.linalg.inv(w),
                torch.linalg.qr(w)[1], torch.linalg.matrix_exp(0.3 * b), torch.linalg.cross(b, w),
                torch.linalg.vander(b[:, 0])]
        vecs = [torch.linalg.svdvals(w), torch.linalg.eigh(a)[0], torch.linalg.det(w)[:, None].expand(n, 3),
                torch.linalg.slogdet(a)[1][:, None].expand(n, 3),
                torch.linalg.matrix_norm(torch.linalg.matrix_power(0.5 * b, 2), dim=(1, 2), keepdim=True)[:, 0].expand(n, 3),
                torch.linalg.vecdot(b, w), torch.linalg.diagonal(w), torch.diagonal(m, 0, 1, 2)]
        rank = torch.linalg.matrix_rank(w.detach()).to(w.dtype)[:, None]         # (N, 1): 3 for each sample
        feats = torch.cat([t.flatten(1) for t in mats + vecs] + [torch.linalg.norm(b, dim=(1, 2))[:, None],
                                                                torch.linalg.matrix_norm(w, "fro")[:, None], rank * b[:, :1, 0]], 1)
        return F.mse_loss(self.head(feats), y)


def batched_linalg():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    return BatchedLinalg(), (torch.randn(4, 6, generator=g), torch.randn(4, 4, generator=g))


class MetricLosses(nn.Module):
    """Embeddings and class scores from Linears into the per-sample losses that had no row: multi-margin
    (p=2, class weights), multilabel-margin, cosine-embedding and triplet-margin (mean and sum)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.scores = nn.Linear(8, 5)
        self.register_buffer("class_weight", torch.tensor([1.0, 0.5, 2.0, 1.5, 0.8]))

    def forward(self, a, p, q, target, labels, sign):
        za, zp, zq = self.embed(a), self.embed(p), self.embed(q)          # (N, 8)
        s = self.scores(torch.tanh(za))                                 # (N, 5)
        return (F.multi_margin_loss(s, target, p=2, margin=0.5, weight=self.class_weight)
                + F.multilabel_margin_loss(s, labels, reduction="sum") * 0.1
                + F.cosine_embedding_loss(za, zp, sign, margin=0.1)
                + F.triplet_margin_loss(za, zp, zq, margin=0.5))


def metric_losses():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(8)
    labels = torch.full((4, 5), -1)
    labels[:, 0] = torch.randint(0, 5, (4,), generator=g)
    labels[:2, 1] = (labels[:2, 0] + 2) % 5                             # two labels for two samples, one for the others
    return MetricLosses(), (torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g),
                            torch.randint(0, 5, (4,), generator=g), labels, torch.tensor([1.0, -1.0, 1.0, -1.0]))


class GridsAndSpectra(nn.Module):
    """A spatial-transformer head (theta from a Linear -> affine_grid -> grid_sample), a learned position grid
    from meshgrid of two parameter vectors, nn.Bilinear, torch.special functions (entr, xlog1py, expit,
    log_softmax, logsumexp), rfft2 / irfftn / fftfreq of a feature map and 3-D max unpooling, between Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.feat = nn.Linear(6, 2 * 4 * 4)
        self.theta = nn.Linear(6, 6)
        self.rows, self.cols = nn.Parameter(torch.randn(4) * 0.1), nn.Parameter(torch.randn(4) * 0.1)
        self.bil = nn.Bilinear(6, 6, 8)
        self.head = nn.Linear(2 * 3 * 3 + 2 * 4 * 4 + 8 + 8 + 1, 4)

    def forward(self, x, y):
        n = x.shape[0]
        f = self.feat(x).view(n, 2, 4, 4)
        theta = self.theta(x).view(n, 2, 3) * 0.3 + torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        grid = F.affine_grid(theta, [n, 2, 3, 3], align_corners=False)              # (N, 3, 3, 2)
        r, c = torch.meshgrid(self.rows, self.cols, indexing="ij")                # (4, 4) each
        f = f + r + c
        spec = torch.fft.irfftn(torch.fft.rfft2(f) * torch.fft.fftfreq(4)[:3].abs(), s=(4, 4), dim=(2, 3))  # (N, 2, 4, 4)
        pooled, idx = F.max_pool3d(f.view(n, 1, 2, 4, 4), 2, return_indices=True)
        f = f + F.max_unpool3d(pooled, idx, 2).view(n, 2, 4, 4)                    # 3-D unpooling
        z = self.bil(x, x.flip(1))                                                # (N, 8)
        sp = torch.special.entr(torch.special.expit(z)) + torch.special.xlog1py(z, z.abs())
        feats = torch.cat([F.grid_sample(f, grid, align_corners=False).flatten(1), spec.flatten(1), sp,
                           torch.special.log_softmax(z, 1), torch.special.logsumexp(z, [1], keepdim=True)], 1)
        return F.mse_loss(self.head(feats), y)


def grids_and_spectra():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(9)
    return GridsAndSpectra(), (torch.randn(4, 6, generator=g), torch.randn(4, 4, generator=g))


class Bags(nn.Module):
    """Recommendation-style pooled embeddings: nn.EmbeddingBag in "sum" (with per-sample weights from a Linear),
    "mean" and "max" over fixed-size bags of ids (N, L), into a Linear head (`tracer/bags.py` rewrites them as
    embedding + reduction; the fused op had no row and ran replicated)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(5, 3)
        self.sum = nn.EmbeddingBag(13, 6, mode="sum")
        self.mean = nn.EmbeddingBag(13, 6, mode="mean")
        self.max = nn.EmbeddingBag(11, 4, mode="max")
        self.head = nn.Linear(16, 2)

    def forward(self, ids, dense, y):
        w = torch.sigmoid(self.gate(dense))                                     # (N, 3) per-sample weights
        pooled = torch.cat([self.sum(ids, per_sample_weights=w), self.mean(ids), self.max(ids % 11)], 1)
        return F.mse_loss(self.head(pooled), y)


def bags():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(10)
    ids = torch.randint(0, 13, (4, 3), generator=g)
    ids[0, 2] = ids[0, 0]                                                       # an id twice in one bag (a max tie)
    return Bags(), (ids, torch.randn(4, 5, generator=g), torch.randn(4, 2, generator=g))


def mixtral():
    """transformers' Mixtral (2 layers, hidden 32, 4 experts, top-2), whose experts on CPU / float32 run through
    transformers' custom op `transformers::grouped_mm_fallback` (a row of `rules.table.EXTENSIONS`); no labels
    (the rehearsal's own loss)."""
    import transformers
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=64)
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    return transformers.MixtralForCausalLM(cfg), (ids,)


# round 10: ops that had no row, each between sharded Linears (tests/distributed/test_rule_coverage_run.py plans
# them on ddp, fsdp, tp=2 and dp=2 x tp=2)
BUILDERS_R10 = {"batched_linalg": batched_linalg, "metric_losses": metric_losses, "grids_and_spectra": grids_and_spectra,
                "bags": bags}

BUILDERS = {"decoder_2d": decoder_2d, "sequence": sequence, "contrastive": contrastive, "batch_first_rnn": batch_first_rnn,
            "tiny_vlm": tiny_vlm}
