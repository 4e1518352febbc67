"""Round 9 (d): the README's training loop (auto_parallelize + pm.step, grad accumulation over 2 calls,
clip_grad_norm_(0.5), AdamW, 3 steps) on models using the new rows, vs the same loop on one device."""
import contextlib, copy, io, sys
sys.path.insert(0, "trial")
import torch
import parallelizer
from parallelizer.runtime.launch import spawn
import r9d_models


def body(rank, world, cases):
    out = {}
    for name, mesh, batch in cases:
        torch.manual_seed(0)
        model, inputs = r9d_models.BUILDERS[name](batch=batch)
        ref = copy.deepcopy(model)
        with contextlib.redirect_stdout(io.StringIO()):
            pm = parallelizer.auto_parallelize(model, inputs, mesh=mesh, axis_roles={k: v for k, v in {"dp": "fsdp" if name in ("unet", "clip") else "ddp", "tp": "tp"}.items() if k in mesh})
        opt, ropt = torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=1e-3), torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=1e-3)
        worst = {"loss": 0.0, "norm": 0.0, "params": 0.0}
        for step in range(3):
            g = torch.Generator().manual_seed(100 + step)
            batches = [tuple(t + 0.1 * torch.randn(t.shape, generator=g) if t.is_floating_point() else t for t in inputs)
                       for _ in range(2)]
            losses, rl = [], []
            for b in batches:  # accumulate 2 calls (gradients add, as two backward() calls)
                losses.append(pm.step(*b))
                r = ref(*b)
                r.backward()
                rl.append(r.detach())
            norm = pm.clip_grad_norm_(0.5)
            rnorm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            opt.step(); opt.zero_grad(); ropt.step(); ropt.zero_grad()
            worst["loss"] = max(worst["loss"], float((sum(losses) - sum(rl)).abs()))
            worst["norm"] = max(worst["norm"], float((norm - rnorm).abs()))
        full = pm.full_state_dict()
        for k, v in ref.state_dict().items():
            if k in full:
                worst["params"] = max(worst["params"], float((full[k] - v).abs().max()))
        worst["kind"] = type(pm).__name__
        worst["rnorm"] = float(rnorm)
        out[f"{name} {mesh}"] = worst
    return out


if __name__ == "__main__":
    world = int(sys.argv[1])
    cases = {4: [("unet", {"dp": 2, "tp": 2}, 4), ("srgan", {"dp": 4}, 4), ("clip", {"dp": 2, "tp": 2}, 4),
                 ("kl_stack", {"pp": 2, "dp": 2}, 8), ("vae", {"pp": 2, "dp": 2}, 8)],
             3: [("unet", {"dp": 3}, 4), ("seq2seq", {"dp": 3}, 4)]}[world]
    res = spawn(body, world, cases, timeout_s=900)
    for k in res[0]:
        print(k, {kk: max(r[k][kk] for r in res) if isinstance(res[0][k][kk], float) else res[0][k][kk] for kk in res[0][k]})
