"""Optimizers whose update reads a statistic of the whole tensor along one dim or at some ranks only (round 26,
r26b), and the 2-rank body that steps them on a parallel module against the same model on one device.

`PerDimSgd(rule=...)`: SGD whose update is `RULES[rule](gradient)`. The first three rules are the members of the
class the optimizer probe (`runtime.optimizer_check.kind_of`) called per-element while it split one (4, 6)
tensor along its columns only: a column normalisation (a statistic over dim 0, Scion's ColNorm, Pethick et al.
2025; microsoft/dion#21 and #114 shard such row / column statistics by hand), the norm of 1-D tensors only, the
norm of conv weights (3-D and more) only. "plain" (SGD) is the per-element control.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

RULES = {
    "colnorm": lambda d: d / (d.norm(dim=0, keepdim=True) + 1e-8) if d.ndim == 2 else d,
    "bias_norm": lambda d: d / (d.norm() + 1e-8) if d.ndim == 1 else d,
    "conv_norm": lambda d: d / (d.norm() + 1e-8) if d.ndim >= 3 else d,
    "plain": lambda d: d,
}


class PerDimSgd(torch.optim.Optimizer):
    """p <- p - lr * RULES[rule](p.grad) for every parameter with a gradient."""

    def __init__(self, params, lr=0.1, rule="colnorm"):
        super().__init__(params, {"lr": lr, "rule": rule})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(group["lr"] * RULES[group["rule"]](p.grad))


class ConvHead(nn.Module):
    """Conv1d (a 3-D weight, a bias) -> tanh -> flatten -> Linear (a matrix, a bias): (N, 4, 6) -> (N, 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.head = nn.Linear(8 * 6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.conv(x)).flatten(1))


def conv_head(seed: int = 0):
    """(model, (x,)) with x of shape (8, 4, 6); the target is `target(x)`."""
    torch.manual_seed(seed)
    return ConvHead(), (torch.randn(8, 4, 6, generator=torch.Generator().manual_seed(seed + 1)),)


def target(x: torch.Tensor) -> torch.Tensor:
    return torch.randn(x.shape[0], 6, generator=torch.Generator().manual_seed(7))


def per_dim_steps(rank: int, world_size: int, specs: dict, steps: int = 2) -> dict:
    """For each (plan name, spec) and rule: `steps` SGD steps of `PerDimSgd` on pm.parameters() and on a copy of
    the model on one device. {(plan, rule): {"error": (kind, parameter) or None, "unchanged": whether a refused
    step left every local parameter as it was, "state": pm.full_state_dict(), "reference": the copy's}}."""
    import torch.distributed as dist

    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.runtime import create_groups
    from parallelizer.runtime.module import ParallelModule
    from parallelizer.runtime.optimizer_check import OptimizerError
    from parallelizer.tracer.trace import trace

    out = {}
    for name, spec in specs.items():
        for rule in RULES:
            model, (x,) = conv_head()
            reference = copy.deepcopy(model)
            create_groups(all_axis_groups(spec.mesh))
            pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
            before = {f: p.detach().clone() for f, p in pm.named_parameters()}
            opt, ref_opt = PerDimSgd(pm.parameters(), rule=rule), PerDimSgd(reference.parameters(), rule=rule)
            result = {"error": None, "unchanged": None}
            try:
                for _ in range(steps):
                    pm.step(x, target=target(x), loss_fn=F.mse_loss)
                    F.mse_loss(reference(x), target(x)).backward()
                    opt.step(), ref_opt.step()
                    opt.zero_grad(), ref_opt.zero_grad()
            except OptimizerError as e:
                result["error"] = (e.kind, e.parameter)
                result["unchanged"] = all(torch.equal(p, before[f]) for f, p in pm.named_parameters())
            result["state"], result["reference"] = pm.full_state_dict(), reference.state_dict()
            out[(name, rule)] = result
    return out
