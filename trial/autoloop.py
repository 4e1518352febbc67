"""auto_parallelize + a user AdamW loop (with clip_grad_norm_) against eager, for a few trial models.
Usage: python -m trial.autoloop"""
import contextlib
import copy
import io

import os

import torch

import parallelizer
from parallelizer.runtime.launch import spawn
from trial import models as M

EPS = float(os.environ.get("TRIAL_EPS", "1e-8"))
CASES = [("m_as_strided", {"tp": 3}, {"tp": "tp"}), ("m_merge_view", {"tp": 3}, {"tp": "tp"}),
         ("spectral_old", {"dp": 2}, {"dp": "ddp"}), ("spectral_new", {"tp": 2}, {"tp": "tp"}),
         ("attn_alibi", {"tp": 2}, {"tp": "tp"}), ("twice_gates", {"dp": 2}, {"dp": "fsdp"}),
         ("batch_var2", {"dp": 2}, {"dp": "fsdp"}), ("norm_gn", {"tp": 2}, {"tp": "tp"}),
         ("attn_plain_cross", {"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}),
         ("m_heads_softmax", {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})]


def body(rank, world, names):
    out = []
    for name, mesh, roles in CASES:
        if names and name not in names or (mesh.get("dp", 1) * mesh.get("tp", 1)) != world:
            continue
        fn = M.BUILDERS[name]
        torch.manual_seed(0)
        model, inputs = fn()
        ref = copy.deepcopy(model)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                pm = parallelizer.auto_parallelize(model, inputs, mesh=mesh, axis_roles=roles)
            opt = torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=EPS)
            ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=EPS)
            worst = 0.0
            for step in range(3):
                xs = tuple(t + 0.1 * step if t.is_floating_point() else t for t in inputs)
                loss = pm(*xs).pow(2).mean()
                loss.backward()
                n = pm.clip_grad_norm_(1.0)
                opt.step(); opt.zero_grad()
                rloss = ref(*xs).pow(2).mean()
                rloss.backward()
                rn = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
                ropt.step(); ropt.zero_grad()
                worst = max(worst, abs(loss.item() - rloss.item()), abs(n.item() - rn.item()))
            sd = pm.full_state_dict()
            rsd = ref.state_dict()
            pdiff, key = max(((sd[k].double() - rsd[k].double()).abs().max().item(), k) for k in rsd
                             if rsd[k].is_floating_point())
            out.append((name, mesh, f"loss/norm diff {worst:.2e}, state diff after 3 steps {pdiff:.2e} ({key}; eps {EPS})"))
        except Exception as e:  # noqa: BLE001
            out.append((name, mesh, f"ERROR {type(e).__name__}: {str(e)[:300]}"))
    return out


if __name__ == "__main__":
    import sys
    for w in (2, 3, 4):
        for name, mesh, res in spawn(body, w, sys.argv[1:], timeout_s=600)[0]:
            print(name, mesh, res, flush=True)
