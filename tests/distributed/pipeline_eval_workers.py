"""Rank bodies for test_pipeline_eval (importable by name in spawned ranks): a training loop that evaluates
between steps on a PipelineModule (`pm.eval()`, `pm(...)` under no_grad, `pm.train()`), against the
single-device model; a dropout + BatchNorm model's evaluation; the model root's settings set on the PipelineModule.
Every body returns plain numbers or strings; the tests compare them with torch.testing's default tolerances."""
from __future__ import annotations

import contextlib
import copy
import io

import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer import zoo
from parallelizer.errors import ModelAttributeError, PipelineError
from pipeline_models import WIDTH, _BNBlock



def _quiet_parallelize(model, args, **options):
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.auto_parallelize(model, args, **options)


def _close(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """'' when `actual` is within torch.testing's default tolerance of `expected` (its dtype's), else the message."""
    try:
        torch.testing.assert_close(actual.detach(), expected.detach())
        return ""
    except AssertionError as e:
        return str(e)


def _padded(ids: torch.Tensor, rows: tuple[int, ...], start: int) -> torch.Tensor:
    labels = ids.clone()
    labels[list(rows), start:] = -100
    return labels


def eval_between_steps(rank: int, world_size: int, mesh: dict, options: dict | None = None) -> dict:
    """GPT-2 (4 blocks, tied wte / lm_head, its own loss from labels=, padded with -100) on a pipeline plan of
    `mesh` (`options`: auto_parallelize's, e.g. a schedule): 2 AdamW steps, then `pm.eval()` and `pm(val_ids, labels=val_labels)` under no_grad on a held-out batch
    of 12 (3 microbatches of the traced 4, or 6 of 2, unevenly padded labels, so a plain mean of the microbatch means is not
    the batch loss), `pm.train()`, 3 more steps. Returns the failures ('' each when close) of: the eval loss and
    logits against the eager model's `model.eval()` under no_grad; the parameters after the 5 steps against
    eager's; whether the eval touched `.grad` or the optimizer state; the mean-of-means error the weighting
    avoids; and the typed error of `pm.step` while in eval mode."""
    torch.manual_seed(0)
    model, (ids,), kw = zoo.gpt2(n_layer=4, n_embd=32, n_head=4, vocab_size=128, batch=8, seq_len=16, labels=True)
    labels = _padded(ids, (0, 1, 2), 2)
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    val_ids = torch.randint(0, 128, (12, 16), generator=g)
    val_labels = _padded(val_ids, (1, 2, 3, 9), 5)
    pm = _quiet_parallelize(model, (ids,), example_kwargs={"labels": labels}, mesh=mesh, **(options or {}))
    opt, ref_opt = torch.optim.AdamW(pm.parameters(), lr=1e-3), torch.optim.AdamW(reference.parameters(), lr=1e-3)

    def train(steps: int) -> None:
        for _ in range(steps):
            pm.step(ids, labels=labels)
            reference(ids, labels=labels).loss.backward()
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad()

    train(2)
    state_before = [v.clone() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    pm.eval()
    reference.eval()
    flags = sorted({m.training for st in pm.stages for m in st.modules()})
    with torch.no_grad():
        out = pm(val_ids, labels=val_labels)
        ref = reference(val_ids, labels=val_labels)
        size = pm.run.microbatch_size
        halves = [reference(val_ids[j:j + size], labels=val_labels[j:j + size]).loss for j in range(0, 12, size)]
    try:
        pm.step(ids, labels=labels)
        step_in_eval = "no error"
    except PipelineError as e:
        step_in_eval = str(e)
    state_after = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    touched = any(p.grad is not None for p in pm.parameters()) or any(
        not torch.equal(a, b) for a, b in zip(state_before, state_after))
    pm.train()
    reference.train()
    train(3)
    full, ref_sd = pm.full_state_dict(), reference.state_dict()
    return {"type": type(pm).__name__, "eval_flags": flags, "loss": _close(out.loss, ref.loss),
            "logits": _close(out.logits, ref.logits), "logits_shape": tuple(out.logits.shape),
            "mean_of_means_off_by": abs(sum(halves).item() / len(halves) - ref.loss.item()),
            "schedule": pm.plan.pipeline.schedule,
            "touched": touched, "step_in_eval": step_in_eval,
            "params": [k for k in ref_sd if _close(full[k], ref_sd[k])]}


class BNDropout(nn.Module):
    """Linear -> 4 x (Linear, BatchNorm1d, ReLU, residual) -> Dropout(0.5) -> Linear -> cross-entropy: in eval mode
    dropout is the identity and BatchNorm normalises with its running statistics; the dropout sits after every
    BatchNorm, so the running statistics a training forward leaves do not depend on its random mask."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, WIDTH)
        self.blocks = nn.ModuleList(_BNBlock() for _ in range(4))
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(self.drop(h)), y)


def bn_dropout_eval(rank: int, world_size: int, mesh: dict) -> dict:
    """BNDropout on a pipeline plan of `mesh` (4 microbatches of 2): the eval loss against eager `model.eval()`
    (dropout off, running statistics) before any step, and again after one training step without an optimizer
    step (the parameters stay, the BatchNorm running statistics move by the 4 microbatches' batch statistics, as eager
    train-mode forwards of the 4 microbatches in order move them; the eval programs read the buffers the
    training programs wrote). Also the eval under grad mode (outputs detached, no graph) and the running
    statistics (full_state_dict) against eager's."""
    torch.manual_seed(0)
    model = BNDropout()
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(8, 6, generator=g), torch.arange(8) % 3
    vx, vy = torch.randn(8, 6, generator=g) * 2 + 1, (torch.arange(8) + 1) % 3
    reference = copy.deepcopy(model)
    pm = _quiet_parallelize(model, (x, y), mesh=mesh, microbatches=4)
    out = {"type": type(pm).__name__}
    pm.eval()
    reference.eval()
    with torch.no_grad():
        before = reference(vx, vy)
        out["before"] = _close(pm(vx, vy), before)
    pm.train()
    reference.train()
    pm.step(x, y)  # no optimizer step: the parameters stay, the running statistics move
    with torch.no_grad():
        for j in range(0, 8, 2):
            reference(x[j:j + 2], y[j:j + 2])
    pm.eval()
    reference.eval()
    with torch.no_grad():
        ref = reference(vx, vy)
    got = pm(vx, vy)  # grad mode on: still forward only, detached
    out["after"] = _close(got, ref)
    out["after_requires_grad"] = got.requires_grad
    out["moved"] = (ref - before).abs().item()
    full, ref_sd = pm.full_state_dict(), reference.state_dict()
    out["stats"] = [k for k in ref_sd if "running" in k and _close(full[k], ref_sd[k])]
    pm.train()
    return out


class _ScaledBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.scale = 1.0

    def forward(self, x):
        return x + torch.tanh(self.fc(x)) * self.scale


class RootSettings(nn.Module):
    """Plain settings of the root read in forward: a float temperature, an int shift, a bool switch, a tensor
    attribute that is not a buffer (`mask`), and a submodule's float (`blocks[i].scale`)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, WIDTH)
        self.blocks = nn.ModuleList(_ScaledBlock() for _ in range(4))
        self.head = nn.Linear(WIDTH, 3)
        self.temperature = 1.0
        self.shift = 0
        self.center = False
        self.mask = torch.ones(WIDTH)

    def forward(self, x, y):
        h = self.inp(x) * self.mask
        for block in self.blocks:
            h = block(h)
        logits = self.head(h) / self.temperature + self.shift
        if self.center:
            logits = logits - logits.mean(-1, keepdim=True)
        return F.cross_entropy(logits, y)


def root_settings(rank: int, world_size: int, mesh: dict) -> dict:
    """RootSettings on a pipeline plan of `mesh`: each kind of setting changed on the PipelineModule after build,
    then `pm.step` and the evaluation forward: per kind, the error's text ('no error' if none) and the step's loss
    failure against the eager model with the same change ('' when close). The tensor attribute is replaced on the
    stages (so it must match eager); the plain ones are refused, naming the attribute. Also the hooks registered on
    the PipelineModule: `step`'s error ('no error' if none) and which ran on an evaluation forward."""
    torch.manual_seed(0)
    model = RootSettings()
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(8, 6, generator=g), torch.arange(8) % 3
    reference = copy.deepcopy(model)
    pm = _quiet_parallelize(model, (x, y), mesh=mesh, microbatches=2)
    out = {"read": (pm.temperature, pm.shift, pm.center)}

    def attempt(name: str, set_pm, set_ref, undo_pm) -> None:
        set_pm()
        set_ref(reference)
        errors = []
        for call in (lambda: pm.step(x, y), lambda: _eval(pm, x, y)):
            try:
                loss = call()
                errors.append("no error")
            except (PipelineError, ModelAttributeError) as e:
                loss = None
                errors.append(str(e))
        for p in pm.parameters():
            p.grad = None
        expected = reference(x, y).detach()
        out[name] = {"step": errors[0], "eval": errors[1],
                     "loss": _close(loss, expected) if loss is not None else "not run"}
        undo_pm()
        set_ref(reference, undo=True)

    def setter(attr, value, old):
        return lambda m, undo=False: setattr(m, attr, old if undo else value)

    for attr, value, old in (("temperature", 0.5, 1.0), ("shift", 2, 0), ("center", True, False)):
        attempt(attr, lambda: setattr(pm, attr, value), setter(attr, value, old), lambda: setattr(pm, attr, old))
    new_mask = torch.linspace(0.0, 2.0, WIDTH)
    attempt("mask", lambda: setattr(pm, "mask", new_mask.clone()), setter("mask", new_mask.clone(), torch.ones(WIDTH)),
            lambda: setattr(pm, "mask", torch.ones(WIDTH)))
    out["mask_read"] = _close(pm.mask, torch.ones(WIDTH))
    try:
        pm.blocks[0].scale = 2.0
        out["submodule_attr"] = "no error"
    except ModelAttributeError as e:
        out["submodule_attr"] = str(e)

    def set_scale(value):
        for st in pm.stages:
            st.blocks[1].scale = value

    attempt("blocks.1.scale", lambda: set_scale(2.0), lambda m, undo=False: setattr(m.blocks[1], "scale",
                                                                                   1.0 if undo else 2.0),
            lambda: set_scale(1.0))
    # hooks on the PipelineModule itself: refused by step (they would not run), run by the evaluation forward
    fired = []
    handles = [pm.register_forward_pre_hook(lambda m, i: fired.append("pre")),
               pm.register_forward_hook(lambda m, i, o: fired.append("forward")),
               pm.register_full_backward_hook(lambda m, gi, go: fired.append("backward"))]
    try:
        pm.step(x, y)
        out["hooks_step"] = "no error"
    except PipelineError as e:
        out["hooks_step"] = str(e)
    _eval(pm, x, y)
    out["hooks_fired"] = list(fired)
    for h in handles:
        h.remove()
    # unchanged again: trains as eager (the refusals left nothing behind)
    out["after"] = _close(pm.step(x, y), reference(x, y).detach())
    return out


def _eval(pm, x, y):
    pm.eval()
    try:
        with torch.no_grad():
            return pm(x, y)
    finally:
        pm.train()
