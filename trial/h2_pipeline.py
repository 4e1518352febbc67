"""h2 on pipeline meshes: a 4-block stack of the round-6 patterns (LoRA on frozen q/v, QK-norm, DyT, Gemma RMSNorm,
per-token fake-quant STE, IA3 scaling) with its own CE loss, on pp=2 x tp=2, pp=2 x dp=2 (fsdp), pp=4."""
import contextlib
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import parallelizer  # noqa: E402
import h2_models as M  # noqa: E402
from parallelizer.rewriter.spec import spec_from_plan  # noqa: E402
from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline  # noqa: E402

H, NH, T, V = 32, 4, 8, 120
import os  # noqa: E402
QUANT = os.environ.get("H2_QUANT", "1") == "1"
MESHES = os.environ.get("H2_MESHES", "all")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(0.7))
        self.w, self.b = nn.Parameter(1 + 0.1 * torch.randn(H)), nn.Parameter(0.1 * torch.randn(H))
        self.q, self.v = M.LoRALinear(H, H), M.LoRALinear(H, H)
        self.k, self.o = nn.Linear(H, H), nn.Linear(H, H)
        self.qn, self.kn = M.RMS(H // NH), M.RMS(H // NH)
        self.n2 = M.RMS(H, offset=True)
        self.up, self.down = nn.Linear(H, 2 * H), nn.Linear(2 * H, H)
        self.ia3 = nn.Parameter(1 + 0.1 * torch.randn(2 * H))

    def forward(self, x):
        b, t, _ = x.shape
        h = torch.tanh(self.alpha * x) * self.w + self.b
        q = self.qn(self.q(h).view(b, t, NH, -1)).transpose(1, 2)
        k = self.kn(self.k(h).view(b, t, NH, -1)).transpose(1, 2)
        v = self.v(h).view(b, t, NH, -1).transpose(1, 2)
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, H))
        h = self.n2(x)
        s = h.detach().abs().amax(-1, keepdim=True) / 127
        if QUANT:
            h = M._ste(h, M._fq(h, s.clamp(min=1e-8)))
        return x + self.down(F.gelu(self.up(h)) * self.ia3)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(H, V)

    def forward(self, ids, labels):
        h = self.emb(ids)
        for blk in self.blocks:
            h = blk(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def stack(batch=8):
    torch.manual_seed(0)
    ids = torch.randint(0, V, (batch, T), generator=torch.Generator().manual_seed(2))
    return Stack(), (ids, ids.roll(-1, 1))


if __name__ == "__main__":
    cases = (({"pp": 2, "tp": 2}, {"tp": "tp"}), ({"pp": 2, "dp": 2}, {"dp": "fsdp"}), ({"pp": 4}, {}))
    for mesh, roles in cases[:1] if MESHES == "tp" else cases:
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(parallelizer.trace(*stack(batch=4)), mesh, microbatches=2, axis_roles=roles)
        try:
            r = rehearse_pipeline(stack, {"batch": 8}, spec_from_plan(plan), plan.pipeline, steps=2)
            print(mesh, roles, plan.pipeline.schedule, "MATCH" if r.matches() else "MISMATCH", r)
        except Exception as e:  # noqa: BLE001
            print(mesh, roles, type(e).__name__, str(e)[:1500])
