"""Trial 4: checkpoint save on plan A, load on plan B (pipeline or not), compare with the run that never stopped.

Usage: python trial/ckpt_matrix.py CASESET   (see CASESETS at the bottom)
Each case: train 3 steps on `src`, save, train 2 more (losses L, full params P5); a model of another seed on
`dst` loads the checkpoint (params must equal P3 bitwise), trains the same 2 steps (losses within 1e-5 of L,
full params within 1e-5 of P5).
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

MODELS = {
    "gpt2": dict(n_layer=4, n_embd=32, n_head=4, vocab_size=200, batch=8, seq_len=8, labels=True),
    "llama": dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=200, batch=8, seq_len=8, labels=True),
}
FROZEN = {"gpt2": "transformer.wpe.weight", "llama": "model.norm.weight"}


def build(name: str, seed: int, frozen: bool = False, **over):
    from parallelizer import zoo
    cfg = dict(MODELS[name]); cfg.update(over)
    model, args, kwargs = getattr(zoo, name)(**cfg, seed=seed)
    if frozen:
        model.get_parameter(FROZEN[name]).requires_grad_(False)
    return model, args, kwargs


def batch(name: str, step: int):
    cfg = MODELS[name]
    ids = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq_len"]),
                        generator=torch.Generator().manual_seed(100 + step))
    return (ids,), {"labels": ids}


def make_opt(kind: str, pm):
    named = list(pm.named_parameters())
    params = [p for _, p in named]
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, eps=1e-6)
    if kind == "amsgrad":
        return torch.optim.Adam(params, lr=1e-3, amsgrad=True, weight_decay=0.01)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "groups":
        nodecay = [p for n, p in named if p.ndim < 2]
        decay = [p for n, p in named if p.ndim >= 2]
        return torch.optim.AdamW([{"params": decay, "lr": 1e-3, "weight_decay": 0.1},
                                  {"params": nodecay, "lr": 3e-3, "weight_decay": 0.0}], eps=1e-6)
    raise ValueError(kind)


def make_pm(model_name, plan_kw, seed, frozen, **over):
    from parallelizer import auto_parallelize
    model, args, kwargs = build(model_name, seed, frozen, **over)
    kw = dict(plan_kw)
    with contextlib.redirect_stdout(io.StringIO()):
        return auto_parallelize(model, args, example_kwargs=kwargs, **kw)


def train(model_name, pm, opt, steps, sched=None):
    losses = []
    for s in steps:
        args, kwargs = batch(model_name, s)
        opt.zero_grad()
        losses.append(pm.step(*args, **kwargs).item())
        opt.step()
        if sched is not None:
            sched.step()
    return losses


def run_case(rank, root: Path, case: dict) -> dict:
    from parallelizer import checkpoint
    m, frozen, okind = case["model"], case.get("frozen", False), case.get("opt", "adamw")
    use_sched = case.get("sched", False)
    pm, opt = None, None
    over = case.get("over", {})
    pm = make_pm(m, case["src"], 0, frozen, **over)
    opt = make_opt(okind, pm)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7) if use_sched else None
    train(m, pm, opt, range(3), sched)
    path = root / "ckpt"
    checkpoint.save(pm, opt, path)
    sched_state = sched.state_dict() if sched else None
    p3 = {k: v.clone() for k, v in pm.full_state_dict().items()}
    if case.get("export"):
        checkpoint.export_full_state_dict(pm, root / "export")
        dist.barrier()
        exported = checkpoint.read_full_state_dict(root / "export")
        ref = build(m, 5, frozen, **over)[0]
        res_strict = ref.load_state_dict(exported, strict=True)
        export_ok = all(torch.equal(ref.state_dict()[k], v) for k, v in p3.items())
    losses = train(m, pm, opt, range(3, 5), sched)
    p5 = {k: v.clone() for k, v in pm.full_state_dict().items()}
    out = {"losses": losses}
    if case.get("export"):
        out["export_ok"] = export_ok
    for di, dst in enumerate(case["dst"]):
        pm2 = make_pm(m, dst, 1, frozen, **over)
        opt2 = make_opt(okind, pm2)
        sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.7) if use_sched else None
        checkpoint.load(pm2, opt2, path)
        if sched2:
            sched2.load_state_dict(sched_state)
        q3 = pm2.full_state_dict()
        bitwise = sorted(q3) == sorted(p3) and all(torch.equal(q3[k], p3[k]) for k in p3)
        l2 = train(m, pm2, opt2, range(3, 5), sched2)
        q5 = pm2.full_state_dict()
        pdiff = max((q5[k] - p5[k]).abs().max().item() for k in p5)
        ldiff = max(abs(a - b) for a, b in zip(l2, losses))
        out[f"dst{di}"] = dict(bitwise=bitwise, ldiff=ldiff, pdiff=pdiff, losses=l2,
                               moved=max((p5[k] - p3[k]).abs().max().item() for k in p5))
    return out


def worker(rank, world, cases, root):
    import warnings
    warnings.filterwarnings("ignore")
    results = {}
    for name, case in cases.items():
        d = Path(root) / name
        t = time.time()
        try:
            results[name] = run_case(rank, d, case)
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": f"{type(e).__name__}: {e}"[:600], "tb": traceback.format_exc()[-1500:]}
        results[name]["s"] = round(time.time() - t, 1)
        dist.barrier()
    return results


def pp(pp_, schedule, mb=4, **kw):
    return dict(mesh={"pp": pp_, **kw.pop("mesh", {})}, schedule=schedule, microbatches=mb, **kw)


CASESETS = {}


def _register():
    G, L = "gpt2", "llama"
    ppdp = lambda s, **k: dict(mesh={"pp": 2, "dp": 2}, schedule=s, microbatches=4, **k)  # noqa: E731
    pptp = lambda s, **k: dict(mesh={"pp": 2, "tp": 2}, schedule=s, microbatches=4, **k)  # noqa: E731
    pp4 = lambda s, **k: dict(mesh={"pp": 4}, schedule=s, microbatches=4, **k)  # noqa: E731
    dp4 = dict(mesh={"dp": 4})
    tp4 = dict(mesh={"tp": 4})
    fsdptp = dict(mesh={"dp": 2, "tp": 2}, axis_roles={"dp": "fsdp", "tp": "tp"})
    CASESETS["a"] = {
        "g_bitpipe_ppdp_to_dp4": dict(model=G, src=ppdp("bitpipe"), dst=[dp4, pptp("zbv")], export=True),
        "l_dualpipev_pptp_to_fsdptp": dict(model=L, src=pptp("dualpipev"), dst=[fsdptp, ppdp("bitpipe")]),
    }
    CASESETS["b"] = {
        "g_interleaved_pp4_from": dict(model=G, src=pp4("interleaved_1f1b", virtual_stages=2),
                                       dst=[tp4, pptp("bitpipe")], opt="amsgrad", frozen=True,
                                       over={"n_layer": 8}),
        "l_zbv_pp4_sgd": dict(model=L, src=pp4("zbv"), dst=[ppdp("interleaved_1f1b", virtual_stages=2), dp4],
                              opt="sgd", over={"num_hidden_layers": 8}),
    }
    CASESETS["c"] = {
        "g_fsdptp_to_bitpipe_groups": dict(model=G, src=fsdptp, dst=[pp4("bitpipe"), pptp("dualpipev")], over={"n_layer": 8},
                                           opt="groups", sched=True, frozen=True),
        "l_tp4_to_pp_groups": dict(model=L, src=tp4, dst=[pp4("dualpipev"), ppdp("zbv")], opt="groups",
                                   export=True, over={"num_hidden_layers": 8}),
    }

    pp4m8 = lambda s, **k: dict(mesh={"pp": 4}, schedule=s, microbatches=8, **k)  # noqa: E731
    CASESETS["d"] = {
        "l_zbv_pp4_sgd": dict(model=L, src=pp4m8("zbv"), dst=[ppdp("interleaved_1f1b", virtual_stages=2), dp4],
                              opt="sgd", over={"num_hidden_layers": 8}),
        "l_tp4_to_dualpipev_pp4_groups": dict(model=L, src=tp4, dst=[pp4m8("dualpipev"), ppdp("zbv")],
                                              opt="groups", export=True, over={"num_hidden_layers": 8}),
    }


_register()

if __name__ == "__main__":
    from parallelizer.runtime import spawn
    which = sys.argv[1]
    cases = CASESETS[which]
    root = tempfile.mkdtemp(prefix=f"ckpt_{which}_")
    t = time.time()
    res = spawn(worker, 4, cases, root, timeout_s=float(sys.argv[2]) if len(sys.argv) > 2 else 300)
    for name in cases:
        per = [r[name] for r in res]
        errs = [r.get("error") for r in per if "error" in r]
        if errs:
            print(name, "ERROR", errs[0]); print(per[[("error" in r) for r in per].index(True)]["tb"])
            continue
        r0 = per[0]
        print(name, json.dumps({k: v for k, v in r0.items() if k != "losses"}))
        for k, v in r0.items():
            if k.startswith("dst") and (not all(r[k]["bitwise"] for r in per) or v["ldiff"] > 1e-5
                                        or max(r[k]["pdiff"] for r in per) > 1e-5):
                print("  MISMATCH", k, [(r[k]["bitwise"], r[k]["ldiff"], r[k]["pdiff"]) for r in per])
    print("total", round(time.time() - t, 1), "s")
