"""Rank bodies for test_call_contract: calls a training loop makes that the traced call did not, and pickling.

Every check compares with the eager model on one device, built from the same seed in the same rank."""
from __future__ import annotations

import copy
import io
import pickle

import torch
from torch import nn

from parallelizer.errors import UnsupportedOpError
from contract_workers import _diff, _pm


class Defaults(nn.Module):
    """(B, 16) -> (B, 4): Linear(16, 32), ReLU, times `scale`, times `mask` if given, Linear(32, 4); returns the
    hidden state too when `return_hidden`."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x, mask=None, scale=1.0, return_hidden=False):
        h = torch.relu(self.up(x)) * scale
        if mask is not None:
            h = h * mask
        out = self.down(h)
        return (out, h) if return_hidden else out


def defaults(seed: int = 0):
    torch.manual_seed(seed)
    return Defaults(), (torch.randn(4, 16, generator=torch.Generator().manual_seed(seed + 1)),)


def _outcome(fn):
    try:
        return fn()
    except (TypeError, UnsupportedOpError) as exc:
        return f"{type(exc).__name__}: {exc}"


def explicit_defaults_and_pickling(rank: int, world_size: int, spec) -> dict:
    """A model traced as model(x) called with its defaults passed explicitly (max |diff| of the outputs to eager,
    or the error text), with other values (the error text); torch.save / pickle of pm (the error text) and the
    recipe its remedy gives (the whole model saved inside full_model, loaded and run: max |diff| to eager)."""
    model, (x,) = defaults()
    reference = copy.deepcopy(model)
    pm = _pm(model, (x,), spec)
    calls = {"mask=None": ((x,), {"mask": None}), "scale=1.0": ((x,), {"scale": 1.0}),
             "return_hidden=False": ((x,), {"return_hidden": False}), "positional None, 1.0": ((x, None, 1.0), {}),
             "scale=2.0": ((x,), {"scale": 2.0}), "scale=1": ((x,), {"scale": 1}),
             "mask tensor": ((x,), {"mask": torch.ones(4, 32)})}
    out = {name: _outcome(lambda a=a, k=k: _diff(pm(*a, **k), reference(*a, **k))) for name, (a, k) in calls.items()}
    out["torch.save"] = _outcome(lambda: torch.save(pm, io.BytesIO()))
    out["pickle"] = _outcome(lambda: pickle.dumps(pm))
    buf = io.BytesIO()
    with pm.full_model() as whole:
        torch.save(whole, buf)
    buf.seek(0)
    out["full_model saved"] = _diff(torch.load(buf, weights_only=False)(x), reference(x))
    return out
