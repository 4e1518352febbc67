"""Pipeline / mixed-mesh user loops (auto_parallelize + pm.step + SGD) against one device, for the trial-10c
patterns: a loss that is a SUM divided by a constant (torchtitan#2972), uneven microbatches (pytorch#126600),
attention sinks + clip_grad_norm_ (Megatron-LM#7452 finding 8). SGD, not Adam: a gradient off by a constant
factor is invisible to Adam's normalised update."""
import contextlib, copy, io, sys
import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F
import parallelizer
from parallelizer.runtime import spawn

V, H, T = 64, 32, 8


class Block(nn.Module):
    def __init__(self, sinks=False, reuse=False):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.sq = nn.Linear(H, H) if reuse is True else None
        self.w = nn.Parameter(torch.randn(H, H) * 0.2) if reuse == "mm" else None
        self.qkv, self.o = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.sinks = nn.Parameter(torch.randn(4) * 0.5) if sinks else None
        self.up, self.down = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, 4, H // 4).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / (H // 4) ** 0.5
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        if self.sinks is not None:  # GPT-OSS attention sinks: one learned logit per head in the softmax
            s = torch.cat([s, self.sinks.view(1, 4, 1, 1).expand(b, 4, t, 1)], -1)
            p = s.softmax(-1)[..., :-1]
        else:
            p = s.softmax(-1)
        x = x + self.o((p @ v).transpose(1, 2).reshape(b, t, H))
        if self.w is not None:  # pytorch#180952's exact pattern: x @ w @ w
            x = x + (x @ self.w @ self.w) * 0.5
        if self.sq is not None:  # pytorch#180952: one weight used twice on a parent-child path
            x = x + self.sq(torch.tanh(self.sq(x)))
        return x + self.down(F.gelu(self.up(x)))


class Tiny(nn.Module):
    def __init__(self, sinks=False, own_loss=None, reuse=False, n_blocks=2):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.blocks = nn.ModuleList([Block(sinks, reuse) for _ in range(n_blocks)])
        self.head = nn.Linear(H, V)
        self.own_loss = own_loss

    def forward(self, ids, labels=None):
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(x)
        if self.own_loss == "sum_over_const":
            return (F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / 1000.0,)
        if self.own_loss == "sum_over_numel":
            return (F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / labels.numel(),)
        return logits


def ce_sum_over_const(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="sum") / 1000.0


def ce_mean(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


LOSSES = {"sum_over_const": ce_sum_over_const, "mean": ce_mean}


def run_case(rank, world, mesh, batch, sinks, loss, own_loss, options, steps=2, clip=None, reuse=False, n_blocks=2,
             accum=1):
    torch.manual_seed(0)
    model = Tiny(sinks=sinks, own_loss=own_loss, reuse=reuse, n_blocks=n_blocks)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (batch, T), generator=g)
    labels = torch.randint(0, V, (batch, T), generator=g)
    reference = copy.deepcopy(model)
    args, kwargs = ((ids,), {"labels": labels}) if own_loss else ((ids,), {})
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, args, example_kwargs=kwargs or None, mesh=mesh, **options)
    opt, ref_opt = torch.optim.SGD(pm.parameters(), lr=0.5), torch.optim.SGD(reference.parameters(), lr=0.5)
    worst = {"loss": 0.0, "params": 0.0, "norm": 0.0}
    for _ in range(steps):
        if own_loss:
            l = pm.step(ids, labels=labels)
            r = reference(ids, labels=labels)[0]
        else:  # accum > 1: torchtitan#1733 / NeMo-Automodel#3530 (accumulated gradients rescaled or wiped)
            for a in range(accum):
                ids_a, labels_a = (ids, labels) if a == 0 else (ids.flip(0), labels.roll(1, 1))
                l = pm.step(ids_a, target=labels_a, loss_fn=LOSSES[loss])
                r = LOSSES[loss](reference(ids_a), labels_a)
                if a < accum - 1:
                    r.backward()
        r.backward()
        if clip:
            n = pm.clip_grad_norm_(clip)
            rn = torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
            worst["norm"] = max(worst["norm"], abs(float(n) - float(rn)))
        opt.step(); ref_opt.step(); opt.zero_grad(); ref_opt.zero_grad()
        worst["loss"] = max(worst["loss"], abs(float(l.detach()) - float(r.detach())))
    full = pm.full_state_dict()
    ref = reference.state_dict()
    worst["params"] = max((full[k] - ref[k]).abs().max().item() for k in full)
    worst["kind"] = type(pm).__name__
    return worst


def rank_main(rank, world, cases):
    out = {}
    for name, case in cases.items():
        try:
            out[name] = run_case(rank, world, **case)
        except Exception as e:
            print(f"RESULT rank{rank} {name} ERROR {type(e).__name__}: {str(e)[:1500]}", flush=True)
            raise
        print(f"RESULT rank{rank} {name} {out[name]}", flush=True)
        dist.barrier()
    return out


P = {"pp": 2, "dp": 2}
CASES = {
    "own_sum_over_const pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss=None, own_loss="sum_over_const",
                                       options={"axis_roles": {"dp": "ddp"}}),
    "own_sum_over_numel pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss=None, own_loss="sum_over_numel",
                                       options={"axis_roles": {"dp": "ddp"}}),
    "fn_sum_over_const pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="sum_over_const", own_loss=None,
                                      options={"axis_roles": {"dp": "ddp"}}),
    "fn_sum_over_const dp2xtp2": dict(mesh={"dp": 2, "tp": 2}, batch=8, sinks=False, loss="sum_over_const",
                                      own_loss=None, options={"axis_roles": {"dp": "fsdp", "tp": "tp"}}),
    "uneven_mb batch6 mb4 pp2xdp2": dict(mesh=P, batch=6, sinks=False, loss="mean", own_loss=None,
                                         options={"axis_roles": {"dp": "ddp"}, "microbatches": 4}),
    "sinks clip pp2xtp2": dict(mesh={"pp": 2, "tp": 2}, batch=4, sinks=True, loss="mean", own_loss=None,
                               options={"axis_roles": {"tp": "tp"}}, clip=0.05),
    "sinks clip dp2xtp2": dict(mesh={"dp": 2, "tp": 2}, batch=4, sinks=True, loss="mean", own_loss=None,
                               options={"axis_roles": {"dp": "fsdp", "tp": "tp"}}, clip=0.05),
    "reuse zbv pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="mean", own_loss=None, reuse=True, n_blocks=4,
                              options={"axis_roles": {"dp": "ddp"}, "schedule": "zbv", "microbatches": 4}),
    "reuse izb pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="mean", own_loss=None, reuse=True, n_blocks=4,
                              options={"axis_roles": {"dp": "ddp"}, "schedule": "interleaved_zero_bubble",
                                       "microbatches": 4}),
    "reuse dualpipev pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="mean", own_loss=None, reuse=True,
                                    n_blocks=4, options={"axis_roles": {"dp": "ddp"}, "schedule": "dualpipev",
                                                         "microbatches": 4}),
    "plain zbv pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="mean", own_loss=None, reuse=False, n_blocks=4,
                              options={"axis_roles": {"dp": "ddp"}, "schedule": "zbv", "microbatches": 4}),
    "reuse 1f1b pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="mean", own_loss=None, reuse=True, n_blocks=4,
                               options={"axis_roles": {"dp": "ddp"}, "schedule": "1f1b", "microbatches": 4}),
    "mm zbv pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="mean", own_loss=None, reuse="mm", n_blocks=4,
                           options={"axis_roles": {"dp": "ddp"}, "schedule": "zbv", "microbatches": 4}),
    "mm izb pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="mean", own_loss=None, reuse="mm", n_blocks=4,
                           options={"axis_roles": {"dp": "ddp"}, "schedule": "interleaved_zero_bubble",
                                    "microbatches": 4}),
    "accum2 1f1b pp2xdp2": dict(mesh=P, batch=8, sinks=False, loss="mean", own_loss=None, accum=2,
                                options={"axis_roles": {"dp": "ddp"}, "microbatches": 2}),
    "accum2 zbv pp2xtp2": dict(mesh={"pp": 2, "tp": 2}, batch=8, sinks=False, loss="mean", own_loss=None, accum=2,
                               n_blocks=4, options={"axis_roles": {"tp": "tp"}, "schedule": "zbv", "microbatches": 4}),
}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    res = spawn(rank_main, 4, {n: CASES[n] for n in names}, timeout_s=900)
    for n in names:
        for rank, r in enumerate(res):
            print(rank, n, r[n])
