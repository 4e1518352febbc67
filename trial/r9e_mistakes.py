"""Trial r9e: reasonable user mistakes, each on 2 gloo ranks under torchrun.

torchrun --nproc-per-node 2 trial/r9e_mistakes.py [names...]
"""
from __future__ import annotations

import copy
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import parallelizer  # noqa: E402
from trial.r9e_models import build  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))


def say(*a):
    if RANK == 0:
        print(*a, flush=True)


def ratio(a, b, atol=1e-5, rtol=1.3e-6):
    return float(((a - b).abs() / (atol + rtol * b.abs())).max())


def make(kind="ae", batch=8, roles=None, mesh=None, **kw):
    torch.manual_seed(0)
    model, args, target, loss_fn = build(kind, batch)
    ref = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, args, mesh=mesh or {"dp": 2}, axis_roles=roles or {"dp": "ddp"},
                                       time_limit_s=20, **kw)
    return model, ref, pm, args, target, loss_fn


def t_opt_on_model():
    """optimizer built over the ORIGINAL model's parameters after wrapping"""
    model, ref, pm, args, y, lf = make("ae")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ro = torch.optim.SGD(ref.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad(); l = pm.step(*args, target=y, loss_fn=lf); opt.step()
        ro.zero_grad(); rl = lf(ref(*args), y); rl.backward(); ro.step()
    say("loss", l.item(), "ref", rl.item(), "ratio", ratio(l, rl.detach()))


def t_eval_step():
    """pm.eval() then pm.step (eager: eval-mode BN with backward)"""
    model, ref, pm, args, y, lf = make("ae")
    pm.eval(); ref.eval()
    l = pm.step(*args, target=y, loss_fn=lf)
    rl = lf(ref(*args), y); rl.backward()
    say("eval step loss ratio", ratio(l, rl.detach()))
    g = dict(pm.named_parameters())
    with torch.no_grad():
        out = pm(*args); rout = ref(*args)
    say("eval forward ratio", ratio(out, rout))
    full = pm.full_state_dict()
    for k, v in ref.state_dict().items():
        if v.is_floating_point() and ratio(full[k], v) > 1:
            say("state differs", k, ratio(full[k], v))


def t_eval_before_wrap():
    """model.eval() before auto_parallelize, then train()"""
    torch.manual_seed(0)
    model, args, y, lf = build("ae", 8)
    model.eval()
    ref = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, args, mesh={"dp": 2}, axis_roles={"dp": "ddp"}, time_limit_s=20)
    pm.train(); ref.train()
    l = pm.step(*args, target=y, loss_fn=lf)
    rl = lf(ref(*args), y); rl.backward()
    say("train after eval-trace ratio", ratio(l, rl.detach()))


def t_shape():
    model, ref, pm, args, y, lf = make("ae")
    pm.step(args[0][:6], target=y[:6], loss_fn=lf)


def t_shape_img():
    model, ref, pm, args, y, lf = make("ae")
    x = torch.rand(8, 3, 32, 32)
    pm.step(x, target=x, loss_fn=lf)


def t_target_batch():
    model, ref, pm, args, y, lf = make("gru")
    pm.step(*args, target=y[:4], loss_fn=lf)


def t_mesh4():
    make("ae", mesh={"dp": 4})


def t_batch1():
    make("ae", batch=1)


def t_batch_odd():
    model, ref, pm, args, y, lf = make("ae", batch=5)
    l = pm.step(*args, target=y, loss_fn=lf)
    rl = lf(ref(*args), y); rl.backward()
    say("batch 5 ratio", ratio(l, rl.detach()))


def t_other_plan():
    torch.manual_seed(0)
    model, args, y, lf = build("gru", 8)
    parallelizer.auto_parallelize(model, args, plan="/tmp/r9e-ae-ddp.json")


def t_nonscalar_loss():
    model, ref, pm, args, y, lf = make("ae")
    pm.step(*args, target=y, loss_fn=lambda o, t: F.mse_loss(o, t, reduction="none"))


def t_no_lossfn():
    model, ref, pm, args, y, lf = make("ae")
    pm.step(*args, target=y)


class LARS(torch.optim.Optimizer):
    """user-written layer-wise adaptive SGD (reads each whole tensor's norm)"""

    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                trust = p.norm() / (p.grad.norm() + 1e-8)
                p.add_(p.grad, alpha=-g["lr"] * float(trust))


class SignSGD(torch.optim.Optimizer):
    def __init__(self, params, lr=0.01):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-g["lr"])


def _opt_run(cls, roles, mesh, kind="gru"):
    model, ref, pm, args, y, lf = make(kind, roles=roles, mesh=mesh)
    opt = cls(pm.parameters()); ro = cls([p for p in ref.parameters() if p.requires_grad])
    for _ in range(2):
        opt.zero_grad(); pm.step(*args, target=y, loss_fn=lf); opt.step()
        ro.zero_grad(); lf(ref(*args), y).backward(); ro.step()
    full = pm.full_state_dict()
    say(cls.__name__, roles, "param ratio", max(ratio(full[k], v) for k, v in ref.state_dict().items() if v.is_floating_point()))


def t_lars_tp():
    _opt_run(LARS, {"tp": "tp"}, {"tp": 2})


def t_lars_ddp():
    _opt_run(LARS, {"dp": "ddp"}, {"dp": 2})


def t_sign_tp():
    _opt_run(SignSGD, {"tp": "tp"}, {"tp": 2})


def t_freeze_after():
    """freeze the GRU after wrapping (requires_grad_ on pm's parameters)"""
    model, ref, pm, args, y, lf = make("gru", roles={"tp": "tp"}, mesh={"tp": 2})
    for n, p in pm.named_parameters():
        if n.startswith("gru"):
            p.requires_grad_(False)
    for n, p in ref.named_parameters():
        if n.startswith("gru"):
            p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    ro = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        opt.zero_grad(); l = pm.step(*args, target=y, loss_fn=lf); opt.step()
        ro.zero_grad(); rl = lf(ref(*args), y); rl.backward(); ro.step()
    full = pm.full_state_dict()
    say("freeze-after loss ratio", ratio(l, rl.detach()), "params",
        max(ratio(full[k], v) for k, v in ref.state_dict().items() if v.is_floating_point()))


def t_double():
    model, ref, pm, args, y, lf = make("ae")
    pm.double()
    out = pm(args[0].double())
    say("double ok", out.dtype)


def t_compile():
    model, ref, pm, args, y, lf = make("ae")
    c = torch.compile(pm)
    out = c(*args)
    say("compile ratio", ratio(out, ref(*args)))


def t_model_after():
    """keep training the ORIGINAL model object after wrapping (forward+backward on model, step on pm's opt)"""
    model, ref, pm, args, y, lf = make("ae")
    opt = torch.optim.SGD(pm.parameters(), lr=0.5)
    opt.zero_grad(); lf(model(*args), y).backward(); opt.step()
    say("grads on pm after model backward:", sum(p.grad is not None for p in pm.parameters()))


def t_zero_grad_none():
    model, ref, pm, args, y, lf = make("ae")
    pm.zero_grad()
    l = pm.step(*args, target=y, loss_fn=lf)
    say("ok", l.item())


def t_vit_eval_shape():
    model, ref, pm, args, y, lf = make("vit", roles={"tp": "tp"}, mesh={"tp": 2})
    pm.eval(); ref.eval()
    with torch.no_grad():
        o = pm(args[0][:3]); r = ref(args[0][:3])
    say("vit eval batch 3", ratio(o.logits, r.logits))


def t_kwargs_call():
    model, ref, pm, args, y, lf = make("vit", roles={"tp": "tp"}, mesh={"tp": 2})
    o = pm(pixel_values=args[0]); r = ref(pixel_values=args[0])
    say("vit kw call", ratio(o.logits, r.logits))
    o = pm(args[0], interpolate_pos_encoding=False)
    say("vit default kw", ratio(o.logits, r.logits))


def t_vit_labels():
    """model's own loss (labels=) passed at step time but not at trace time"""
    model, ref, pm, args, y, lf = make("vit", roles={"tp": "tp"}, mesh={"tp": 2})
    l = pm.step(*args, labels=y)
    say("labels loss", l)


TESTS = {k[2:]: v for k, v in globals().items() if k.startswith("t_")}

if __name__ == "__main__":
    names = sys.argv[1:] or list(TESTS)
    for n in names:
        say(f"=== {n}: {(TESTS[n].__doc__ or '').strip()}")
        try:
            TESTS[n]()
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0][:400] if str(e) else ""
            say(f"  -> {type(e).__module__}.{type(e).__name__}: {msg}")
            if RANK == 0 and os.environ.get("TB"):
                traceback.print_exc()
        if dist.is_initialized():
            try:
                dist.barrier()
            except Exception as e:  # noqa: BLE001
                say("barrier failed", e)
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(0)
