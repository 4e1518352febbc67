"""Rank body for test_eval_under_autocast: after one training step, an eval forward under the user's
torch.autocast(bfloat16) (the r19g new-user trial's defect 4) against the eager model on one device under the same
autocast, built from the same seed in the same rank."""
from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from parallelizer.runtime.tolerance import excess
from contract_workers import _pm


def autocast_mlp_with_dropout(seed: int = 0):
    """(8, 16) -> Linear(16, 64), GELU, Dropout(0.1), Linear(64, 8): the dropout makes eval another graph."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 8))
    return model, (torch.randn(8, 16, generator=torch.Generator().manual_seed(seed + 1)) * 3,)


def eval_under_autocast(rank: int, world_size: int, spec) -> dict:
    """The warnings an eval forward under torch.autocast(cpu, bfloat16) raises, the ops it ran replicated, its output
    dtype, and its excess (`runtime.tolerance.excess`, bfloat16's bound: <= 1 is a match) over one device's."""
    model, (x,) = autocast_mlp_with_dropout()
    reference = copy.deepcopy(model).eval()
    pm = _pm(model, (x,), spec)
    pm.eval()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("always")
        out, ref = pm(x), reference(x)
    return {"warnings": [str(w.message) for w in caught if "ParallelModule" in str(w.message)],
            "replicated": list(pm._active.replicated), "dtype": str(out.dtype), "ref_dtype": str(ref.dtype),
            "excess": excess(out, ref), "bf16_vs_fp32": (ref.double() - model.eval()(x).double()).abs().max().item()}
