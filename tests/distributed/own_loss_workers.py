"""Rank body for test_step's own-loss case: a model that computes its own shifted causal-LM loss (labels -100
unevenly spread) and whose blocks all read an expanded mask made before the first block (a non-contiguous
value crossing the stage boundary, as ViT's expanded attention mask) and hand on a transposed view, trained with `pm.step(ids, labels=labels)` (loss_fn=None) on a pipeline
plan, against the single-device model (importable by name in spawned ranks)."""
from __future__ import annotations

import contextlib
import copy
import io

import torch
import torch.nn.functional as F

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import stage_diffs
from parallelizer.runtime.step import StepError
from step_workers import padded_labels

V, D, BATCH, SEQ = 64, 16, 8, 16


class TransposedBlock(torch.nn.Module):
    """Works in (T, B, D) and returns a (B, T, D) transposed view; halves the entries where `keep` (B, T, D) is
    False."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(D, D)

    def forward(self, x, keep):
        y = (x.transpose(0, 1) + torch.tanh(self.fc(x.transpose(0, 1)))).transpose(0, 1)
        return torch.where(keep, y, 0.5 * y)


class OwnLoss(torch.nn.Module):
    """Embedding, 4 `TransposedBlock`s, head; its own loss: transformers' shifted causal-LM cross-entropy, or with
    `loss="kl_batchmean"` a KL divergence to the one-hot labels with reduction="batchmean" (a sum divided by the
    batch size, which export bakes in as a number)."""

    def __init__(self, loss: str = "ce") -> None:
        super().__init__()
        self.loss = loss
        self.emb, self.head = torch.nn.Embedding(V, D), torch.nn.Linear(D, V)
        self.blocks = torch.nn.ModuleList(TransposedBlock() for _ in range(4))

    def forward(self, ids, labels):
        x = self.emb(ids)
        keep = (ids % 3 != 0).unsqueeze(-1).expand(-1, -1, D)  # a stride-0 view: not contiguous
        for b in self.blocks:
            x = b(x, keep)
        if self.loss == "kl_batchmean":
            target = F.one_hot(labels.clamp(min=0), V).float() * 0.9 + 0.1 / V
            return F.kl_div(self.head(x).log_softmax(-1), target, reduction="batchmean")
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(self.head(x).flatten(0, 1), shifted.flatten())


def own_loss_train(rank: int, world_size: int, mesh: dict, steps: int = 2, loss: str = "ce",
                   microbatches: int = 2) -> dict:
    """`steps` AdamW steps of `pm.step(ids, labels=labels)` and of the single-device model (`OwnLoss(loss)`): the
    largest loss, gradient (every step) and parameter differences, how far a plain mean of the 2 microbatch means
    is from the batch loss, and the StepError of item_count= without target=."""
    torch.manual_seed(0)
    model = OwnLoss(loss)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, V, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = padded_labels(ids)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        pm = parallelizer.auto_parallelize(model, (ids, labels), mesh=mesh, schedule="1f1b",
                                           microbatches=microbatches)
    spec = spec_from_plan(pm.plan)
    opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (pm, reference))
    worst = {"loss": 0.0, "grad": 0.0, "ref_abs": 0.0}
    for _ in range(steps):
        loss = pm.step(ids, labels)
        ref_loss = reference(ids, labels)
        ref_loss.backward()
        worst["loss"] = max(worst["loss"], abs(loss.item() - ref_loss.item()))
        worst["ref_abs"] = max(worst["ref_abs"], abs(ref_loss.item()))
        worst["grad"] = max(worst["grad"], stage_diffs(pm.run, reference, spec, None, grads=True)[0])
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    worst["params"] = stage_diffs(pm.run, reference, spec, None, grads=False)[0]
    with torch.no_grad():
        halves = [reference(i, y) for i, y in zip(ids.tensor_split(2), labels.tensor_split(2))]
        worst["mean_of_means_off_by"] = abs(float(sum(halves) / 2 - reference(ids, labels)))
    try:
        pm.step(ids, labels, item_count=lambda y: (y != -100).sum())
    except StepError as e:
        worst["item_count_error"] = str(e)
    worst["schedule"] = pm.plan.pipeline.schedule
    return worst


def ignored_microbatch_train(rank: int, world_size: int, mesh: dict) -> dict:
    """One `pm.step(ids, labels)` (loss_fn=None) on a pipeline plan whose first microbatch has every label -100
    (its mean loss is 0/0 = NaN, its weight n_j / N = 0), against one device's loss of the whole batch (finite)
    and its gradients (ratio to the fp32 bound)."""
    torch.manual_seed(0)
    model = OwnLoss()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, V, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    labels = padded_labels(ids)
    labels[: BATCH // 2] = -100  # microbatch 0 of 2: nothing to count
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (ids, labels), mesh=mesh, schedule="gpipe", microbatches=2)
    spec = spec_from_plan(pm.plan)
    out = {}
    loss = pm.step(ids, labels)
    ref_loss = reference(ids, labels)
    ref_loss.backward()
    out["own_loss"], out["own_ref"] = loss.item(), ref_loss.item()
    out["own_grad"] = stage_diffs(pm.run, reference, spec, None, grads=True)[2]
    return out


def scaled_own_loss_train(rank: int, world_size: int, mesh: dict, steps: int = 2) -> dict:
    """`steps` AdamW steps of `pm.step(ids, labels=labels, loss_fn=lambda out, _: out / 2)` (no target: the usual
    gradient-accumulation idiom over a model's own loss) against the single-device model's loss / 2: the largest
    loss, gradient and parameter differences; then the StepError of a loss_fn that squares the own loss (not a
    constant multiple: no weighting of microbatch means gives one device's square). Round 18 (new-user trial):
    such a loss_fn was weighed 1/m per microbatch, silently: loss 2.7e-3 off one device."""
    torch.manual_seed(0)
    model = OwnLoss()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, V, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = padded_labels(ids)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        pm = parallelizer.auto_parallelize(model, (ids, labels), mesh=mesh, schedule="1f1b", microbatches=2)
    spec = spec_from_plan(pm.plan)
    opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (pm, reference))
    worst = {"loss": 0.0, "grad": 0.0}
    for _ in range(steps):
        loss = pm.step(ids, labels, loss_fn=lambda out, _: out / 2)
        ref_loss = reference(ids, labels) / 2
        ref_loss.backward()
        worst["loss"] = max(worst["loss"], abs(loss.item() - ref_loss.item()))
        worst["grad"] = max(worst["grad"], stage_diffs(pm.run, reference, spec, None, grads=True)[0])
        opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
    worst["params"] = stage_diffs(pm.run, reference, spec, None, grads=False)[0]
    try:
        pm.step(ids, labels, loss_fn=lambda out, _: out ** 2)
    except StepError as e:
        worst["squared_error"] = str(e)
    return worst
