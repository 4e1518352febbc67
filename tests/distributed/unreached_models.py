"""A model whose loss does not reach some trained parameters through autograd, and the rank body that trains it
under a plan beside one device (tests/distributed/test_unreached_grads.py; importable by spawned ranks).

The pattern of DeepSeek-V4's compressor / top-k indexer (round 21, r21e) in small: each block scores its tokens
with `indexer(kv_norm(h))` (B, T) and hands the scores to the next block, which reads them ONLY through
`topk(...).indices` (integers) to pick tokens. So on one device `loss.backward()` leaves `.grad` None on every
block's `kv_norm.weight`, `indexer.weight`, `indexer.bias`: AdamW and SGD skip them (no weight decay, no state).
Under a pipeline plan the scores cross a stage boundary, and torch's stages send back a zero gradient for them.
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, SEQ = 32, 8, 6
UNREACHED = tuple(f"blocks.{i}.{name}" for i in range(4)
                  for name in ("indexer.bias", "indexer.weight", "kv_norm.weight"))


class IndexedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.kv_norm = nn.RMSNorm(WIDTH)
        self.indexer = nn.Linear(WIDTH, 1)

    def forward(self, h, s):  # h (B, T, d); s (B, T): the previous block's scores
        idx = s.topk(2, dim=-1).indices  # (B, 2): integers, so no gradient flows back into s
        picked = torch.gather(h, 1, idx[..., None].expand(-1, -1, WIDTH))  # (B, 2, d)
        h = h + torch.tanh(self.fc(h)) + picked.mean(1, keepdim=True)
        return h, self.indexer(self.kv_norm(h)).squeeze(-1)  # (B, T, d), (B, T)


class IndexedLM(nn.Module):
    """Embedding -> 4 IndexedBlocks -> a last pick by the last block's scores -> head -> mean cross-entropy."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(IndexedBlock() for _ in range(4))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids, labels):
        h = self.emb(ids)  # (B, T, d)
        s = h.sum(-1)
        for block in self.blocks:
            h, s = block(h, s)
        idx = s.topk(1, dim=-1).indices
        h = h + torch.gather(h, 1, idx[..., None].expand(-1, -1, WIDTH))
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def indexed_lm(batch: int = 8):
    """(IndexedLM seeded, (ids (batch, SEQ), labels: ids shifted by one))."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(1))
    return IndexedLM(), (ids, ids.roll(1, 1))


OPTIMIZERS = {  # weight decay and momentum: both move a parameter with a zero gradient, neither one with None
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=0.1),
}


def train_beside_eager(rank: int, world_size: int, mesh: dict, options: dict, optimizer: str,
                       steps: int = 3) -> dict:
    """`steps` steps of `auto_parallelize(IndexedLM)` under `mesh` and of one device's model, each with a fresh
    `OPTIMIZERS[optimizer]`: per step the parameters whose .grad is None on each side (after backward, before
    the optimizer step), the parameters holding optimizer state after the steps, and the full parameters."""
    warnings.simplefilter("ignore")
    import parallelizer
    model, (ids, labels) = indexed_lm(8)
    reference = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, (ids, labels), mesh=mesh, **options)
    opt, ref_opt = OPTIMIZERS[optimizer](list(pm.parameters())), OPTIMIZERS[optimizer](list(reference.parameters()))
    none, ref_none = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        pm.step(ids, labels)
        reference(ids, labels).backward()
        none.append(sorted(n for n, p in pm.named_parameters() if p.grad is None))
        ref_none.append(sorted(n for n, p in reference.named_parameters() if p.grad is None))
        opt.step()
        ref_opt.step()
    return beside_eager(pm, opt, none, reference, ref_opt, ref_none)


def beside_eager(pm, opt, none: list, reference, ref_opt, ref_none: list) -> dict:
    """What a rank body returns after its steps: the per-step None sets of both sides (one device's restricted to
    the parameters this rank holds), the parameters holding optimizer state, and the full parameters of both."""
    held = dict(pm.named_parameters())
    return {"none": none, "ref_none": [[n for n in names if n in held] for names in ref_none],
            "state": sorted(n for n, p in held.items() if opt.state.get(p)),
            "ref_state": sorted(n for n, p in reference.named_parameters() if ref_opt.state.get(p) and n in held),
            "params": {k: v.clone() for k, v in pm.full_state_dict().items()},
            "ref_params": {k: v.clone() for k, v in reference.state_dict().items()}}
