"""auto_parallelize + AdamW loop on gloo ranks vs eager, for a few trial3b patterns; also a second call with
another batch size (expect a typed error). usage: loop3.py WS mesh roles names..."""
import copy, sys, warnings, contextlib, io, json
warnings.filterwarnings("ignore")
import torch
import parallelizer
from parallelizer.runtime.launch import spawn
import patterns3


def body(rank, ws, mesh, roles, names):
    out = {}
    for name in names:
        try:
            m, a, *kw = patterns3.PATTERNS[name](); kw = kw[0] if kw else {}
            ref = copy.deepcopy(m)
            with contextlib.redirect_stdout(io.StringIO()):
                pm = parallelizer.auto_parallelize(m, a, mesh=mesh, axis_roles=roles, example_kwargs=kw)
            opt = torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=1e-3)
            ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=1e-3)
            lossd = 0.0
            for step in range(3):
                o = pm(*a, **kw); ro = ref(*a, **kw)
                l = patterns3_loss(o); rl = patterns3_loss(ro)
                lossd = max(lossd, (l.detach() - rl.detach()).abs().item())
                l.backward(); rl.backward()
                opt.step(); ropt.step(); opt.zero_grad(); ropt.zero_grad()
            sd = pm.full_state_dict(); rsd = ref.state_dict()
            pd = max(((sd[k].double() - rsd[k].double()).abs().max().item(), k) for k in rsd if rsd[k].numel())
            msg = f"loss {lossd:.2e} state {pd[0]:.2e} ({pd[1]})"
            # other batch size
            try:
                a2 = tuple(t[:-1] if isinstance(t, torch.Tensor) and t.ndim and t.shape[0] == a[0].shape[0] else t for t in a)
                pm(*a2, **kw)
                msg += " | short batch: ACCEPTED"
            except Exception as e:
                msg += f" | short batch: {type(e).__name__}: {str(e)[:150]}"
            out[name] = msg
        except Exception as e:
            import traceback
            out[name] = f"ERROR {type(e).__module__}.{type(e).__name__}: {str(e)[:600]}"
    return out


def patterns3_loss(o):
    from torch.utils import _pytree as pytree
    first = next(t for t in pytree.tree_leaves(o) if isinstance(t, torch.Tensor))
    return first if first.ndim == 0 else first.float().pow(2).mean()


if __name__ == "__main__":
    ws = int(sys.argv[1]); mesh = json.loads(sys.argv[2]); roles = json.loads(sys.argv[3]); names = sys.argv[4:]
    res = spawn(body, ws, mesh, roles, names, timeout_s=1200)
    for name in names:
        print(f"{name:22s} {roles}", " || ".join(f"r{r}: {res[r][name]}" for r in range(ws)), flush=True)
