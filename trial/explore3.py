"""Pipeline and mixed meshes: today's fixes (optimizer refusals, inputs requiring grad) and this round's
apply / nn.init / load_state_dict checks, on 4 ranks."""
import copy, sys, traceback, warnings
import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F

import parallelizer
from parallelizer import zoo


def build():
    return zoo.gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=100, batch=4, seq_len=8)


def loss_fn(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def body(rank, world, meshes):
    warnings.simplefilter("ignore")
    out = {}
    for mname, mesh, roles in meshes:
        def fresh():
            model, (ids,) = build()
            pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, axis_roles=roles)
            return model, ids, pm
        probes = {}

        def p_adamw():
            model, ids, pm = fresh(); ref = copy.deepcopy(model)
            opt = torch.optim.AdamW(pm.parameters(), lr=1e-2); ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
            for _ in range(2):
                l = pm.step(ids, target=ids, loss_fn=loss_fn); opt.step(); opt.zero_grad()
                lr = loss_fn(ref(ids), ids); lr.backward(); ropt.step(); ropt.zero_grad()
            full = pm.full_state_dict(); sd = ref.state_dict()
            return max((full[k] - sd[k]).abs().max().item() for k in full)

        def p_adafactor():
            model, ids, pm = fresh()
            opt = torch.optim.Adafactor(pm.parameters(), lr=1e-2)
            pm.step(ids, target=ids, loss_fn=loss_fn); opt.step()

        def p_lbfgs():
            model, ids, pm = fresh()
            opt = torch.optim.LBFGS(pm.parameters())
            opt.step(lambda: pm.step(ids, target=ids, loss_fn=loss_fn))

        def p_input_requires_grad():
            model, ids, pm = fresh()
            pm.step(ids, target=ids.float().requires_grad_(), loss_fn=lambda o, y: o.logits.mean() + y.mean() * 0)

        def p_apply():
            model, ids, pm = fresh()
            pm.apply(lambda m: nn.init.zeros_(m.weight) if isinstance(m, nn.Linear) else None)

        def p_init_xavier():
            model, ids, pm = fresh()
            for p in pm.parameters():
                if p.dim() == 2:
                    nn.init.xavier_uniform_(p)
            return "no error"

        def p_load_state_dict_full():
            model, ids, pm = fresh()
            return str(pm.load_state_dict(model.state_dict(), strict=False))[:200]

        def p_autograd_grad():
            model, ids, pm = fresh()
            return pm(ids)

        for k, fn in dict(locals()).items():
            if k.startswith("p_"):
                try:
                    out[(mname, k[2:])] = ("ok", fn())
                except Exception as e:
                    out[(mname, k[2:])] = ("raise", f"{type(e).__module__}.{type(e).__name__}: {str(e)[:260]}",
                                           traceback.format_exc()[-1500:])
                dist.barrier()
    return out


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    meshes = [("pp2xdp2", {"pp": 2, "dp": 2}, {"dp": "ddp"}), ("pp2xtp2", {"pp": 2, "tp": 2}, {"tp": "tp"}),
              ("dp2xtp2", {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})]
    res = spawn(body, 4, meshes, timeout_s=900)
    for key in res[0]:
        vals = [r[key][:2] for r in res]
        print(key, vals[0] if all(v == vals[0] for v in vals) else vals)
    if "-v" in sys.argv:
        for key, v in res[0].items():
            if v[0] == "raise":
                print("=====", key); print(v[2])
