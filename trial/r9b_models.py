"""Round 9b: public reports of silent wrong numbers in other auto-parallel systems, each rebuilt as the smallest
model of its class. Builders are module-level and seeded (every rank builds the same weights and inputs)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

V, D = 37, 16  # a vocabulary of 37 (no mesh of 2 or 4 divides it), width 16


def _g(seed):
    return torch.Generator().manual_seed(seed)


# --- label smoothing over vocab-sharded logits (Megatron-LM #737, #7464)
class SmoothedCE(nn.Module):
    def __init__(self, smoothing=0.1, ignore=False):
        super().__init__()
        self.emb, self.up, self.head = nn.Embedding(V, D), nn.Linear(D, 2 * D), nn.Linear(2 * D, V)
        self.smoothing, self.ignore = smoothing, ignore

    def forward(self, ids, labels):
        logits = self.head(torch.relu(self.up(self.emb(ids))))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing=self.smoothing)


def smoothed_ce(seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, V, (4, 5), generator=_g(seed))
    labels = torch.randint(0, V, (4, 5), generator=_g(seed + 1))
    labels[0, :3] = -100  # padding labels too
    return SmoothedCE(), (ids, labels)


# --- vocab-parallel CE with a tied embedding (apple/ml-cross-entropy #42, Megatron-DeepSpeed #394)
class TiedCE(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.mid = nn.Linear(D, D)

    def forward(self, ids, labels):
        h = torch.tanh(self.mid(self.emb(ids)))
        logits = h @ self.emb.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def tied_ce(seed=0):
    torch.manual_seed(seed)
    return TiedCE(), (torch.randint(0, V, (4, 5), generator=_g(seed)), torch.randint(0, V, (4, 5), generator=_g(seed + 1)))


# --- mean / var / std over an unevenly sharded batch (pytorch #162692, #163241, #168057)
class Stats(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 6)

    def forward(self, x):
        h = self.l(x)
        return h.mean() + h.var(dim=0).sum() + h.std() + h.var(dim=0, correction=0).mean()


def stats(batch=3, seed=0):
    torch.manual_seed(seed)
    return Stats(), (torch.randn(batch, 4, generator=_g(seed)),)


def stats1(seed=0):
    return stats(batch=5, seed=seed)


# --- sum of norms over a sharded dim (pytorch #172288) and norm of a Partial (pytorch #159856)
class NormSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))                     # column parallel: last dim sharded
        n1 = torch.linalg.vector_norm(h, dim=-1).sum()  # norm over the sharded dim, then sum
        y = self.b(h)                                   # row parallel: Partial
        return n1 + torch.linalg.vector_norm(y, ord=3, dim=-1).mean() + y.abs().amax()


def norm_sum(seed=0):
    torch.manual_seed(seed)
    return NormSum(), (torch.randn(6, 8, generator=_g(seed)),)


# --- a reduced Partial scaled by several scalars (pytorch #147180, #153603)
class ScaledSums(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x):
        s = self.b(torch.relu(self.a(x))).sum()
        m = self.b(torch.relu(self.a(x))).mean()
        return torch.stack([s * -5, s * 2, 3 * s, s / 7, m * -5, m * 2])


def scaled_sums(seed=0):
    torch.manual_seed(seed)
    return ScaledSums(), (torch.randn(6, 8, generator=_g(seed)),)


# --- softmax over a vocab-sharded contracting dim, then back through the tied weight (tt-xla #6075, PiPPy #440)
class SoftmaxTied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.q = nn.Linear(D, D)

    def forward(self, ids):
        h = self.q(self.emb(ids))
        p = torch.softmax(h @ self.emb.weight.t() * 4.0, dim=-1)   # (B, T, V), V sharded under tp
        lse = torch.logsumexp(h @ self.emb.weight.t(), dim=-1)
        return p @ self.emb.weight + lse.unsqueeze(-1)


def softmax_tied(seed=0):
    torch.manual_seed(seed)
    return SoftmaxTied(), (torch.randint(0, V, (3, 5), generator=_g(seed)),)


# --- argmax / max(dim) indices / topk / cumsum over a sharded dim (tt-mlir #8623, pytorch #173936, #168940,
# jax #19271, jax #21403)
class IndexReductions(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(D, V)
        self.emb = nn.Embedding(V, D)

    def forward(self, x):
        logits = self.head(x)                              # vocab sharded under tp
        idx = logits.argmax(-1)
        vals, idx2 = logits.max(dim=-1)
        top = logits.topk(3, dim=-1)
        cs = torch.cumsum(logits, dim=-1)[..., -5:]
        return self.emb(idx) + self.emb(idx2) + vals.unsqueeze(-1) + top.values.sum(-1, keepdim=True) \
            + self.emb(top.indices).sum(-2) + cs.sum(-1, keepdim=True)


def index_reductions(seed=0):
    torch.manual_seed(seed)
    return IndexReductions(), (torch.randn(3, 5, D, generator=_g(seed)),)


# --- a view merging / splitting a sharded dim (pytorch #179502)
class ShardedView(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 8)
        self.b = nn.Linear(6, 4)

    def forward(self, x):  # x (12, 5)
        h = self.a(x)            # (12, 8): columns sharded under tp
        return self.b(h.view(16, 6)).view(-1, 8)


def sharded_view(seed=0):
    torch.manual_seed(seed)
    return ShardedView(), (torch.randn(12, 5, generator=_g(seed)),)


# --- binary ops on two tensors whose uneven shards could be cut differently (physicsnemo #1943)
class MisalignedRows(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):  # batch 3
        shifted = torch.cat([x[1:], x[:1]])   # the batch rolled by one
        return self.a(x) * self.b(shifted) + torch.flip(self.a(x), [0])


def misaligned_rows(seed=0):
    torch.manual_seed(seed)
    return MisalignedRows(), (torch.randn(3, 4, generator=_g(seed)),)


# --- padding_idx on a vocab-sharded embedding (torchtitan #4637)
class PaddedEmb(nn.Module):
    def __init__(self, pad=30):
        super().__init__()
        self.emb = nn.Embedding(V, D, padding_idx=pad)
        self.out = nn.Linear(D, 3)

    def forward(self, ids):
        return self.out(self.emb(ids))


def padded_emb(seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, V, (4, 6), generator=_g(seed))
    ids[:, 0] = 30  # the padding row is used
    ids[1, 2] = 2
    return PaddedEmb(), (ids,)


def padded_emb_low(seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, V, (4, 6), generator=_g(seed))
    ids[:, 0] = 1
    m = PaddedEmb(pad=1)
    return m, (ids,)


# --- norms and biases on sequence-sharded activations: their gradients must be summed over the sequence
# shards (Megatron-LM #1446, TransformerEngine #435, gpt-neox #1259, Paddle #59057)
class SeqNormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.RMSNorm(D)
        self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.scale = nn.Parameter(torch.ones(D) * 0.5)

    def forward(self, x):  # (B, T, D)
        h = x + self.down(torch.relu(self.up(self.ln1(x))))
        return self.ln2(h) * self.scale


def seq_norm_block(seed=0):
    torch.manual_seed(seed)
    return SeqNormBlock(), (torch.randn(2, 6, D, generator=_g(seed)),)


# --- a row-parallel linear WITH bias (torchtitan #4332) and a conv bias under data parallel (ColossalAI #1663)
class RowBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8, bias=True)
        self.conv = nn.Conv1d(8, 8, 3, padding=1, bias=True)

    def forward(self, x):  # (B, T, 8)
        h = self.down(torch.relu(self.up(x)))
        return self.conv(h.transpose(1, 2)).transpose(1, 2) + h


def row_bias(seed=0):
    torch.manual_seed(seed)
    return RowBias(), (torch.randn(3, 5, 8, generator=_g(seed)),)


# --- a masked token-mean loss whose count differs per rank (verl #5625, Megatron-LM #673, open-instruct #1736)
class TokenMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, D), nn.Linear(D, V)

    def forward(self, ids, labels, mask):
        logits = self.head(self.emb(ids))
        per_tok = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # (B, T)
        return (per_tok * mask).sum() / mask.sum()


def token_mean(seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, V, (4, 6), generator=_g(seed))
    labels = torch.randint(0, V, (4, 6), generator=_g(seed + 1))
    mask = torch.zeros(4, 6)
    mask[0, :6] = 1   # rows hold 6, 1, 0, 3 tokens: every split of the batch has its own count
    mask[1, :1] = 1
    mask[3, 2:5] = 1
    return TokenMean(), (ids, labels, mask)


# --- sum-reduced loss (no mean) on pipelines: no /num_microbatches may be applied (AReaL #1273)
class SumLossStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
        self.head = nn.Linear(8, 5)

    def forward(self, x, labels):
        for layer in self.layers:
            x = torch.relu(layer(x)) + x
        return F.cross_entropy(self.head(x), labels, reduction="sum")


def sum_loss_stack(seed=0):
    torch.manual_seed(seed)
    return SumLossStack(), (torch.randn(8, 8, generator=_g(seed)), torch.randint(0, 5, (8,), generator=_g(seed + 1)))


# --- tied embedding and head on a pipeline with data parallel (Megatron-LM #844)
class TiedStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.layers = nn.ModuleList([nn.Linear(D, D) for _ in range(4)])

    def forward(self, ids, labels):
        h = self.emb(ids)
        for layer in self.layers:
            h = torch.tanh(layer(h)) + h
        return F.cross_entropy((h @ self.emb.weight.t()).flatten(0, 1), labels.flatten())


def tied_stack(seed=0):
    torch.manual_seed(seed)
    return TiedStack(), (torch.randint(0, V, (8, 3), generator=_g(seed)), torch.randint(0, V, (8, 3), generator=_g(seed + 1)))


# --- MoE load-balancing losses: sequence-wise and batch-wise statistics (Megatron-LM #5996, #1406,
# torchtitan #3000, megablocks #85)
class RouterAux(nn.Module):
    def __init__(self, experts=4):
        super().__init__()
        self.gate = nn.Linear(D, experts)
        self.w1 = nn.Parameter(torch.randn(experts, D, 2 * D) * D ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, 2 * D, D) * (2 * D) ** -0.5)
        self.E = experts

    def forward(self, x):  # (B, T, D)
        probs = torch.softmax(self.gate(x), -1)                      # (B, T, E)
        top = probs.argmax(-1)                                       # (B, T)
        onehot = F.one_hot(top, self.E).float()
        seq_aux = ((onehot.mean(1) * probs.mean(1)).sum(-1)).mean() * self.E     # per sequence
        batch_aux = (onehot.mean((0, 1)) * probs.mean((0, 1))).sum() * self.E    # over the batch
        h = torch.relu(torch.einsum("btd,edh->bteh", x, self.w1))
        y = torch.einsum("bteh,ehd->bted", h, self.w2)
        out = torch.einsum("bted,bte->btd", y, probs * onehot)
        return out.pow(2).mean() + 0.1 * seq_aux + 0.1 * batch_aux


def router_aux(seed=0):
    torch.manual_seed(seed)
    return RouterAux(), (torch.randn(3, 5, D, generator=_g(seed)),)


# --- BatchNorm on an uneven batch: running statistics need the global count (pytorch #22192)
class BNUneven(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.o = nn.Linear(8, 2)

    def forward(self, x):
        return self.o(torch.relu(self.bn(self.l(x))))


def bn_uneven(seed=0):
    torch.manual_seed(seed)
    return BNUneven(), (torch.randn(5, 6, generator=_g(seed)) * 3 + 1,)


# --- a full state dict of unevenly sharded weights (pytorch #144109, #110762, #103306)
class UnevenWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, 7)
        self.l = nn.Linear(7, 5)

    def forward(self, ids):
        return self.l(self.emb(ids))


def uneven_weights(seed=0):
    torch.manual_seed(seed)
    return UnevenWeights(), (torch.randint(0, V, (5, 3), generator=_g(seed)),)


# --- replicated parameters whose values feed max/min (weight decay and clipping on shards:
# pytorch #170862, torchrec #3199): used in the SGD + clipping loop
class ClipModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.up, self.down = nn.Linear(D, 3 * D), nn.Linear(3 * D, D)
        self.ln = nn.LayerNorm(D)

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = self.ln(h + self.down(torch.relu(self.up(h))))
        return F.cross_entropy((h @ self.emb.weight.t()).flatten(0, 1), labels.flatten()) * 3.0


def clip_model(seed=0):
    torch.manual_seed(seed)
    return ClipModel(), (torch.randint(0, V, (4, 5), generator=_g(seed)), torch.randint(0, V, (4, 5), generator=_g(seed + 1)))


# --- dropout on a value replicated over tp under dp x tp: masks agree on replicas (PaddleFleetX #1005,
# tt-metal #55947, Megatron-LM #1256)
class DropRep(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(self.down(torch.relu(self.up(x))))   # row-parallel output (replicated over tp) dropped
        return self.up(h).pow(2).mean()


def drop_rep(seed=0):
    torch.manual_seed(seed)
    return DropRep(), (torch.randn(4, 3, D, generator=_g(seed)),)


# --- cross entropy with class weights and ignore_index over a sharded batch (pytorch #162692's class:
# the mean's denominator is a weighted global count)
class WeightedCE(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(6, 5)
        self.register_buffer("w", torch.tensor([0.2, 1.0, 3.0, 0.5, 2.0]))

    def forward(self, x, y):
        return F.cross_entropy(self.l(x), y, weight=self.w, ignore_index=4) + F.nll_loss(
            F.log_softmax(self.l(x), -1), y, weight=self.w)


def weighted_ce(seed=0):
    torch.manual_seed(seed)
    y = torch.tensor([4, 4, 4, 1, 2])   # the first rank's rows all ignored on dp=2
    return WeightedCE(), (torch.randn(5, 6, generator=_g(seed)), y)
