"""The models behind issue 11's wrong numbers (one per pattern class), importable by spawned ranks.

Each builder returns (model, example_inputs); seeded, so every rank builds the same weights and inputs.
"""
from __future__ import annotations

import torch
from torch import nn


class SumPlusConstant(nn.Module):
    """x.sum() + c: a Partial sum must be reduced before a constant is added (once, not once per rank)."""

    def __init__(self, c: float) -> None:
        super().__init__()
        self.c = c

    def forward(self, x):
        return x.sum() + self.c


def sum_plus(c: float = 10.0):
    return SumPlusConstant(c), (torch.arange(10.0).reshape(10, 1),)


class RowParallelPlusConstant(nn.Module):
    """down(relu(up(x))) + 0.5 with the down projection row parallel under tp (its output Partial)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + 0.5


def row_parallel_plus(seed: int = 0):
    torch.manual_seed(seed)
    return RowParallelPlusConstant(), (torch.randn(6, 8, generator=torch.Generator().manual_seed(seed)),)


class NarrowCast(nn.Module):
    """Linear(2,4) -> ReLU -> Linear(4,2) -> bf16 -> fp32 -> Linear(2,2): the bf16 rounding must see the
    reduced sum, not each rank's partial sum."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(2, 4), nn.Linear(4, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.c(self.b(torch.relu(self.a(x))).to(torch.bfloat16).float())


def narrow_cast(seed: int = 0):
    torch.manual_seed(seed)
    return NarrowCast(), (torch.randn(1, 2, generator=torch.Generator().manual_seed(seed)) * 3,)


class CausalScores(nn.Module):
    """scores = (q @ k^T).tril(): tril reads global row/column indices."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):  # (B, T, C)
        scores = (self.q(x) @ self.k(x).transpose(-1, -2)).tril()   # (B, T, T)
        return scores @ self.v(x)


def causal_scores(dim: int = 8, seq: int = 7, seed: int = 0, device: str = "cpu"):
    torch.manual_seed(seed)
    with torch.device(device):
        model = CausalScores(dim)
    return model, (torch.randn(3, seq, dim, generator=torch.Generator().manual_seed(seed)).to(device),)


class ZerosLikePlus(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        h = self.l(x)
        return torch.zeros_like(h) + h


def zeros_like_plus(seed: int = 0):
    torch.manual_seed(seed)
    return ZerosLikePlus(), (torch.randn(8, 8, generator=torch.Generator().manual_seed(seed)),)


class EncoderLM(nn.Module):
    """Embedding + nn.TransformerEncoderLayer (batch_first=False: it treats dim 1 as the batch) + CE."""

    def __init__(self, vocab: int = 23, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.0)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids, labels):
        logits = self.head(self.layer(self.emb(ids)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def encoder_lm(batch: int = 8, seq: int = 6, seed: int = 0):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    return EncoderLM(), (torch.randint(0, 23, (batch, seq), generator=gen), torch.randint(0, 23, (batch, seq), generator=gen))


class SmallResNet(nn.Module):
    """conv -> BN -> ReLU -> [conv -> BN -> ReLU -> conv -> BN] + residual -> ReLU -> avg pool -> linear."""

    def __init__(self, width: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.c1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(width)
        self.c2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(width)
        self.head = nn.Linear(width, classes)

    def forward(self, img, labels):
        h = self.stem(img)
        h = torch.relu(h + self.b2(self.c2(torch.relu(self.b1(self.c1(h))))))
        logits = self.head(nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))
        return nn.functional.cross_entropy(logits, labels)


def small_resnet(batch: int = 6, seed: int = 0):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    return SmallResNet(), (torch.randn(batch, 3, 8, 8, generator=gen), torch.randint(0, 5, (batch,), generator=gen))


class EinsumMoE(nn.Module):
    """A dense mixture of experts written with einsum: per-token gates over E experts, expert weights
    (E, C, H) and (E, H, C)."""

    def __init__(self, dim: int = 8, hidden: int = 12, experts: int = 4) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) * dim ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) * hidden ** -0.5)

    def forward(self, x):  # (B, T, C)
        g = self.gate(x).softmax(-1)                                     # (B, T, E)
        h = torch.relu(torch.einsum("btc,ech->bteh", x, self.w1))       # (B, T, E, H)
        y = torch.einsum("bteh,ehc->btec", h, self.w2)                   # (B, T, E, C)
        return torch.einsum("btec,bte->btc", y, g)


def einsum_moe(seed: int = 0):
    torch.manual_seed(seed)
    return EinsumMoE(), (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(seed)),)


class OddWidth(nn.Module):
    """An MLP of hidden size 62 (no dim divides by 4) and an Embedding(101, 29)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(101, 29)
        self.up = nn.Linear(29, 62)
        self.down = nn.Linear(62, 29)

    def forward(self, ids):
        return self.down(torch.relu(self.up(self.emb(ids))))


def odd_width(seed: int = 0):
    torch.manual_seed(seed)
    return OddWidth(), (torch.randint(0, 101, (10, 3), generator=torch.Generator().manual_seed(seed)),)


# --- round 9 (public reports of other auto-parallel systems' silent wrong numbers; trial/r9b_*) ---------------

class RefactoredView(nn.Module):
    """(12, 5) -> Linear -> (12, 8) -> view(16, 6) -> Linear -> view(-1, 8): a view whose sharded dim maps to one
    of another size that is neither a multiple nor a divisor of it (12 rows of 8 -> 16 rows of 6, 4/3 rows per
    row), pytorch#179502 (https://github.com/pytorch/pytorch/issues/179502): DTensor's view of a dim-1 shard gave
    wrong numbers; ours crashed on every rank under ddp ("shape '[6, 6]' is invalid for input of size 48"):
    the re-cut of the rows assumed an integer ratio (16 // 12 = 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 8)
        self.b = nn.Linear(6, 4)

    def forward(self, x):
        return self.b(self.a(x).view(16, 6)).view(-1, 8)


def refactored_view(seed: int = 0):
    torch.manual_seed(seed)
    return RefactoredView(), (torch.randn(12, 5, generator=torch.Generator().manual_seed(seed)),)


class TiedVocabCE(nn.Module):
    """Embedding(37, 16) -> tanh(Linear) -> logits through the tied embedding -> cross-entropy: under tp the
    vocabulary (37: uneven over 2 or 4 ranks) is sharded, so the lookup and the loss index a sharded dim."""

    def __init__(self, vocab: int = 37, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim)

    def forward(self, ids, labels):
        logits = torch.tanh(self.mid(self.emb(ids))) @ self.emb.weight.t()
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def tied_vocab_ce(vocab: int = 37, dim: int = 16, seed: int = 0, device: str = "cpu"):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab, (4, 5), generator=gen)
    labels[0, :2] = -100
    with torch.device(device):
        model = TiedVocabCE(vocab, dim)
    return model, (torch.randint(0, vocab, (4, 5), generator=gen).to(device), labels.to(device))


def out_of_range_indices(rank: int, world_size: int, spec) -> dict:
    """The sharded program and the eager model on valid inputs (labels -100 included: the loss) and on a
    label / an id outside the vocabulary (the exception's class name, or the value returned)."""
    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.runtime import create_groups
    from parallelizer.runtime.module import ParallelModule
    from parallelizer.tracer.trace import trace

    model, (ids, labels) = tied_vocab_ce()
    pm = ParallelModule(trace(model, (ids, labels)), spec, rank, model)
    create_groups(all_axis_groups(spec.mesh))
    out = {"valid": (pm(ids, labels).item(), model(ids, labels).item())}
    for name, bad_ids, bad_labels in (("label_high", ids, labels.clone().index_fill_(1, torch.tensor([3]), 40)),
                                      ("label_negative", ids, labels.clone().index_fill_(1, torch.tensor([3]), -5)),
                                      ("id_high", ids.clone().index_fill_(1, torch.tensor([3]), 37), labels)):
        got = []
        for m in (pm, model):
            try:
                got.append(f"returned {m(bad_ids, bad_labels).item():.4f}")
            except Exception as e:  # noqa: BLE001
                got.append(type(e).__name__)
        out[name] = tuple(got)
    return out


class MixingBlock(nn.Module):
    """LayerNorm -> Linear residual block; kind "center" subtracts the batch mean in the block's own code, "bn"
    normalises with BatchNorm1d over (batch, time), "plain" is per sample."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.norm, self.a, self.bn = nn.LayerNorm(6), nn.Linear(6, 6), nn.BatchNorm1d(6)

    def forward(self, x):
        h = self.norm(x)
        if self.kind == "center":
            h = h - h.mean(0, keepdim=True)
        elif self.kind == "bn":
            h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        return x + self.a(h)


class MixingNet(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.blocks = nn.ModuleList(MixingBlock(kind) for _ in range(4))
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        if self.kind in ("contrastive", "embeddings"):
            z = torch.nn.functional.normalize(self.head(x).mean(1), dim=-1)
            return in_batch_loss(z) if self.kind == "contrastive" else z  # CLIP's loss in the model, or outside
        return self.head(x).pow(2).mean()


def in_batch_loss(z, target=None):
    """CLIP's form: logits over the batch, cross-entropy against the diagonal (mixes the samples)."""
    return torch.nn.functional.cross_entropy(z @ z.t() * 5.0, torch.arange(z.shape[0]))


def mixing_net(kind: str):
    torch.manual_seed(0)
    return MixingNet(kind), (torch.randn(8, 5, 6, generator=torch.Generator().manual_seed(1)),)


def microbatch_mixing_step(rank: int, world_size: int, kinds: tuple[str, ...]) -> dict:
    """auto_parallelize on pp=2 x dp=2 (2 microbatches) and one pm.step per kind: the MicrobatchWarnings this rank
    saw (the module named), the step's loss, and one device's loss on the whole batch and accumulated over the
    same 2 microbatches (computed here on a copy, independently of the pipeline)."""
    import copy
    import warnings

    import parallelizer

    out = {}
    for kind in kinds:
        model, (x,) = mixing_net(kind)
        ref = copy.deepcopy(model)
        fn = in_batch_loss if kind == "embeddings" else None  # the loss outside the model: pm.step's loss_fn
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pm = parallelizer.auto_parallelize(model, (x,), mesh={"pp": 2, "dp": 2}, microbatches=2, schedule="1f1b")
            step = pm.step(x, loss_fn=fn).item()
        one = (lambda *a: in_batch_loss(ref(*a))) if fn else ref
        with torch.no_grad():
            whole = one(*copy.deepcopy((x,))).item() if fn else copy.deepcopy(ref)(x).item()
            accumulated = sum(one(p).item() for p in x.tensor_split(2)) / 2
        out[kind] = {"warned": [w.message.where for w in caught if isinstance(w.message, parallelizer.MicrobatchWarning)],
                     "step": step, "whole": whole, "accumulated": accumulated}
    return out
