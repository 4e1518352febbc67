"""Random ops beyond dropout on ranks: do replicas agree, do shards differ, does an uneven batch keep RNG streams
in step?  python trial/h1_random.py

Each model returns an output whose pieces are either (a) replicated by construction (a draw of a fixed size
not tied to the batch: every rank must see the same numbers, else replicated weights drift apart), or (b) per
sample (rows of the batch: shards should differ from each other). We gather each rank's outputs and compare.
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import parallelizer  # noqa: E402
from parallelizer.rewriter.spec import all_axis_groups, spec_from_plan  # noqa: E402
from parallelizer.runtime.launch import create_groups, spawn  # noqa: E402
from parallelizer.runtime.module import ParallelModule  # noqa: E402

H = 16


class RandomDraws(nn.Module):
    """Replicated draws (fixed sizes) added to replicated parameters, then per-sample draws."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        noise_w = torch.randn(H, H) * 0.01                   # replicated draw, explicit size
        u = torch.rand(H)                                    # replicated
        ri = torch.randint(0, 5, (H,)).float()              # replicated
        perm = torch.randperm(H)                             # replicated permutation
        h = F.linear(x, self.a.weight + noise_w, self.a.bias) * u + ri
        h = h[..., perm]
        probs = torch.softmax(self.b.weight[0], -1)
        mult = torch.multinomial(probs, 4, replacement=True).float()   # replicated
        bern = torch.bernoulli(torch.full_like(h, 0.5))      # per sample (like h)
        g = F.gumbel_softmax(h, tau=1.0, hard=False)         # per sample
        per_sample = torch.rand_like(h)                      # per sample
        d = F.dropout(h, 0.3, training=True)                 # per sample
        rep = torch.randn(3)                                 # replicated, drawn AFTER the per-sample draws
        return h, noise_w, u, ri, perm.float(), mult, bern, g, per_sample, d, rep


def build(batch=4):
    torch.manual_seed(0)
    return RandomDraws(), (torch.randn(batch, 6, H, generator=torch.Generator().manual_seed(1)),)


def rank_fn(rank, world, spec, batch):
    torch.manual_seed(0)
    model, inputs = build(batch)
    traced = parallelizer.trace(model, inputs)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(traced, spec, rank, model)
    outs = []
    for step in range(2):
        o = pm(*inputs)
        outs.append([t.detach().clone() for t in o])
        (o[0] ** 2).mean().backward()
    return outs


NAMES = ["h", "noise_w", "u", "randint", "randperm", "multinomial", "bernoulli", "gumbel", "rand_like",
         "dropout", "rep_after"]
REPLICATED = {"noise_w", "u", "randint", "randperm", "multinomial", "rep_after"}

if __name__ == "__main__":
    for mesh, roles, batch in (({"dp": 2}, {"dp": "ddp"}, 4), ({"dp": 2}, {"dp": "ddp"}, 5),
                               ({"dp": 2}, {"dp": "fsdp"}, 5), ({"tp": 2}, {"tp": "tp"}, 4)):
        model, inputs = build(batch)
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles)
        spec = spec_from_plan(plan)
        res = spawn(rank_fn, 2, spec, batch, timeout_s=300)
        print(f"== {mesh} {roles} batch {batch}")
        for step in range(2):
            for i, name in enumerate(NAMES):
                a, b = res[0][step][i], res[1][step][i]
                same = a.shape == b.shape and torch.equal(a, b)
                kind = "replicated" if name in REPLICATED else "per-sample"
                halves = ""
                if kind == "per-sample":  # a gathered output: do the two ranks' shards repeat each other?
                    n0 = (a.size(0) + 1) // 2
                    k = a.size(0) - n0
                    rows = torch.equal(a[:k], a[n0:n0 + k])
                    c = a.size(-1) // 2
                    cols = torch.equal(a[..., :c], a[..., c:])
                    halves = f" batch halves equal: {rows}, hidden halves equal: {cols}"
                    flag = "   <-- SHARDS DREW THE SAME NUMBERS" if rows or cols else ""
                else:
                    flag = "" if same else "   <-- REPLICAS DISAGREE"
                if name != "h":
                    print(f"  step {step} {name:12s} {kind:10s} shapes {tuple(a.shape)} {tuple(b.shape)} "
                          f"ranks equal: {same}{halves}{flag}")
