"""Unusual autograd use of a ParallelModule against eager (trial5a h1):
  two_forwards      loss = f(pm(x1)) + f(pm(x2)), one backward (SimCLR two views; DDP's "mark ready twice")
  retain_twice      one forward, two backward calls (retain_graph=True) accumulating into .grad
  input_grad        x.requires_grad: x.grad after backward (saliency / adversarial training)
  grad_penalty      autograd.grad(out, x, create_graph=True) then a penalty (WGAN-GP)
  second_output     the loss reads only the second output
  input_mutation    forward mutates its input in place: the caller's tensor afterwards
    python trial/h1_autograd.py
"""
from __future__ import annotations

import contextlib
import copy
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import parallelizer  # noqa: E402
from parallelizer.rewriter.spec import all_axis_groups, spec_from_plan  # noqa: E402
from parallelizer.rewriter.state import shard_tensor  # noqa: E402
from parallelizer.runtime.launch import create_groups, spawn  # noqa: E402
from parallelizer.runtime.module import ParallelModule  # noqa: E402

B, T, H = 4, 6, 16


class Net(nn.Module):
    def __init__(self, mutate=False):
        super().__init__()
        self.mutate = mutate
        self.ln = nn.LayerNorm(H)
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x):
        if self.mutate:
            x.mul_(2.0)
        h = self.b(torch.tanh(self.a(self.ln(x))))
        return h, h.sum(-1)


def inputs(seed):
    return torch.randn(B, T, H, generator=torch.Generator().manual_seed(seed))


CASES = ("two_forwards", "retain_twice", "input_grad", "grad_penalty", "second_output", "input_mutation")


def run_case(case, m, x1, x2):
    """Returns (loss value, x1.grad or None, x1 after)."""
    if case == "two_forwards":
        loss = m(x1)[0].pow(2).mean() + m(x2)[0].tanh().mean()
        loss.backward()
        return loss.detach(), None, x1
    if case == "retain_twice":
        out = m(x1)[0]
        out.pow(2).mean().backward(retain_graph=True)
        out.abs().mean().backward()
        return out.detach().sum(), None, x1
    if case == "input_grad":
        x = x1.clone().requires_grad_(True)
        m(x)[0].pow(2).mean().backward()
        return None, x.grad, x1
    if case == "grad_penalty":
        x = x1.clone().requires_grad_(True)
        out = m(x)[0]
        (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        loss = out.pow(2).mean() + g.pow(2).mean()
        loss.backward()
        return loss.detach(), x.grad, x1
    if case == "second_output":
        m(x1)[1].pow(2).mean().backward()
        return None, None, x1
    if case == "input_mutation":
        x = x1.clone()
        out = m(x)[0]
        out.pow(2).mean().backward()
        return out.detach().sum(), None, x
    raise ValueError(case)


def rank_fn(rank, world, spec, case):
    torch.manual_seed(0)
    model = Net(mutate=case == "input_mutation")
    ref = copy.deepcopy(model)
    traced = parallelizer.trace(copy.deepcopy(model), (inputs(1),))
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(traced, spec, rank, model)
    out = {}
    try:
        got = run_case(case, pm, inputs(1), inputs(2))
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {str(err)[:400]}"}
    want = run_case(case, ref, inputs(1), inputs(2))
    for i, name in enumerate(("loss", "x.grad", "x after")):
        a, b = got[i], want[i]
        if a is None and b is None:
            continue
        if (a is None) != (b is None):
            out[name] = f"one side None (pm {a is None}, eager {b is None})"
        else:
            out[name] = float((a - b).abs().max())
    worst = 0.0
    for fqn, p in pm.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        r = ref.get_parameter(fqn).grad
        r = torch.zeros_like(ref.get_parameter(fqn)) if r is None else r
        worst = max(worst, float((g - shard_tensor(r, spec.params[fqn], spec.mesh, pm.coords)).abs().max()))
    out["param grads"] = worst
    return out


def main_for(only):
    for mesh, roles in (({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"}), ({"tp": 2}, {"tp": "tp"})):
        for case in only:
            model = Net(mutate=case == "input_mutation")
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    plan = parallelizer.plan(parallelizer.trace(model, (inputs(1),)), mesh, axis_roles=roles)
                res = spawn(rank_fn, 2, spec_from_plan(plan), case, timeout_s=300)
                print(f"{case:15s} {roles}: {res}", flush=True)
            except Exception as err:  # noqa: BLE001
                print(f"{case:15s} {roles}: RUN ERROR {type(err).__name__}: {str(err)[-500:]}", flush=True)


if __name__ == "__main__":
    main_for(sys.argv[1:] or CASES)
