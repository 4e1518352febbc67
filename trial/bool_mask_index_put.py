"""Finding: index_put (h[mask] = value) with a boolean mask (a constant made in forward, like Wav2Vec2's
SpecAugment time mask) on an activation sharded along a dim the mask covers. Run: python trial/bool_mask_index_put.py"""
import contextlib, io, sys, warnings
warnings.filterwarnings("ignore")
import torch
from torch import nn
import parallelizer
from parallelizer.runtime.rehearsal import rehearse

B, T, H = 4, 7, 16


class MaskFill(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.fill = nn.Parameter(torch.randn(H))

    def forward(self, x):
        h = self.a(x)
        mask = torch.tensor([[i % 3 == j % 2 for i in range(T)] for j in range(B)])   # constant (B, T) bool
        h[mask] = self.fill
        return self.b(h)


def build():
    torch.manual_seed(0)
    return MaskFill(), (torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)),)


if __name__ == "__main__":
    for mesh, roles in [({"dp": 2}, {"dp": "ddp"}), ({"tp": 2}, {"tp": "tp"}), ]:
        m, a = build()
        tr = parallelizer.trace(m, a)
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(tr, mesh, axis_roles=roles)
        node = [n for n, t in tr.nodes.items() if "index_put" in t.op_name]
        print(mesh, roles, "index_put nodes", node, "strategy", [plan.nodes[n] for n in node])
        try:
            print("  ", rehearse(build, {}, plan, steps=1))
        except Exception as e:
            print("  ", type(e).__name__, str(e)[:300])
