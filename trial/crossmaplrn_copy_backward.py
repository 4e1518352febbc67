"""Trial 9b finding: nn.CrossMapLRN2d between two Linears. Its legacy autograd.Function writes `pow(..., out=buf)`
into a fresh `input.new()` buffer; the tracer turned the out= op into pow + copy_, then the copy_ on the fresh
buffer out of place into aten.copy.default, which has no autograd formula: every sharded program (and the
traced program on one rank) failed in backward with "derivative for aten::copy is not implemented" (a
DistributedError wrapping a RuntimeError from inside torch). Before the fix: rehearsal errors on tp=2 and random
plans; ddp/fsdp infeasible. Run: python trial/crossmaplrn_copy_backward.py"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
import torch.nn as nn
import torch.nn.functional as F
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many


class LRN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.lrn, self.lin2 = nn.Linear(16, 64), nn.CrossMapLRN2d(3), nn.Linear(64, 8)

    def forward(self, x, y):
        h = self.lrn(self.lin1(x).view(x.shape[0], 4, 4, 4))
        return F.mse_loss(self.lin2(h.reshape(x.shape[0], -1)), y)


def build():
    torch.manual_seed(0)
    return LRN(), (torch.randn(4, 16), torch.randn(4, 8))


if __name__ == "__main__":
    traced = parallelizer.trace(*build())
    loss = traced.graph_module(*[p for p in traced.graph_module.parameters()][:0], *build()[1]) if False else None
    cases = []
    for mesh, roles in (({"tp": 2}, {"tp": "tp"}), ({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"})):
        try:
            cases.append((f"{roles}", parallelizer.plan(traced, mesh, axis_roles=roles)))
        except parallelizer.ParallelizerError as e:
            print(roles, type(e).__name__, str(e).splitlines()[0][:200])
    for (name, _), r in zip(cases, rehearse_many([(build, {}, p) for _, p in cases], steps=2)):
        print(name, r)
