"""User-loop probes on 2 ranks: (a) a batch of another size / sequence length at step 2, (b) torch.no_grad()
inference on the ParallelModule vs eager, (c) model.bfloat16() / model.half() before planning, one step vs one
device in the same dtype. python -m trial.loop5b"""
from __future__ import annotations

import copy
import warnings

import torch
import transformers as tf

import parallelizer
from parallelizer.runtime.launch import spawn

V = 128


def model_fn():
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=V, max_position_embeddings=64)
    return tf.LlamaForCausalLM(cfg)


def ids_of(b, t, seed=1):
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def probe(rank, world, mesh, roles):
    warnings.filterwarnings("ignore")
    out = {}
    model = model_fn()
    ref = copy.deepcopy(model)
    ids = ids_of(4, 8)
    pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, axis_roles=roles, example_kwargs={"labels": ids},
                                       time_limit_s=30)
    # (b) no_grad inference
    with torch.no_grad():
        o = pm(ids, labels=ids)
        r = ref(ids, labels=ids)
    out["no_grad logits diff"] = (o.logits - r.logits).abs().max().item()
    out["no_grad loss diff"] = (o.loss - r.loss).abs().item()
    out["no_grad output requires_grad"] = o.loss.requires_grad
    pm.eval()
    ref.eval()
    with torch.no_grad():
        o = pm(ids, labels=ids)
        r = ref(ids, labels=ids)
    out["eval no_grad loss diff"] = (o.loss - r.loss).abs().item()
    pm.train()
    # (a) other batch sizes / lengths
    for b, t in [(2, 8), (4, 12), (6, 8), (4, 4)]:
        x = ids_of(b, t, seed=3)
        try:
            o = pm(x, labels=x)
            r = ref(x, labels=x)
            out[f"batch {b}x{t}"] = f"RAN, loss diff {(o.loss - r.loss).abs().item():.3g}"
        except Exception as e:  # noqa: BLE001
            out[f"batch {b}x{t}"] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def probe_dtype(rank, world, mesh, roles, dtype):
    warnings.filterwarnings("ignore")
    model = model_fn().to(dtype)
    ref = copy.deepcopy(model)
    ids = ids_of(4, 8)
    try:
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, axis_roles=roles, example_kwargs={"labels": ids},
                                           time_limit_s=30)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    losses = []
    for s in range(2):
        lo = pm(ids, labels=ids).loss
        lo.backward()
        opt.step(); opt.zero_grad()
        lr_ = ref(ids, labels=ids).loss
        lr_.backward()
        ropt.step(); ropt.zero_grad()
        losses.append((lo.item(), lr_.item()))
    full = pm.full_state_dict()
    sd = ref.state_dict()
    pd = max((full[k].float() - sd[k].float()).abs().max().item() for k in sd if k in full)
    scale = max(sd[k].float().abs().max().item() for k in sd)
    return {"losses": losses, "param diff": pd, "param scale": scale, "dtypes": sorted({str(v.dtype) for v in full.values()})}


if __name__ == "__main__":
    for mesh, roles in [({"tp": 2}, {"tp": "tp"}), ({"dp": 2}, {"dp": "fsdp"}), ({"dp": 2}, {"dp": "ddp"})]:
        try:
            res = spawn(probe, 2, mesh, roles, timeout_s=300)
            print(mesh, roles, res[0], flush=True)
        except Exception as e:  # noqa: BLE001
            print(mesh, roles, "ERROR", str(e)[-800:], flush=True)
    for dtype in (torch.bfloat16, torch.float16):
        for mesh, roles in [({"tp": 2}, {"tp": "tp"}), ({"dp": 2}, {"dp": "fsdp"})]:
            try:
                res = spawn(probe_dtype, 2, mesh, roles, dtype, timeout_s=300)
                print(dtype, mesh, roles, res, flush=True)
            except Exception as e:  # noqa: BLE001
                print(dtype, mesh, roles, "ERROR", str(e)[-800:], flush=True)
