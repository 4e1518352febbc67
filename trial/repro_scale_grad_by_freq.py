"""nn.Embedding(scale_grad_by_freq=True) on dp=2 (ddp): each rank divides a row's gradient by the row's count in
ITS shard of the batch, eager by the count in the whole batch. Prints the rehearsal (ratio >> 1 = mismatch).
Run: PYTHONPATH=$PWD:$PWD/trial /work/main/.venv/bin/python trial/repro_scale_grad_by_freq.py"""
import contextlib, io, warnings
warnings.filterwarnings("ignore")
import torch
from torch import nn
import parallelizer
from parallelizer.runtime.rehearsal import rehearse


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 16, scale_grad_by_freq=True)
        self.a = nn.Linear(16, 16)

    def forward(self, ids):
        return self.a(self.emb(ids))


def build():
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 3, 1], [1, 4, 5, 6], [1, 1, 2, 7], [8, 9, 2, 2]])  # id 1 four times in rows 0-1
    return M(), (ids,)


if __name__ == "__main__":
    m, a = build()
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(parallelizer.trace(m, a), {"dp": 2}, axis_roles={"dp": "ddp"})
    r = rehearse(build, {}, plan, steps=2)
    print(r)
    print("MISMATCH" if not r.matches() else "match")
