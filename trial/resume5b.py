"""A user's loop: auto_parallelize on mesh A with param groups (no weight decay on biases / norms), 3 AdamW steps,
checkpoint.save (model + optimizer), a fresh model on mesh B, checkpoint.load, 2 more steps; parameters and
AdamW state (exp_avg, exp_avg_sq, step) against one device doing all 5 steps. python -m trial.resume5b [case...]"""
from __future__ import annotations

import copy
import os
import shutil
import sys
import warnings

import torch
import transformers as tf

import parallelizer
from parallelizer import checkpoint
from parallelizer.runtime.launch import spawn

B, T, V = 4, 8, 128
LR = 1e-2


def model_fn(seed=0):
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=V, max_position_embeddings=64, tie_word_embeddings=True,
                         attention_bias=True, mlp_bias=True)
    return tf.LlamaForCausalLM(cfg)


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = ids.clone()
    labels[0, 5:] = -100
    return ids, labels


def groups(named):
    decay, no_decay = [], []
    for n, p in named:
        (no_decay if ("bias" in n or "norm" in n) else decay).append(p)
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def reference(steps):
    m = model_fn()
    opt = torch.optim.AdamW(groups(m.named_parameters()), lr=LR, eps=1e-3)
    for s in range(steps):
        ids, labels = batch(s)
        m(ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    names = {id(p): n for n, p in m.named_parameters()}
    state = {f"{names[id(p)]}.{k}": v for p, st in opt.state.items() for k, v in st.items()}
    return m.state_dict(), state


def make(mesh, roles, seed):
    model = model_fn(seed)
    ids, labels = batch(0)
    if "pp" in mesh:
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, example_kwargs={"labels": labels}, axis_roles=roles,
                                           time_limit_s=30)
    else:
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, example_kwargs={"labels": labels}, axis_roles=roles,
                                           time_limit_s=30)
    named = pm.named_parameters()
    opt = torch.optim.AdamW(groups(named), lr=LR, eps=1e-3)
    return pm, opt


def train(pm, opt, steps):
    for s in steps:
        ids, labels = batch(s)
        pm.step(ids, labels=labels)
        opt.step()
        opt.zero_grad()


def rank_fn(rank, world, mesh_a, roles_a, mesh_b, roles_b, path):
    warnings.filterwarnings("ignore")
    pm, opt = make(mesh_a, roles_a, 0)
    train(pm, opt, range(3))
    checkpoint.save(pm, opt, path)
    torch.distributed.barrier()
    pm2, opt2 = make(mesh_b, roles_b, 0)  # same weights (check_same_weights), values overwritten by load
    with torch.no_grad():
        for p in pm2.parameters():
            p.add_(1.0)  # make sure load overwrites them
    checkpoint.load(pm2, opt2, path)
    train(pm2, opt2, range(3, 5))
    full = {k: v.clone() for k, v in pm2.full_state_dict().items()}
    checkpoint.save(pm2, opt2, path + "-end")
    torch.distributed.barrier()
    return full


def main(cases):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    ref_sd, ref_state = reference(5)
    for name, world, mesh_a, roles_a, mesh_b, roles_b in cases:
        path = f"/tmp/t5b_ckpt_{name}"
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(path + "-end", ignore_errors=True)
        try:
            fulls = spawn(rank_fn, world, mesh_a, roles_a, mesh_b, roles_b, path, timeout_s=600)
        except Exception as e:  # noqa: BLE001
            print(name, "ERROR", type(e).__name__, str(e)[-1500:], flush=True)
            continue
        pdiff = max((fulls[r][k].float() - ref_sd[k].float()).abs().max().item() for r in range(world) for k in ref_sd
                    if k in fulls[r])
        missing = [k for k in ref_sd if k not in fulls[0]]
        rep = max((fulls[r][k] - fulls[0][k]).abs().max().item() for r in range(world) for k in fulls[0])
        dcp_to_torch_save(path + "-end", path + "-end.pt")
        saved = torch.load(path + "-end.pt", weights_only=False)
        osd = saved["optimizer"]
        sdiff, worst = 0.0, ""
        for k, v in ref_state.items():
            got = osd.get(f"state.{k}")
            if got is None:
                worst = f"missing state.{k}"
                sdiff = float("inf")
                break
            d = (torch.as_tensor(got).float() - v.float()).abs().max().item()
            if d > sdiff:
                sdiff, worst = d, k
        wd = {k: v for k, v in osd.items() if k.startswith("param_groups.") and k.endswith(".weight_decay") and "decoupled" not in k}
        bad_wd = [k for k, v in wd.items() if (v == 0.0) != ("bias" in k or "norm" in k)]
        print(f"{name}: params vs one device {pdiff:.3g}; replicas across ranks {rep:.3g}; AdamW state {sdiff:.3g} "
              f"({worst}); missing {missing[:3]}; groups with wrong weight_decay {bad_wd[:3]}", flush=True)


CASES = {"fsdp2_to_tp2": (2, {"dp": 2}, {"dp": "fsdp"}, {"tp": 2}, {"tp": "tp"}),
         "tp2_to_pp2": (2, {"tp": 2}, {"tp": "tp"}, {"pp": 2}, None),
         "pp2_to_fsdp2": (2, {"pp": 2}, None, {"dp": 2}, {"dp": "fsdp"}),
         "dp2tp2_to_pp2dp2": (4, {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, {"pp": 2, "dp": 2}, None)}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    main([(n, *CASES[n]) for n in names])
