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


FILLS = {
    # HF's `_init_weights` / nanoGPT-style loops over pm.parameters() or pm.modules()
    "data_normal": lambda m: [p.data.normal_(0, 0.02) for p in m.parameters()],
    "no_grad_uniform": lambda m: [p.uniform_(-0.1, 0.1) for p in m.parameters()],
    "module_weights": lambda m: [(s.weight.data.normal_(0, 0.02), s.bias.data.zero_()) for s in m.modules()
                                 if isinstance(s, (nn.Linear, nn.Conv1d))],
    "view_bernoulli": lambda m: [p.data.view(-1)[:2].bernoulli_(0.5) for p in m.parameters()],
}
# constant writes: a row of the head (HF's `weight.data[padding_idx].zero_()`), a filter of the conv through
# nn.init.constant_ (fairseq), every parameter whole; then index assignment, `copy_` into a part, indexed in-place
# writes, a mask made from the values and whole assignments -> the plans on which a part is chosen along a sharded
# dim (conv_head's layouts: fsdp shards every dim 0; tp=2 shards conv.weight's dim 0 and head.weight's dim 1)
WRITES = {
    "padding_row": (lambda m: m.get_parameter("head.weight").data[1].zero_(), {"fsdp2"}),
    "constant_filter": (lambda m: nn.init.constant_(m.get_parameter("conv.weight")[1], 0.5), {"fsdp2", "tp2"}),
    "whole_zero": (lambda m: [p.data.zero_() for p in m.parameters()], set()),
}
# round 27 (r27g): the other positional writes (`runtime.part_writes`; every one ran on main 45468d0, silently)
PART_WRITES = {
    "setitem_padding_row": (lambda m: m.get_parameter("head.weight").data.__setitem__(1, 0.0), {"fsdp2"}),
    "setitem_param_filter": (lambda m: m.get_parameter("conv.weight").__setitem__(1, 0.5), {"fsdp2", "tp2"}),
    "setitem_column": (lambda m: m.get_parameter("head.weight").data.__setitem__((slice(None), 1), 0.0), {"tp2"}),
    "imul_rows": (lambda m: _imul_rows(m.get_parameter("conv.weight").data), {"fsdp2", "tp2"}),
    "copy_into_rows": (lambda m: m.get_parameter("conv.weight").data[:2].copy_(torch.tensor(0.25)), {"fsdp2", "tp2"}),
    "index_fill_row": (lambda m: m.get_parameter("head.weight").data.index_fill_(0, torch.tensor([1]), 0.0), {"fsdp2"}),
    "scatter_bias": (lambda m: m.get_parameter("head.bias").data.scatter_(0, torch.tensor([0]), 0.0), {"fsdp2"}),
    "fill_diagonal": (lambda m: m.get_parameter("head.weight").data.fill_diagonal_(1.0), {"fsdp2", "tp2"}),
    # every local row of the head, but the local diagonal (r26b's rule let it run on fsdp: 1.107 off)
    "diagonal_view_fill": (lambda m: m.get_parameter("head.weight").data.diagonal().fill_(1.0), {"fsdp2", "tp2"}),
    "value_mask": (lambda m: [p.data.__setitem__(p.data < 0, 0.0) for p in m.parameters()], set()),
    "whole_setitem": (lambda m: [p.data.__setitem__(slice(None), 0.1) for p in m.parameters()], set()),
}


def _imul_rows(w: torch.Tensor) -> None:
    w[:2] *= 0.5  # Python: w.__setitem__(slice(0, 2), w[:2].__imul__(0.5))


def _error(fn) -> str:
    try:
        fn()
        return "no error"
    except Exception as e:  # noqa: BLE001 - the test reads the error's type and text
        return f"{type(e).__name__}: {e}"


def random_fills(rank: int, world_size: int, specs: dict) -> dict:
    """For each (plan name, spec) and fill of `FILLS` or write of `WRITES` / `PART_WRITES`, seeded alike on the parallel module and on a copy of the model
    on one device (under torch.no_grad): {(plan, fill): {"error": "no error" or the error, "state":
    pm.full_state_dict(), "reference": the copy's state_dict()}}; and {"noise": a draw of a plain tensor after the
    fills, "noise_reference": the same draw with no parallel module involved}."""
    import torch.distributed as dist

    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.runtime import create_groups
    from parallelizer.runtime.module import ParallelModule
    from parallelizer.tracer.trace import trace

    out = {}
    for name, spec in specs.items():
        for fill, fn in {**FILLS, **{k: fn for k, (fn, _) in {**WRITES, **PART_WRITES}.items()}}.items():
            model, (x,) = conv_head()
            reference = copy.deepcopy(model)
            create_groups(all_axis_groups(spec.mesh))
            pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
            results = []
            for m in (pm, reference):
                torch.manual_seed(5)
                with torch.no_grad():
                    results.append(_error(lambda m=m: fn(m)))
            out[(name, fill)] = {"error": results[0], "state": pm.full_state_dict(), "reference": reference.state_dict()}
    torch.manual_seed(9)
    out["noise"] = torch.empty(5).normal_()
    out["noise_reference"] = torch.randn(5, generator=torch.Generator().manual_seed(9))
    return out


def pipeline_fills(rank: int, world_size: int) -> dict:
    """`Tensor.normal_` through `.data` on each parameter a pp=2 (1f1b) PipelineModule of a tied 4-block GPT-2 holds
    on this rank: {FQN: "no error" or the error}, and "copied": the FQNs it holds more than once."""
    import contextlib
    import io

    import parallelizer
    from parallelizer import zoo

    torch.manual_seed(0)
    model, (ids,) = zoo.gpt2(n_layer=4, n_embd=16, n_head=2, vocab_size=64, batch=4, seq_len=8)
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (ids,), mesh={"pp": 2}, schedule="1f1b", microbatches=2)
    torch.manual_seed(1)
    out = {fqn: _error(lambda p=p: p.data.normal_(0, 0.02)) for fqn, p in pm.named_parameters()}
    out["copied"] = sorted(pm.copied)
    return out


# Round 27 (r27f, merged by r27fg): positional writes and statistics of pm's pieces (`runtime.part_writes`, `runtime.piece_norms`). conv_head's layouts:
# fsdp2 shards every dim 0 (head.weight (3, 48) of (6, 48)); tp2 shards conv.weight / conv.bias dim 0 and head.weight
# dim 1 (head.weight (6, 24)), head.bias replicated. Each entry: (fn(m) under no_grad, the plans that refuse it).
def _set(fqn: str, key, value, data: bool = True):
    def write(m):
        p = m.get_parameter(fqn)
        (p.data if data else p)[key] = value
    return write


POSITIONAL = {
    "padding_row": (_set("head.weight", 1, 0.0), {"fsdp2"}),  # HF's `weight.data[padding_idx] = 0`
    "column_of_param": (_set("head.weight", (slice(None), 0), 0.5, data=False), {"tp2"}),
    "conv_filter": (_set("conv.weight", 1, 0.0), {"fsdp2", "tp2"}),
    # each rank's diagonal keeps every row index (fsdp) yet is another diagonal: whole fibres, not index sets
    "diagonal": (_set("head.weight", (torch.arange(3), torch.arange(3)), 0.0), {"fsdp2", "tp2"}),
    "diagonal_zero_": (lambda m: m.get_parameter("head.weight").data.diagonal().zero_(), {"fsdp2", "tp2"}),
    "index_fill_row": (lambda m: m.get_parameter("head.weight").data.index_fill_(0, torch.tensor([1]), 0.0),
                       {"fsdp2"}),
    "masked_fill_columns": (lambda m: m.get_parameter("head.weight").data.masked_fill_(torch.arange(
        m.get_parameter("head.weight").shape[1]) < 4, 0.0), {"tp2"}),
    "prune_by_value": (lambda m: [p.data.__setitem__(p.data.abs() < 0.05, 0.0) for p in m.parameters()], set()),
    "whole": (_set("head.weight", ..., 0.25), set()),
}
NORMS = {  # over the values: (fn(m) under no_grad, plans that refuse)
    "div_norm": (lambda m: [p.div_(p.norm()) for p in m.parameters()], {"fsdp2", "tp2"}),
    "normalize_rows": (lambda m: m.get_parameter("head.weight").copy_(
        F.normalize(m.get_parameter("head.weight"), dim=1)), {"tp2"}),
    "matrix_norm": (lambda m: m.get_parameter("head.weight").div_(
        torch.linalg.matrix_norm(m.get_parameter("head.weight"))), {"fsdp2", "tp2"}),
    # r27fg: renorm over every dim but `dim` (head.weight: fsdp S(0), tp S(1))
    "renorm_rows": (lambda m: m.get_parameter("head.weight").renorm_(2, 0, 0.1), {"tp2"}),
    "renorm_columns": (lambda m: m.get_parameter("head.weight").renorm_(2, 1, 0.01), {"fsdp2"}),
}


def agc(params, clipping: float = 0.01, eps: float = 1e-3) -> None:
    """timm.utils.agc.adaptive_clip_grad: each gradient row clipped to `clipping` times its weight row's norm."""
    def unitwise(x):
        return x.norm(2.0) if x.ndim <= 1 else x.norm(2.0, dim=tuple(range(1, x.ndim)), keepdim=True)
    for p in params:
        max_norm = unitwise(p.detach()).clamp_(min=eps).mul_(clipping)
        g = unitwise(p.grad.detach())
        p.grad.detach().copy_(torch.where(g < max_norm, p.grad, p.grad * (max_norm / g.clamp(min=1e-6))))


GRADS = {  # after one backward: (fn(m) -> values or None, plans that refuse)
    "grad_norms": (lambda m: {f: p.grad.norm() for f, p in m.named_parameters()}, {"fsdp2", "tp2"}),
    "agc": (lambda m: agc(m.parameters()), {"fsdp2", "tp2"}),
    "frozen_grad_rows": (lambda m: m.get_parameter("conv.weight").grad.__setitem__(slice(0, 2), 0.0),
                         {"fsdp2", "tp2"}),
}


def piece_access(rank: int, world_size: int, specs: dict) -> dict:
    """POSITIONAL, NORMS and GRADS on a parallel module and on a copy of the model on one device:
    {(plan, name): {"error": "no error" or the error, "state" / "reference": full state dicts (POSITIONAL, NORMS),
    or "grads" / "reference": this rank's gradients and one device's shards of them, "values": the returned
    values (GRADS)}}; and {(plan, "total_norms")}: `get_total_norm([p.grad])` per parameter against one device's
    `p.grad.norm()` (the remedy the error names)."""
    import torch.distributed as dist

    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.rewriter.state import shard_tensor
    from parallelizer.runtime import create_groups
    from parallelizer.runtime.module import ParallelModule
    from parallelizer.tracer.trace import trace

    out = {}
    for name, spec in specs.items():
        create_groups(all_axis_groups(spec.mesh))

        def fresh(backward: bool):
            model, (x,) = conv_head()
            reference = copy.deepcopy(model)
            pm = ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)
            if backward:
                pm.step(x, target=target(x), loss_fn=F.mse_loss)
                F.mse_loss(reference(x), target(x)).backward()
            return pm, reference

        for key, (fn, _) in {**POSITIONAL, **NORMS}.items():
            pm, reference = fresh(False)
            errors = []
            for m in (pm, reference):
                with torch.no_grad():
                    errors.append(_error(lambda m=m: fn(m)))
            out[(name, key)] = {"error": errors[0], "state": pm.full_state_dict(), "reference": reference.state_dict()}
        for key, (fn, _) in GRADS.items():
            pm, reference = fresh(True)
            values = {}
            error = _error(lambda: values.update({"pm": fn(pm)}))
            values["reference"] = fn(reference)
            grads = {f: p.grad for f, p in pm.named_parameters()}
            shards = {f: shard_tensor(p.grad, spec.params[f], spec.mesh, pm.coords)
                      for f, p in reference.named_parameters()}
            out[(name, key)] = {"error": error, "grads": grads, "reference": shards, "values": values}
        pm, reference = fresh(True)
        totals = {f: torch.nn.utils.get_total_norm([p.grad]) for f, p in pm.named_parameters()}
        out[(name, "total_norms")] = (totals, {f: p.grad.norm() for f, p in reference.named_parameters()})
    return out
