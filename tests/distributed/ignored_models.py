"""Models whose loss gives a value crossing a pipeline stage boundary NO gradient, and the rank body that trains them
under a plan beside one device (tests/distributed/test_ignored_grads.py; importable by spawned ranks).

`SideLM(use)`: embedding -> 4 `GatedBlock`s -> head; it returns (logits (B, T, V), aux (B, T)), where `aux` is made
on stage 0 by `side` (a Linear on the embedding) and read by nothing else. Each block hands its gate scores s (B, T)
to the next one, which scales its update by sigmoid(s): differentiably ("grad"), or only through `s.detach()`
("detach") or under `torch.no_grad()` ("no_grad"), so that one device leaves every block's `gate` without gradient;
"tied" also adds `side_out(h)` of the last block's output to aux, its weight tied to `side.weight` (a copy on the first
and on the last stage, summed over stages).

The losses (`LOSSES`, `loss_fn(output, target)`): "logits" reads the logits alone, so one device leaves `side`
without gradient; "both" reads aux too; "branch" adds aux's mean square only when the microbatch's target holds
token 0 (a Python branch on data: one device accumulating over the same microbatches gives `side` a gradient exactly
when some microbatch took the branch); "own" is `pm.step(ids, labels)` of the model given labels, which returns
(its cross-entropy, aux): the step reads the model's own loss alone. A pipeline stage that gets no gradient for a received value sends a zero
gradient back (torch's `PipelineStage`, our bitpipe runner), and the sender back-propagates zeros into `side` /
the gates: AdamW(weight_decay=0.1) and SGD(momentum=0.9, weight_decay=0.1) then move parameters one device leaves.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from unreached_models import OPTIMIZERS, beside_eager

VOCAB, WIDTH, SEQ, BATCH = 16, 8, 4, 8


class GatedBlock(nn.Module):
    def __init__(self, use: str) -> None:
        super().__init__()
        self.use = use
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.gate = nn.Linear(WIDTH, 1)

    def forward(self, h, s):  # h (B, T, d); s (B, T): the previous block's gate scores
        h = h + torch.tanh(self.fc(h)) * gate_weight(s, self.use)
        return h, self.gate(h).squeeze(-1)  # (B, T, d), (B, T)


def gate_weight(s: torch.Tensor, use: str) -> torch.Tensor:
    """sigmoid(s) (B, T, 1), differentiable in s ("grad") or not ("detach", "no_grad")."""
    if use == "detach":
        return torch.sigmoid(s.detach())[..., None]
    if use == "no_grad":
        with torch.no_grad():
            return torch.sigmoid(s)[..., None]
    return torch.sigmoid(s)[..., None]


class SideLM(nn.Module):
    def __init__(self, use: str = "grad") -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.side = nn.Linear(WIDTH, 1)
        self.blocks = nn.ModuleList(GatedBlock(use) for _ in range(4))
        self.head = nn.Linear(WIDTH, VOCAB)
        if use == "tied":  # a second read of side.weight on the last stage, also for aux only: two tied copies
            self.side_out = nn.Linear(WIDTH, 1)
            self.side_out.weight = self.side.weight

    def forward(self, ids, labels=None):
        h = self.emb(ids)  # (B, T, d)
        aux = self.side(h).squeeze(-1)  # (B, T): read by the "both" / "branch" losses only
        s = h.sum(-1)
        for block in self.blocks:
            h, s = block(h, s)
        logits = self.head(h * gate_weight(s, self.blocks[0].use))  # (B, T, V)
        if hasattr(self, "side_out"):
            aux = aux + self.side_out(h).squeeze(-1)
        if labels is not None:  # its own loss first: `pm.step(loss_fn=None)` reads that alone
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten()), aux
        return logits, aux


def _logits(out, y):
    return F.cross_entropy(out[0].flatten(0, 1), y.flatten())


def _both(out, y):
    return _logits(out, y) + out[1].pow(2).mean()


def _branch(out, y):
    return _logits(out, y) + (out[1].pow(2).mean() if bool((y == 0).any()) else 0.0)


LOSSES = {"logits": _logits, "both": _both, "branch": _branch, "own": lambda out, y: out[0]}


def token_count(target) -> int:
    """The step's item_count: every microbatch counts its tokens (equal-sized microbatches weigh 1 / m)."""
    return target.numel()


def side_lm(use: str = "grad", zeros_in: tuple[int, ...] = (), microbatches: int = 2):
    """(SideLM(use) seeded, ids (BATCH, SEQ), labels (BATCH, SEQ) in 1..VOCAB-1 but for a 0 at the first token of
    microbatch j's first row for each j in `zeros_in`: the "branch" loss reads aux on those microbatches only)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    labels = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
    for j in zeros_in:
        labels[j * BATCH // microbatches, 0] = 0
    return SideLM(use), ids, labels


def side_lm_args(batch: int = BATCH):
    """(SideLM("grad") seeded, (ids (batch, SEQ),)): a builder for `rehearse_pipeline`."""
    model, ids, _ = side_lm()
    return model, (ids[:batch] if batch <= BATCH else ids.repeat(batch // BATCH + 1, 1)[:batch],)


def train_beside_eager(rank: int, world_size: int, mesh: dict, options: dict, optimizer: str, use: str, loss: str,
                       zeros_in: tuple[int, ...] = (), steps: int = 3) -> dict:
    """`steps` steps of `auto_parallelize(SideLM(use))` under `mesh` with `pm.step(ids, target=labels,
    loss_fn=LOSSES[loss])`, and of one device accumulating the same loss over the same microbatches (each weighted
    1 / m, as the pipeline weighs equal-sized ones), each side with a fresh `OPTIMIZERS[optimizer]`: per step the
    parameters whose .grad is None (after backward, before the optimizer step), the parameters holding optimizer
    state after the steps, and the full parameters."""
    warnings.simplefilter("ignore")
    import parallelizer
    m = options.get("microbatches", 2)
    model, ids, labels = side_lm(use, zeros_in, m)
    reference = copy.deepcopy(model)
    own = loss == "own"  # the model's own loss: labels are a model input, no loss_fn
    pm = parallelizer.auto_parallelize(model, (ids, labels) if own else (ids,), mesh=mesh, **options)
    opt, ref_opt = OPTIMIZERS[optimizer](list(pm.parameters())), OPTIMIZERS[optimizer](list(reference.parameters()))
    fn, none, ref_none = LOSSES[loss], [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        if own:
            pm.step(ids, labels)
        else:
            pm.step(ids, target=labels, loss_fn=fn, item_count=token_count)
        for x, y in zip(ids.tensor_split(m), labels.tensor_split(m)):
            (fn(reference(x, y) if own else reference(x), y) / m).backward()
        none.append(sorted({n for n, p in pm.named_parameters() if p.grad is None}))  # a rank may hold 2 tied copies
        ref_none.append(sorted(n for n, p in reference.named_parameters() if p.grad is None))
        opt.step()
        ref_opt.step()
    return beside_eager(pm, opt, none, reference, ref_opt, ref_none)
