"""Part 2: two models of my own (not from the zoo) and a new user's mistakes, on 2 gloo ranks.

Run: PYTHONPATH=. python trial/p2_models.py   (rank bodies at module level; results printed by the parent)
"""
import copy, os, sys, tempfile, traceback, warnings
import torch, torch.nn as nn, torch.nn.functional as F
import parallelizer
from parallelizer.runtime import spawn


class SkipConvNet(nn.Module):
    """A small conv encoder / decoder with BatchNorm, a skip connection (cat), nearest upsampling, a
    registered buffer counting calls, and a classification head."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.BatchNorm2d(2 * c), nn.GELU())
        self.dec = nn.Conv2d(3 * c, c, 3, padding=1)
        self.head = nn.Linear(c, classes)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        a = self.enc1(x)
        b = self.enc2(a)
        u = F.interpolate(b, scale_factor=2, mode="nearest")
        d = torch.relu(self.dec(torch.cat([a, u], dim=1)))
        return self.head(d.mean(dim=(2, 3)))


class TwoTower(nn.Module):
    """A recommender: user and item embeddings, a dot product and an MLP on their concatenation, LayerNorm,
    dropout, and a fixed (registered) temperature."""

    def __init__(self, users=37, items=53, d=24):
        super().__init__()
        self.u = nn.Embedding(users, d)
        self.i = nn.Embedding(items, d)
        self.mlp = nn.Sequential(nn.Linear(2 * d, 4 * d), nn.LayerNorm(4 * d), nn.SiLU(), nn.Dropout(0.0),
                                 nn.Linear(4 * d, 1))
        self.register_buffer("temperature", torch.tensor(0.7))

    def forward(self, user, item):
        eu, ei = self.u(user), self.i(item)
        dot = (eu * ei).sum(-1, keepdim=True) / self.temperature
        return (dot + self.mlp(torch.cat([eu, ei], -1))).squeeze(-1)


def ratio(a, b, rtol=1.3e-6, atol=1e-5):
    return float(((a - b).abs() / (atol + rtol * b.abs())).max())


def _conv_data(n):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def _tt_data(n):
    g = torch.Generator().manual_seed(2)
    return torch.randint(0, 37, (n,), generator=g), torch.randint(0, 53, (n,), generator=g), torch.randn(n, generator=g)


def train_compare(pm, ref, inputs, loss_of, steps=2):
    """SGD steps (lr 0.1; AdamW would turn the float32 rounding of a conv bias before BatchNorm, whose true
    gradient is 0, into +-lr) on pm and on the eager reference: worst ratio over losses and parameters."""
    opt, ropt = torch.optim.SGD(pm.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    worst = 0.0
    for _ in range(steps):
        loss = loss_of(pm(*inputs[:-1]), inputs[-1]); loss.backward()
        rloss = loss_of(ref(*inputs[:-1]), inputs[-1]); rloss.backward()
        worst = max(worst, ratio(loss.detach(), rloss.detach()))
        full = pm.full_state_dict()
        opt.step(); ropt.step(); opt.zero_grad(); ropt.zero_grad()
    full = pm.full_state_dict()
    for k, v in ref.state_dict().items():
        if v.is_floating_point():
            worst = max(worst, ratio(full[k], v))
    ev = []
    return worst


def body(rank, world):
    out = {}

    def attempt(name, fn):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                res = fn()
            except Exception as e:
                res = f"{type(e).__name__}: {str(e)[:400]}"
        ws = sorted({f"{x.category.__name__}: {str(x.message)[:200]}" for x in w
                     if "parallelizer" in x.filename or x.category.__module__.startswith("parallelizer")})
        out[name] = (res, ws)

    # 1. model A, defaults (a new user's first call)
    def a_defaults():
        torch.manual_seed(0); m = SkipConvNet(); ref = copy.deepcopy(m)
        x, y = _conv_data(8)
        pm = parallelizer.auto_parallelize(m, (x,))
        return f"idle={pm.plan.idle_axes()} ratio={train_compare(pm, ref, (x, y), F.cross_entropy):.3f}"
    attempt("A defaults dp=2", a_defaults)

    def a_ddp():
        torch.manual_seed(0); m = SkipConvNet(); ref = copy.deepcopy(m)
        x, y = _conv_data(6)
        pm = parallelizer.auto_parallelize(m, (x,), axis_roles={"dp": "ddp"})
        r = train_compare(pm, ref, (x, y), F.cross_entropy)
        pm.eval(); ref.eval()
        r2 = ratio(pm(x).detach(), ref(x).detach())
        calls = (int(pm.state_dict()["calls"]), int(ref.calls))
        return f"train ratio={r:.3f} eval ratio={r2:.3f} calls(pm, eager)={calls}"
    attempt("A ddp batch 6 + eval", a_ddp)

    def a_fsdp_uneven():
        torch.manual_seed(0); m = SkipConvNet(); ref = copy.deepcopy(m)
        x, y = _conv_data(5)
        pm = parallelizer.auto_parallelize(m, (x,), axis_roles={"dp": "fsdp"})
        return f"ratio={train_compare(pm, ref, (x, y), F.cross_entropy):.3f}"
    attempt("A fsdp batch 5 (uneven)", a_fsdp_uneven)

    def a_other_batch():
        torch.manual_seed(0); m = SkipConvNet()
        x, _ = _conv_data(8)
        pm = parallelizer.auto_parallelize(m, (x,), axis_roles={"dp": "ddp"})
        return str(pm(_conv_data(4)[0]).shape)
    attempt("A other batch at run time", a_other_batch)

    def a_other_hw():
        torch.manual_seed(0); m = SkipConvNet()
        x, _ = _conv_data(8)
        pm = parallelizer.auto_parallelize(m, (x,), axis_roles={"dp": "ddp"})
        return str(pm(torch.randn(8, 3, 16, 16)).shape)
    attempt("A other image size at run time", a_other_hw)

    def wrong_mesh():
        torch.manual_seed(0)
        return str(parallelizer.auto_parallelize(SkipConvNet(), (_conv_data(8)[0],), mesh={"dp": 4}).plan.mesh)
    attempt("wrong mesh dp=4 on 2 ranks", wrong_mesh)

    def typo_role():
        torch.manual_seed(0)
        return str(parallelizer.auto_parallelize(SkipConvNet(), (_conv_data(8)[0],), axis_roles={"data": "ddp"}).plan.mesh)
    attempt("role on an axis not in the mesh", typo_role)

    def bad_role():
        torch.manual_seed(0)
        return str(parallelizer.auto_parallelize(SkipConvNet(), (_conv_data(8)[0],), axis_roles={"dp": "zero3"}).plan.mesh)
    attempt("unknown role name", bad_role)

    def unseeded():
        m = SkipConvNet()  # no seed: ranks differ
        return str(parallelizer.auto_parallelize(m, (_conv_data(8)[0],)).plan.mesh)
    attempt("weights differ across ranks", unseeded)

    # 2. model B
    def b_tp():
        torch.manual_seed(0); m = TwoTower(); ref = copy.deepcopy(m)
        u, i, t = _tt_data(8)
        pm = parallelizer.auto_parallelize(m, (u, i), mesh={"tp": 2}, axis_roles={"tp": "tp"})
        return f"ratio={train_compare(pm, ref, (u, i, t), F.mse_loss):.3f} fallbacks={[f.op for f in pm.plan.fallbacks]}"
    attempt("B tp=2", b_tp)

    def b_fsdp():
        torch.manual_seed(0); m = TwoTower(); ref = copy.deepcopy(m)
        u, i, t = _tt_data(7)
        pm = parallelizer.auto_parallelize(m, (u, i), axis_roles={"dp": "fsdp"})
        return f"ratio={train_compare(pm, ref, (u, i, t), F.mse_loss):.3f}"
    attempt("B fsdp batch 7", b_fsdp)

    def b_kw_swap():
        torch.manual_seed(0); m = TwoTower()
        u, i, t = _tt_data(8)
        pm = parallelizer.auto_parallelize(m, (u, i), axis_roles={"dp": "ddp"})
        return str(pm(user=u, item=i).shape)
    attempt("B called with keywords instead of positions", b_kw_swap)

    def b_plan_roundtrip():
        torch.manual_seed(0); m = TwoTower(); ref = copy.deepcopy(m)
        u, i, t = _tt_data(8)
        pm = parallelizer.auto_parallelize(m, (u, i), axis_roles={"dp": "fsdp"})
        path = os.path.join(tempfile.gettempdir(), "r9c_tt_plan.json")
        if rank == 0:
            pm.plan.save(path)
        torch.distributed.barrier()
        torch.manual_seed(0); m2 = TwoTower()
        pm2 = parallelizer.auto_parallelize(m2, (u, i), plan=path)
        same = pm2.plan.to_json() == pm.plan.to_json()
        r = train_compare(pm2, ref, (u, i, t), F.mse_loss)
        try:  # the saved plan on another model
            parallelizer.auto_parallelize(TwoTower(users=40), (u, i), plan=path)
            other = "accepted"
        except Exception as e:
            other = f"{type(e).__name__}: {str(e)[:160]}"
        try:  # the saved plan on another batch
            u9, i9, _ = _tt_data(9)
            parallelizer.auto_parallelize(m2, (u9, i9), plan=path)
            other_b = "accepted"
        except Exception as e:
            other_b = f"{type(e).__name__}: {str(e)[:160]}"
        return f"same plan={same} ratio={r:.3f}; other model: {other}; other batch: {other_b}"
    attempt("B plan save / load", b_plan_roundtrip)

    def b_resume():
        from parallelizer import checkpoint
        torch.manual_seed(0); m = TwoTower(); ref = copy.deepcopy(m)
        u, i, t = _tt_data(8)
        pm = parallelizer.auto_parallelize(m, (u, i), axis_roles={"dp": "fsdp"})
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-2); ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        for _ in range(2):
            F.mse_loss(pm(u, i), t).backward(); opt.step(); opt.zero_grad()
            F.mse_loss(ref(u, i), t).backward(); ropt.step(); ropt.zero_grad()
        path = os.path.join(tempfile.gettempdir(), "r9c_ckpt")
        checkpoint.save(pm, opt, path)
        torch.manual_seed(5); m2 = TwoTower()  # another init: load must overwrite it
        pm2 = parallelizer.auto_parallelize(m2, (u, i), mesh={"tp": 2}, axis_roles={"tp": "tp"})
        opt2 = torch.optim.AdamW(pm2.parameters(), lr=1e-2)
        checkpoint.load(pm2, opt2, path)
        F.mse_loss(pm2(u, i), t).backward(); opt2.step(); opt2.zero_grad()
        F.mse_loss(ref(u, i), t).backward(); ropt.step(); ropt.zero_grad()
        full = pm2.full_state_dict()
        return f"resumed on tp=2, next step ratio={max(ratio(full[k], v) for k, v in ref.state_dict().items() if v.is_floating_point()):.3f}"
    attempt("B resume fsdp -> tp=2", b_resume)

    def b_resume_no_opt_state():
        from parallelizer import checkpoint
        torch.manual_seed(0); m = TwoTower()
        u, i, t = _tt_data(8)
        pm = parallelizer.auto_parallelize(m, (u, i), axis_roles={"dp": "ddp"})
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
        path = os.path.join(tempfile.gettempdir(), "r9c_ckpt_fresh")
        checkpoint.save(pm, opt, path)  # before any step: AdamW has no state yet
        checkpoint.load(pm, opt, path)
        return "ok"
    attempt("B checkpoint before the first step", b_resume_no_opt_state)
    return out


if __name__ == "__main__":
    res = spawn(body, 2, timeout_s=600)
    for k, (r, w) in res[0].items():
        print(f"- {k}: {r}")
        for x in w:
            print(f"    warn {x}")
    for k in res[0]:
        if res[0][k][0] != res[1][k][0] and "ratio" not in str(res[0][k][0]):
            print(f"  (rank 1 differs on {k}: {res[1][k][0]})")
