"""Default configs (dropout as configured): train 3 AdamW steps through auto_parallelize on each mesh and compare
every rank's full_state_dict() (replicas must stay equal). python -m trial.replicas5b [families...]"""
from __future__ import annotations

import contextlib
import io
import sys
import warnings

import torch

import parallelizer
from parallelizer.runtime.launch import spawn
from trial.hf5b import build

MESHES = [({"tp": 2}, {"tp": "tp"}), ({"dp": 2}, {"dp": "ddp"})]


def rank_fn(rank, world, families, mesh, roles):
    warnings.filterwarnings("ignore")
    out = {}
    for f in families:
        try:
            model, args, kwargs = build(f, default=True)
            with contextlib.redirect_stdout(io.StringIO()):
                pm = parallelizer.auto_parallelize(model, args, example_kwargs=kwargs, mesh=mesh, axis_roles=roles,
                                                   time_limit_s=20)
            opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
            for _ in range(3):
                o = pm(*args, **kwargs)
                loss = o[0] if isinstance(o, (tuple, list)) or hasattr(o, "to_tuple") else o
                if loss.dim():
                    loss = loss.float().pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            out[f] = {k: v.detach().clone() for k, v in pm.full_state_dict().items()}
        except Exception as e:  # noqa: BLE001
            out[f] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


if __name__ == "__main__":
    fams = sys.argv[1:] or ["data2vec_text", "fnet", "sew", "perceiver", "modernbert", "blip_text", "patchtst",
                            "siglip", "gemma3", "phimoe"]
    for mesh, roles in MESHES:
        res = spawn(rank_fn, 2, fams, mesh, roles, timeout_s=900)
        for f in fams:
            a, b = res[0][f], res[1][f]
            if isinstance(a, str) or isinstance(b, str):
                print(mesh, f, "ERROR", a if isinstance(a, str) else b, flush=True)
                continue
            d = max(((a[k].float() - b[k].float()).abs().max().item(), k) for k in a)
            print(mesh, f, f"replica diff across ranks {d[0]:.3g} ({d[1]})", flush=True)
