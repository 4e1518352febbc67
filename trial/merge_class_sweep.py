"""Batch merged with another dim and split again: plan under forced roles (+ random costs), rehearse dp=2."""
import contextlib, io, sys, time
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many

C = 32

class Divided(nn.Module):          # TimeSformer-like, batch leading factor
    def __init__(s):
        super().__init__(); s.sp = nn.Linear(C, C); s.tm = nn.Linear(C, C); s.head = nn.Linear(C, 5)
    def forward(s, x):                      # (B, T, P, C)
        B, T, P, _ = x.shape
        h = s.sp(x.reshape(B * T, P, C)); h = h.softmax(dim=1) * h
        h = h.reshape(B, T, P, C).permute(0, 2, 1, 3).reshape(B * P, T, C)
        h = s.tm(h).softmax(dim=1) * h
        return s.head(h.reshape(B, P, T, C).mean(dim=(1, 2)))

class ClsSlice(nn.Module):         # TimeSformer's embeddings[:batch_size, 0, :] over the merged (B*T) dim
    def __init__(s):
        super().__init__(); s.cls = nn.Parameter(torch.randn(1, 1, C)); s.sp = nn.Linear(C, C); s.head = nn.Linear(C, 5)
    def forward(s, x):                      # (B, T, P, C)
        B, T, P, _ = x.shape
        e = torch.cat((s.cls.expand(B * T, -1, -1), s.sp(x.reshape(B * T, P, C))), dim=1)
        cls = e[:B, 0, :].unsqueeze(1)
        rest = e[:, 1:].reshape(B, T * P, C)
        return s.head(torch.cat((cls, rest), dim=1).mean(dim=1))

class SeqMerge(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(C, C); s.head = nn.Linear(C, 5)
    def forward(s, x):                      # (B, S, C)
        B, S, _ = x.shape
        h = torch.tanh(s.a(x.reshape(B * S, C))).view(B, S, C)
        return s.head(h.softmax(dim=1).mul(h).sum(1))

class HeadMerge(nn.Module):
    def __init__(s, H=4):
        super().__init__(); s.H = H; s.qkv = nn.Linear(C, 3 * C); s.o = nn.Linear(C, C)
    def forward(s, x):                      # (B, S, C)
        B, S, _ = x.shape
        q, k, v = s.qkv(x).view(B, S, 3, s.H, C // s.H).permute(2, 0, 3, 1, 4).reshape(3, B * s.H, S, C // s.H)
        a = torch.bmm(q, k.transpose(1, 2)).softmax(-1)
        y = torch.bmm(a, v).view(B, s.H, S, C // s.H).transpose(1, 2).reshape(B, S, C)
        return s.o(y)

class ChannelMerge(nn.Module):
    def __init__(s):
        super().__init__(); s.conv = nn.Conv2d(1, 1, 3, padding=1); s.mix = nn.Conv2d(8, 8, 1)
    def forward(s, x):                      # (B, 8, H, W)
        B, Ch, Hh, W = x.shape
        h = s.conv(x.reshape(B * Ch, 1, Hh, W)).reshape(B, Ch, Hh, W)
        h = F.group_norm(h.flatten(0, 1).unsqueeze(0), B * Ch).reshape(B, Ch, Hh, W)
        return s.mix(h).relu()

class BatchInner(nn.Module):       # batch is the INNER factor of the merged dim: (T, B) -> T*B
    def __init__(s):
        super().__init__(); s.a = nn.Linear(C, C); s.head = nn.Linear(C, 5)
    def forward(s, x):                      # (B, T, P, C)
        B, T, P, _ = x.shape
        h = x.transpose(0, 1).reshape(T * B, P, C)
        h = s.a(h).softmax(dim=1) * h
        h = h.reshape(T, B, P, C).transpose(0, 1)
        return s.head(h.mean(dim=(1, 2)))

class Tubelet(nn.Module):          # VideoMAE / ViViT tubelet embedding
    def __init__(s):
        super().__init__(); s.proj = nn.Conv3d(3, C, (2, 4, 4), stride=(2, 4, 4)); s.a = nn.Linear(C, C); s.head = nn.Linear(C, 5)
    def forward(s, x):                      # (B, T, 3, H, W)
        h = s.proj(x.permute(0, 2, 1, 3, 4)).flatten(2).transpose(1, 2)   # (B, N, C)
        B, N, _ = h.shape
        h = s.a(h.reshape(B * N, C)).reshape(B, N, C)
        return s.head(F.layer_norm(h, (C,)).mean(1))

def _b(cls, shape, B):
    def f(B=B):
        torch.manual_seed(0)
        return cls(), (torch.randn(B, *shape),)
    return f

def divided4(): return _b(Divided, (2, 4, C), 4)()
def divided3(): return _b(Divided, (2, 4, C), 3)()
def clsslice(): return _b(ClsSlice, (2, 4, C), 4)()
def seqmerge(): return _b(SeqMerge, (8, C), 4)()
def seqmerge3(): return _b(SeqMerge, (8, C), 3)()
def headmerge(): return _b(HeadMerge, (8, C), 4)()
def headmerge3(): return _b(HeadMerge, (8, C), 3)()
def channelmerge(): return _b(ChannelMerge, (8, 6, 6), 4)()
def batchinner(): return _b(BatchInner, (2, 4, C), 4)()
def batchinner3(): return _b(BatchInner, (2, 4, C), 3)()
def tubelet(): return _b(Tubelet, (4, 3, 8, 8), 4)()
def tubelet3(): return _b(Tubelet, (4, 3, 8, 8), 3)()

BUILDERS = [divided4, divided3, clsslice, seqmerge, seqmerge3, headmerge, headmerge3, channelmerge, batchinner,
            batchinner3, tubelet, tubelet3]

def random_cost_plan(traced, mesh, roles, seed):
    from parallelizer.config import PlanConfig
    from parallelizer.planner.api import build as build_problem, to_plan
    from parallelizer.planner.ilp import solve
    config = PlanConfig(axis_roles=roles)
    problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())), config=config)
    rng = np.random.default_rng(seed)
    problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
    problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
    return to_plan(traced, problem, pricer, solve(problem, config), config)

MESHES = [({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"}), ({"dp": 2}, None),
          ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}), ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})]

if __name__ == "__main__":
    only = sys.argv[1:] or [b.__name__ for b in BUILDERS]
    cases = {2: [], 4: []}
    for b in BUILDERS:
        if b.__name__ not in only:
            continue
        m, inp = b()
        with contextlib.redirect_stdout(io.StringIO()):
            tr = parallelizer.trace(m, inp)
        for mesh, roles in MESHES:
            for seed in (None, 1, 2):
                if seed is not None and roles is None:
                    continue
                tag = f"{b.__name__} {mesh} {roles} seed={seed}"
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        p = (parallelizer.plan(tr, mesh, axis_roles=roles) if seed is None and roles else
                             parallelizer.plan(tr, mesh) if roles is None else random_cost_plan(tr, mesh, roles, seed))
                    cases[len(mesh) * 2 if len(mesh) == 2 else 2].append((tag, b, p))
                    print(tag, "planned", flush=True)
                except Exception as e:
                    print(tag, type(e).__name__, str(e)[:400], flush=True)
    n = int(__import__("os").environ.get("NPROC", "2"))
    sel = cases[n]
    if sel:
        t = time.time()
        reps = rehearse_many([(b, {}, p) for _, b, p in sel], steps=2)
        for (tag, _, _), r in zip(sel, reps):
            print("REHEARSE", tag, "ratio=%.3g" % r.tolerance_ratio, "loss=%.2e grad=%.2e params=%.2e" % (r.loss, r.grad, r.params), r.collectives)
        print("rehearse s", time.time() - t)
