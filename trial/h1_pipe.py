"""Pipeline patterns (trial5a h1): parameters shared ACROSS pipeline stages other than a tied embedding.
CLI factories: `parallelizer plan --model h1_pipe:shared_submodule --mesh pp=2,dp=2 --global-batch 8 --seq-len 8`.

- shared_submodule: one nn.Linear object held by every block (ALBERT-like partial sharing; Paddle#46572
  "weight-sharing + pipeline needs an extra allreduce for gradient sync").
- global_scale: one scalar parameter of the root module read by every block and by the head (a learnable
  temperature used in the first and the last stage).
- cross_stage_buffer: a positional table registered as a root buffer, read by every block.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

V, H, L = 64, 32, 4


class Block(nn.Module):
    def __init__(self, shared=None, root=None):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc = nn.Linear(H, 2 * H)
        self.proj = nn.Linear(2 * H, H)
        if shared is not None:
            self.shared = shared
        self._root = [root]  # not a submodule

    def forward(self, x):
        h = self.proj(F.gelu(self.fc(self.ln(x))))
        if hasattr(self, "shared"):
            h = h + self.shared(x)
        return x + h


class Net(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.emb = nn.Embedding(V, H)
        shared = nn.Linear(H, H) if kind == "shared_submodule" else None
        self.blocks = nn.ModuleList(Block(shared) for _ in range(L))
        self.ln_f = nn.LayerNorm(H)
        self.head = nn.Linear(H, V)
        if kind == "global_scale":
            self.scale = nn.Parameter(torch.tensor(0.7))
        if kind == "cross_stage_buffer":
            self.register_buffer("pos", torch.randn(16, H) * 0.1)

    def forward(self, ids, labels):
        x = self.emb(ids)
        for blk in self.blocks:
            if self.kind == "global_scale":
                x = blk(x) * self.scale
            elif self.kind == "cross_stage_buffer":
                x = blk(x + self.pos[: x.size(1)])
            else:
                x = blk(x)
        logits = self.head(self.ln_f(x))
        if self.kind == "global_scale":
            logits = logits / self.scale
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _build(kind, batch=8, seq_len=8, **_):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (batch, seq_len), generator=g)
    labels = torch.randint(0, V, (batch, seq_len), generator=g)
    return Net(kind), (ids,), {"labels": labels}


def shared_submodule(**kw):
    return _build("shared_submodule", **kw)


def global_scale(**kw):
    return _build("global_scale", **kw)


def cross_stage_buffer(**kw):
    return _build("cross_stage_buffer", **kw)
