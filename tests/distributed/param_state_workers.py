"""Rank bodies for test_parameter_state.py (trial r13a): what users attach to the model's parameters before
wrapping (gradient hooks, Python attributes their optimizer set-up reads) on real gloo ranks, against the same
model on one device computed in the rank."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.errors import UnsupportedOpError

NEW_TOKENS = 9  # rows >= 9 of the embedding are the only ones trained (a mask hook freezes the others)


class HookedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        self.l1 = nn.Linear(8, 10)
        self.l2 = nn.Linear(10, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.l2(F.gelu(self.l1(self.emb(ids))))


def _halve_grad(p: torch.Tensor) -> None:
    p.grad.mul_(0.5)


def hooked_net(hooks: bool = True):
    """The model with (or without) its hooks and attributes: a row mask on the embedding's gradient (the
    recipe for training only new tokens' rows), a 0.5 scale on l1.weight's gradient, a post-accumulate hook
    halving l2.bias's .grad, and mamba_ssm's `_no_weight_decay` flag on l1.bias."""
    torch.manual_seed(0)
    model = HookedNet()
    if hooks:
        mask = torch.zeros(12, 1)
        mask[NEW_TOKENS:] = 1.0
        model.emb.weight.register_hook(lambda g: g * mask)
        model.l1.weight.register_hook(lambda g: g * 0.5)
        model.l2.bias.register_post_accumulate_grad_hook(_halve_grad)
        model.l1.bias._no_weight_decay = True
    ids = torch.randint(0, 12, (4, 6), generator=torch.Generator().manual_seed(1))
    return model, ids


def _groups(module: nn.Module) -> list[dict]:
    """The user's optimizer set-up: no weight decay for parameters flagged `_no_weight_decay` (mamba_ssm)."""
    params = list(module.parameters())
    return [{"params": [p for p in params if not getattr(p, "_no_weight_decay", False)], "weight_decay": 0.5},
            {"params": [p for p in params if getattr(p, "_no_weight_decay", False)], "weight_decay": 0.0}]


def hooks_and_attributes(rank: int, world_size: int, mesh: dict, roles: dict) -> dict:
    """One backward and 3 AdamW steps with the user's param groups on the plan and on one device (the same
    model, hooks and all): the largest gradient and parameter differences, the gradient difference of a model
    without the hooks (what a dropped hook gives), or the typed error's text."""
    model, ids = hooked_net()
    reference, _ = hooked_net()
    unhooked, _ = hooked_net(hooks=False)
    try:
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, axis_roles=roles)
    except UnsupportedOpError as err:
        return {"error": str(err)}
    for m in (pm, reference, unhooked):
        m(ids).pow(2).mean().backward()
    full_grads = {name: p.grad for name, p in pm.named_parameters()}
    if any(g.shape != reference.get_parameter(n).shape for n, g in full_grads.items()):
        return {"sharded": True}  # a sharded plan that was not refused
    out = {"grad": max((full_grads[n] - reference.get_parameter(n).grad).abs().max().item() for n in full_grads),
           "dropped": max((reference.get_parameter(n).grad - unhooked.get_parameter(n).grad).abs().max().item()
                          for n in full_grads),
           "flag": getattr(pm.get_parameter("l1.bias"), "_no_weight_decay", None)}
    _train_side_by_side((pm, reference), ids)
    full = pm.full_state_dict()
    out["params"] = max((full[n] - p).abs().max().item() for n, p in reference.state_dict().items())
    return out


def unhooked_reference_differs(rank: int, world_size: int) -> float:
    """How far the eager model with the user's param groups moves from one decaying l1.bias too (what a dropped
    `_no_weight_decay` flag gives): the size of the difference the parameter check above must see."""
    model, ids = hooked_net()
    plain, _ = hooked_net()
    del plain.l1.bias._no_weight_decay
    _train_side_by_side((model, plain), ids)
    return (model.l1.bias - plain.l1.bias).abs().max().item()


def _train_side_by_side(models, ids) -> None:
    """3 AdamW steps (lr 0.05, the user's param groups `_groups`) of each model on `ids`, in turn."""
    opts = [torch.optim.AdamW(_groups(m), lr=0.05) for m in models]
    for _ in range(3):
        for m, opt in zip(models, opts):
            opt.zero_grad()
            m(ids).pow(2).mean().backward()
            opt.step()



class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def hooked_pipeline(rank: int, world_size: int) -> str:
    """A pipeline plan of a model whose second block's weight has a gradient hook: the typed error's text on
    every rank (the rank that does not hold the hooked block refuses too; before, nothing was checked)."""
    torch.manual_seed(0)
    model = Blocks()
    model.blocks[1].fc.weight.register_hook(lambda g: g.clamp(-0.01, 0.01))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    try:
        parallelizer.auto_parallelize(model, (x,), mesh={"pp": 2})
    except UnsupportedOpError as err:
        return str(err)
    return "wrapped"
