"""Trial h4: today's contract features on pipeline meshes (4 gloo ranks). Prints per mesh what each check gave."""
import contextlib, copy, io, sys, traceback
import torch
import torch.distributed as dist
import parallelizer
from parallelizer import zoo
from parallelizer.runtime.launch import spawn

GPT2 = dict(n_layer=4, n_embd=32, n_head=4, vocab_size=128, batch=8, seq_len=16)


def lm_loss(out, y):
    logits = out.logits if hasattr(out, "logits") else out[0]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def labels_of(ids):
    lab = torch.roll(ids, -1, 1); lab[:, -1] = -100; return lab


def err(fn):
    try:
        fn(); return "no error"
    except Exception as e:  # noqa
        return f"{type(e).__name__}: {str(e)[:150]}"


def body(rank, world, mesh, opts):
    r = {}
    torch.manual_seed(0)
    model, (ids,) = zoo.gpt2(**GPT2)
    ref = copy.deepcopy(model)
    lab = labels_of(ids)
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, **opts)
    sd0 = copy.deepcopy(ref.state_dict())

    def reset():
        pm.load_full_state_dict(sd0); ref.load_state_dict(sd0)
        for p in list(pm.parameters()) + list(ref.parameters()):
            p.grad = None

    def fulldiff():
        full = pm.full_state_dict(); rs = ref.state_dict()
        return max((full[k] - rs[k]).abs().max().item() for k in rs)

    # 1. GradScaler loop, scaled inside loss_fn, 2 steps, vs eager
    reset()
    sc, rsc = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8), torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    opt, ropt = torch.optim.AdamW(pm.parameters(), lr=1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2)
    try:
        for i in range(2):
            loss = pm.step(ids, target=lab, loss_fn=lambda o, y: sc.scale(lm_loss(o, y)), item_count=lambda y: (y != -100).sum())
            rl = rsc.scale(lm_loss(ref(ids), lab)); rl.backward()
            sc.unscale_(opt); rsc.unscale_(ropt)
            tn = torch.nn.utils.get_total_norm([p.grad for p in pm.parameters() if p.grad is not None])
            rtn = torch.nn.utils.get_total_norm([p.grad for p in ref.parameters() if p.grad is not None])
            torch.nn.utils.clip_grads_with_norm_(pm.parameters(), 0.5, tn)
            torch.nn.utils.clip_grads_with_norm_(ref.parameters(), 0.5, rtn)
            sc.step(opt); rsc.step(ropt); sc.update(); rsc.update(); opt.zero_grad(); ropt.zero_grad()
            r[f"scaler_loss{i}"] = abs(loss.item() - rl.item()) / rl.item()
            r[f"scaler_norm{i}"] = abs(tn.item() - rtn.item()) / rtn.item()
        r["scaler_params"] = fulldiff()
    except Exception as e:
        r["scaler"] = f"{type(e).__name__}: {str(e)[:200]}"
    # 2. inf injected into rank 0's gradient piece only
    reset()
    sc = torch.amp.GradScaler("cpu", init_scale=16.0)
    opt = torch.optim.SGD(pm.parameters(), lr=0.1)
    try:
        pm.step(ids, target=lab, loss_fn=lambda o, y: sc.scale(lm_loss(o, y)), item_count=lambda y: (y != -100).sum())
        if rank == 0:
            next(p for p in pm.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
        before = [p.detach().clone() for p in pm.parameters()]
        sc.step(opt); sc.update()
        moved = any(not torch.equal(a, b) for a, b in zip(before, pm.parameters()))
        r["inf"] = (moved, sc.get_scale())
    except Exception as e:
        r["inf"] = f"{type(e).__name__}: {str(e)[:200]}"
    opt.zero_grad()
    # 3. param-group overrides (no decay on 1-d), 2 steps
    reset()
    def groups(named):
        named = list(named)
        return [{"params": [p for n, p in named if p.ndim >= 2], "weight_decay": 0.3, "lr": 3e-2},
                {"params": [p for n, p in named if p.ndim < 2], "weight_decay": 0.0, "lr": 1e-2, "betas": (0.5, 0.9)}]
    try:
        opt, ropt = torch.optim.AdamW(groups(pm.named_parameters())), torch.optim.AdamW(groups(ref.named_parameters()))
        for i in range(2):
            pm.step(ids, target=lab, loss_fn=lm_loss); lm_loss(ref(ids), lab).backward()
            opt.step(); ropt.step(); opt.zero_grad(); ropt.zero_grad()
        r["groups_params"] = fulldiff()
    except Exception as e:
        r["groups"] = f"{type(e).__name__}: {str(e)[:200]}"
    reset()
    opt, ropt = torch.optim.AdamW(pm.parameters(), lr=3e-2, weight_decay=0.3), torch.optim.AdamW(ref.parameters(), lr=3e-2, weight_decay=0.3)
    for i in range(2):
        pm.step(ids, target=lab, loss_fn=lm_loss); lm_loss(ref(ids), lab).backward()
        opt.step(); ropt.step(); opt.zero_grad(); ropt.zero_grad()
    r["plain_same_lr_params"] = fulldiff()
    # 4. Adafactor
    reset()
    try:
        opt, ropt = torch.optim.Adafactor(pm.parameters(), lr=1e-2), torch.optim.Adafactor(ref.parameters(), lr=1e-2)
        for i in range(2):
            pm.step(ids, target=lab, loss_fn=lm_loss); lm_loss(ref(ids), lab).backward()
            opt.step(); ropt.step(); opt.zero_grad(); ropt.zero_grad()
        r["adafactor_params"] = fulldiff()
    except Exception as e:
        r["adafactor"] = f"{type(e).__name__}: {str(e)[:200]}"
    for p in pm.parameters():
        p.grad = None
    # 5. ZeRO / DDP around
    def zero():
        from torch.distributed.optim import ZeroRedundancyOptimizer
        o = ZeroRedundancyOptimizer(list(pm.parameters()), optimizer_class=torch.optim.AdamW, lr=1e-2)
        pm.step(ids, target=lab, loss_fn=lm_loss); o.step(); o.zero_grad()
    r["zero"] = err(zero)
    for p in pm.parameters():
        p.grad = None
    r["ddp"] = err(lambda: torch.nn.parallel.DistributedDataParallel(pm))
    # 6. torch.nn.init over stage parameters (every rank seeded alike), then does pm still equal its full state?
    reset()
    torch.manual_seed(1)
    def init():
        for n, p in pm.named_parameters():
            if p.ndim >= 2:
                torch.nn.init.normal_(p, std=0.02)
    r["init"] = err(init)
    if r["init"] == "no error":
        full = pm.full_state_dict(); ref.load_state_dict(full)
        loss = pm.step(ids, target=lab, loss_fn=lm_loss); rl = lm_loss(ref(ids), lab)
        r["init_loss_vs_full_state"] = abs(loss.item() - rl.item())
        for p in pm.parameters():
            p.grad = None
    # 7. isinstance loop: dropout p, layernorm eps
    def iso(cls, attr, val):
        def f():
            hit = 0
            for m in pm.modules():
                if isinstance(m, cls):
                    setattr(m, attr, val); hit += 1
            pm.step(ids, target=lab, loss_fn=lm_loss)
            return hit
        return f
    r["dropout_p"] = err(iso(torch.nn.Dropout, "p", 0.3))
    return r


def main_body(rank, world, cases):
    out = {}
    for name, (mesh, opts) in cases.items():
        try:
            out[name] = body(rank, world, mesh, opts)
        except Exception as e:
            out[name] = "CRASH " + traceback.format_exc()[-1500:]
        dist.barrier()
    return out


if __name__ == "__main__":
    which = sys.argv[1:] or ["pp2dp2", "pp2tp2", "pp4bit", "dp2tp2"]
    all_cases = {
        "pp2dp2": ({"pp": 2, "dp": 2}, {"schedule": "1f1b"}),
        "pp2tp2": ({"pp": 2, "tp": 2}, {"schedule": "1f1b"}),
        "pp2tp2zbv": ({"pp": 2, "tp": 2}, {"schedule": "zbv", "microbatches": 4}),
        "pp4bit": ({"pp": 2, "dp": 2}, {"schedule": "bitpipe", "microbatches": 2}),
        "pp4zbv": ({"pp": 4}, {"schedule": "zbv"}),
        "pp4i1f1b": ({"pp": 4}, {"schedule": "interleaved_1f1b"}),
        "dp2tp2fsdp": ({"dp": 2, "tp": 2}, {"axis_roles": {"dp": "fsdp", "tp": "tp"}}),
        "dp2tp2ddp": ({"dp": 2, "tp": 2}, {"axis_roles": {"dp": "ddp", "tp": "tp"}}),
    }
    cases = {k: all_cases[k] for k in which if k in all_cases}
    res = spawn(main_body, 4, cases, timeout_s=150)
    for name in cases:
        print("==", name)
        for rk, rr in enumerate(res):
            print("  rank", rk, rr[name])
