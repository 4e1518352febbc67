"""Checkpoint trial: train 1 step on plan A (pm.step), save; load on plan B; 1 more step on B vs eager 2 steps;
export_full_state_dict -> from_pretrained -> eager output equals B's parameters / eager reference."""
from __future__ import annotations
import contextlib, copy, io, json, os, sys, tempfile, traceback
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, torch.distributed as dist
import parallelizer
from parallelizer import checkpoint
from harness import build, diff, first


def mk(name, mesh, options):
    model, args, kwargs = build(name)
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, args, mesh=mesh, example_kwargs=kwargs or None, **options)
    return model, args, kwargs, pm


def worker(rank, world, name, a, b, root):
    try:
        out = {}
        model, args, kwargs, pm = mk(name, *a)
        reference = copy.deepcopy(build(name)[0])
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        loss = pm.step(*args, **kwargs); opt.step(); opt.zero_grad()
        rl = first(reference(*args, **kwargs)); rl.backward(); ref_opt.step(); ref_opt.zero_grad()
        out["loss1"] = abs(loss.item() - rl.item())
        checkpoint.save(pm, opt, os.path.join(root, "ck"))
        dist.barrier()
        model2, _, _, pm2 = mk(name, *b)  # fresh weights (same seed) then load
        opt2 = torch.optim.AdamW(pm2.parameters(), lr=1e-3)
        checkpoint.load(pm2, opt2, os.path.join(root, "ck"))
        out["params_after_load"] = diff(pm2, reference, False)
        loss2 = pm2.step(*args, **kwargs); opt2.step(); opt2.zero_grad()
        rl2 = first(reference(*args, **kwargs)); rl2.backward(); ref_opt.step(); ref_opt.zero_grad()
        out["loss2"] = abs(loss2.item() - rl2.item())
        out["params2"] = diff(pm2, reference, False)
        ex = os.path.join(root, "export")
        checkpoint.export_full_state_dict(pm2, ex, config=reference.config)
        dist.barrier()
        if rank == 0:
            cls = type(reference)
            loaded = cls.from_pretrained(ex)
            loaded.train(reference.training)
            with torch.no_grad():
                o1 = first(loaded(*args, **kwargs)); o2 = first(reference(*args, **kwargs))
                lg1 = loaded(*args, **kwargs).logits; lg2 = reference(*args, **kwargs).logits
            out["export_loss"] = abs(o1.item() - o2.item())
            out["export_logits"] = (lg1 - lg2).abs().max().item()
            sd1, sd2 = loaded.state_dict(), reference.state_dict()
            out["export_keys_equal"] = sorted(sd1) == sorted(sd2)
            out["export_state"] = max((sd1[k].float() - sd2[k].float()).abs().max().item() for k in sd2)
        dist.barrier()
        return out
    except Exception as e:
        return {"error": f"{type(e).__module__}.{type(e).__name__}: {str(e)[:800]}", "tb": traceback.format_exc()[-2000:]}


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    name = sys.argv[1]
    a = json.loads(sys.argv[2]); b = json.loads(sys.argv[3])
    root = tempfile.mkdtemp(prefix="ck_", dir="/tmp")
    res = spawn(worker, 4, name, a, b, root, timeout_s=500)
    errs = [r for r in res if "error" in r]
    if errs:
        print(name, a, b, "ERROR", errs[0]["error"], errs[0]["tb"])
    else:
        print(name, a, "->", b, {k: max(r.get(k, 0) for r in res) if not isinstance(res[0].get(k), bool) else res[0][k]
                                  for k in set().union(*res)})
