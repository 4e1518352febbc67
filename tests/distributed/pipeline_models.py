"""Models behind pipeline findings of round 10 (e) (outside models on pipeline plans), importable by spawned
ranks. Each builder takes the GLOBAL batch and returns (model, args); seeded, so every rank builds the same
weights (`runtime.pipeline_rehearsal._rank_main` calls it after `torch.manual_seed(0)`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH = 64, 16


class ViewOutBlock(nn.Module):
    """OPT's decoder layer in small: the hidden states are flattened to (B*T, d) for the MLP and the block
    returns `.view(B, T, d)` of the sum: its output, and so the stage output a cut after it sends, is a
    contiguous VIEW."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):  # (B, T, d)
        shape = x.shape
        h = x.reshape(-1, shape[-1])  # (B*T, d)
        h = h + self.fc2(F.gelu(self.fc1(self.ln(h))))
        return h.view(shape)


class ViewOutLM(nn.Module):
    """Embedding -> 4 ViewOutBlocks -> head -> mean cross-entropy over the labels that are not -100."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(ViewOutBlock() for _ in range(4))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids, labels):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def view_out_lm(batch: int = 8, seq_len: int = 6):
    """(ViewOutLM, (ids (batch, seq_len), labels with -100 in every third row's first half))."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (batch, seq_len), generator=g)
    labels = ids.clone()
    labels[::3, : seq_len // 2] = -100
    return ViewOutLM(), (ids, labels)


class _BNBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.bn = nn.BatchNorm1d(WIDTH)

    def forward(self, x):  # (B, d)
        return x + F.relu(self.bn(self.fc(x)))


class BNStack(nn.Module):
    """Linear -> 4 x (Linear, BatchNorm1d over (batch, features), ReLU, residual) -> Linear -> cross-entropy:
    trained, BatchNorm1d refuses a batch of one sample ("Expected more than 1 value per channel")."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, WIDTH)
        self.blocks = nn.ModuleList(_BNBlock() for _ in range(4))
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h), y)


def bn_stack(batch: int = 8):
    """`--model pipeline_models:bn_stack`: (BNStack, (x (batch, 6), y (batch,)))."""
    g = torch.Generator().manual_seed(5)
    return BNStack(), (torch.randn(batch, 6, generator=g), torch.arange(batch) % 3)


def bn_step_rank(rank: int, world_size: int) -> dict:
    """`auto_parallelize(BNStack, mesh {"pp": 4}, microbatches=4)` + one `pm.step` (its own loss), warnings caught
    (`MicrobatchWarning`, rank 0); the step's loss against eager accumulation over the same 4 microbatches (what a
    pipeline computes) and the whole batch at once (one device)."""
    import copy
    import warnings

    import parallelizer

    torch.manual_seed(0)
    model, (x, y) = bn_stack(batch=8)
    reference, whole = copy.deepcopy(model), copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = parallelizer.auto_parallelize(model, (x, y), mesh={"pp": 4}, microbatches=4, cluster="h100:1x4")
        loss = pm.step(x, y).item()
    accumulated = sum(reference(x[j:j + 2], y[j:j + 2]).item() / 4 for j in range(0, 8, 2))
    return {"loss": loss, "accumulated": accumulated, "whole": whole(x, y).item(),
            "warned": [str(w.message) for w in caught if issubclass(w.category, parallelizer.MicrobatchWarning)]}


class DropConnectStack(nn.Module):
    """(B, T, 8) -> (B, T, 4): 4 residual blocks whose `down` weight goes through dropout(0.3) (DropConnect,
    AWD-LSTM's WeightDrop: a random op on a replicated parameter under ddp), then a head."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleDict({"up": nn.Linear(8, 16), "down": nn.Linear(16, 8)}) for _ in range(4))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for b in self.blocks:
            x = x + F.linear(torch.relu(b["up"](x)), F.dropout(b["down"].weight, 0.3, self.training), b["down"].bias)
        return self.head(x)


def generator_seeds_rank(rank: int, world_size: int) -> dict:
    """`auto_parallelize(DropConnectStack, mesh {"pp": 2, "dp": 2}, ddp)` + 2 `pm.step`s + SGD with torch's
    generator seeded per rank (`5 + rank`: the dp replicas of a stage would mask one weight differently) and per pp
    rank (`5 + 100 * pp rank`, Megatron-LM's `_set_random_seed`: the ranks of one stage alike): the outcome, and
    this rank's parameters after the steps."""
    import parallelizer

    out = {}
    torch.manual_seed(0)
    x, y = torch.randn(4, 6, 8), torch.randn(4, 6, 4)
    pm = parallelizer.auto_parallelize(DropConnectStack(), (x,), mesh={"pp": 2, "dp": 2}, axis_roles={"dp": "ddp"},
                                       microbatches=2, schedule="1f1b")
    opt = torch.optim.SGD(pm.parameters(), lr=0.5)
    for seeds, seed in (("per rank", 5 + rank), ("per pp rank", 5 + 100 * (rank // 2))):
        pm.__dict__["_input_checks"] = 0  # each seeding within the module's first (checked) calls
        torch.manual_seed(seed)
        try:
            for _ in range(2):
                pm.step(x, target=y, loss_fn=F.mse_loss)
                opt.step()
                opt.zero_grad()
            out[seeds] = {n: p.detach().clone() for n, p in pm.named_parameters()}
        except Exception as exc:  # noqa: BLE001 - the outcome is the result (raised alike on every rank)
            out[seeds] = f"{type(exc).__name__}: {exc}"
    return out
