"""Rank bodies for test_count_losses: models whose own loss is normalised by a count of the batch's items
(`(tok * m).sum() / count_nonzero(m)`, a ratio of means `(tok * m).mean() / m.float().mean()`, cross-entropy with
ignore_index plus a z-loss masked by `labels != -100`), trained with `pm.step(ids, labels, mask)` (loss_fn=None)
on every kind of plan against the eager model on one device, the whole batch at once (importable by name in
spawned ranks). Round 24 (r24f): the three were refused on every pipeline (StepError) although they add up over
microbatches."""
from __future__ import annotations

import contextlib
import copy
import io
import math

import torch
import torch.nn.functional as F

import parallelizer
from step_workers import _diff, _stages

V, D, BATCH, SEQ = 32, 16, 8, 6
KINDS = ("count_nonzero", "ratio_of_means", "zloss")


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(D, D)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class CountLoss(torch.nn.Module):
    """Embedding, 4 residual tanh blocks, head; its own loss, a mean over the counted tokens (`kind`, one of
    `KINDS`): per-token cross-entropy times the mask over count_nonzero(mask); the same as a ratio of two means
    over the same (B, T) elements; or cross-entropy ignoring -100 plus 1e-2 x the mean squared log-partition
    (PaLM's z-loss) over the same labels."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.emb, self.head = torch.nn.Embedding(V, D), torch.nn.Linear(D, V)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(4))

    def forward(self, ids, labels, mask):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)  # (B, T, V)
        if self.kind == "zloss":
            ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            valid = (labels != -100).float()
            return ce + 1e-2 * (torch.logsumexp(logits, -1).pow(2) * valid).sum() / valid.sum()
        tok = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none").view_as(mask)
        if self.kind == "count_nonzero":
            return (tok * mask).sum() / torch.count_nonzero(mask)
        return (tok * mask).mean() / mask.float().mean()  # "ratio_of_means"


def count_batch(empty: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, labels, mask) of (BATCH, SEQ): rows of uneven lengths (mask 1 on a row's first 1..SEQ tokens, labels
    -100 after them); with `empty`, the first `empty` rows count no token (mask 0, labels -100)."""
    g = torch.Generator().manual_seed(seed)
    ids, labels = torch.randint(0, V, (BATCH, SEQ), generator=g), torch.randint(0, V, (BATCH, SEQ), generator=g)
    lengths = torch.randint(1, SEQ + 1, (BATCH,), generator=g)
    mask = (torch.arange(SEQ)[None] < lengths[:, None]).float()
    mask[:empty] = 0
    labels[mask == 0] = -100
    return ids, labels, mask


def _nonfinite(pm) -> int:
    """Non-finite gradient entries this rank holds (a NaN on both sides reads as equal in `_max_diff`)."""
    return sum(int((~p.grad.isfinite()).sum()) for s in _stages(pm) for p in s.parameters() if p.grad is not None)


def count_loss_train(rank: int, world_size: int, cases: dict, steps: int = 2) -> dict:
    """For each case (name -> (mesh, plan options, kinds, empty rows, accumulate)) and each kind: `steps` AdamW
    steps of `pm.step(ids, labels, mask)` against the eager `CountLoss(kind)` on the whole batch; with accumulate,
    every step is gradient accumulation in the step API (`pm.step(..., loss_fn=lambda out, _: out / 2)` on two
    batches, the second with `empty` rows counting nothing, then one optimizer step), as the eager model does it.
    Returns per "case/kind": the largest differences of loss (every step), gradients (every step) and parameters
    (after the steps), the largest |reference loss|, non-finite gradient entries, and the plan's schedule."""
    report = {}
    for name, (mesh, options, kinds, empty, accumulate) in cases.items():
        for kind in kinds:
            torch.manual_seed(0)
            model = CountLoss(kind)
            reference = copy.deepcopy(model)
            batches = [count_batch(empty, seed=1)] if not accumulate else [count_batch(0, 2), count_batch(empty, 3)]
            with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
                pm = parallelizer.auto_parallelize(model, batches[0], mesh=mesh, **options)
            opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (pm, reference))
            worst = {"loss": 0.0, "grad": 0.0, "ref_abs": 0.0, "nonfinite": 0}
            for _ in range(steps):
                loss = ref_loss = 0.0
                for b in batches:
                    scale = len(batches)
                    loss += float(pm.step(*b, loss_fn=(lambda out, _: out / scale) if accumulate else None))
                    r = reference(*b) / scale
                    r.backward()
                    ref_loss += float(r.detach())
                worst["loss"] = max(worst["loss"], abs(loss - ref_loss) if math.isfinite(loss) else math.inf)
                worst["ref_abs"] = max(worst["ref_abs"], abs(ref_loss))
                worst["grad"] = max(worst["grad"], _diff(pm, reference, grads=True))
                worst["nonfinite"] += _nonfinite(pm)
                opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
            worst["params"] = _diff(pm, reference, grads=False)
            worst["schedule"] = pm.plan.pipeline.schedule if pm.plan.pipeline is not None else None
            report[f"{name}/{kind}"] = worst
    return report
