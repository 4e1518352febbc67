"""A pipeline microbatch without items: loss = sum(ce * mask) / mask.sum() is 0 / 0 = NaN on microbatch 0 (one device's whole batch is finite).

Two findings: (1) `parallelizer rehearse` of this pp=2 plan aborts rank 0 with a gloo size mismatch
(SIGABRT, "1024 vs 64": the float model input `mask` crosses the boundary flagged as grad-carrying, runtime/pipeline.py
`_examples`), untyped; fixed in f916b76; (2) with that fix it ran and said "numerics match ... 0.00" while its loss and
gradients were NaN: rehearsal._max_diff ignored NaN (fixed).

The model's own loss is `div(S, b)` with b made from the inputs, so `runtime.loss_weight` weighs microbatch j by
b_j / sum_j b_j. With b_j = max(m_j, 1) that is not the whole batch's denominator when a microbatch has no
masked-in token (b_j = 1, m_j = 0): the pipeline then trains on S / (M + 1) instead of S / M.

Run:  PYTHONPATH=$PWD:$PWD/trial python -m parallelizer plan --model masked_clamp_loss:build --mesh pp=2 \
        --schedule 1f1b --microbatches 2 --global-batch 4 -o /tmp/mcl.json
      PYTHONPATH=$PWD:$PWD/trial python -m parallelizer rehearse /tmp/mcl.json --nproc 2
or:   python trial/masked_clamp_loss.py   (prints single-device whole-batch loss vs the pipeline's weighting)
"""
import torch
from torch import nn
import torch.nn.functional as F

V, H, T = 32, 16, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(H, V)

    def forward(self, ids, mask, labels):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        logits = self.head(h)
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
        loss = (ce * mask.flatten()).sum() / mask.sum()
        return loss, logits


def build(batch=4, device="cpu", **kw):
    torch.manual_seed(0)
    with torch.device(device):
        model = Net()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (batch, T), generator=g)
    labels = torch.randint(0, V, (batch, T), generator=g)
    mask = torch.ones(batch, T)
    mask[: batch // 2] = 0.0          # the first half of the batch (the first microbatch of 2) is all padding
    return model, (ids.to(device), mask.to(device), labels.to(device))


if __name__ == "__main__":
    model, (ids, mask, labels) = build(4)
    whole = model(ids, mask, labels)[0]
    parts = [model(ids[s], mask[s], labels[s])[0] for s in (slice(0, 2), slice(2, 4))]
    b = [mask[s].sum().clamp(min=1) for s in (slice(0, 2), slice(2, 4))]
    weighted = sum(p * bj for p, bj in zip(parts, b)) / sum(b)
    print(f"single device, whole batch: {whole.item():.6f}; microbatches weighted by b_j/sum b_j: {weighted.item():.6f}")
