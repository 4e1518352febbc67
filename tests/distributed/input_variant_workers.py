"""Rank bodies for test_pipeline_inputs: `pm.step` of a pipeline plan given inputs that differ from the traced
example (trial r13c), against the eager model on one device built from the same seed in the same rank."""
from __future__ import annotations

import contextlib
import copy
import io

import torch
import torch.nn.functional as F
from torch import nn

import parallelizer


class MaskedBlock(nn.Module):
    """(B, T, 16) and an integer keep-mask (B, T) -> (B, T, 16): a residual update kept where mask != 0."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, h, mask):
        return h + torch.tanh(self.fc(h)) * (mask != 0)[..., None]


class MaskedStack(nn.Module):
    """Embedding, 4 MaskedBlocks each reading the integer mask (so it crosses a pipeline boundary), a head."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(20, 16), nn.Linear(16, 20)
        self.blocks = nn.ModuleList(MaskedBlock() for _ in range(4))

    def forward(self, ids, mask):
        h = self.emb(ids)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(h)


def lm_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids, labels = torch.randint(0, 20, (4, 6), generator=g), torch.randint(0, 20, (4, 6), generator=g)
    mask = torch.ones(4, 6, dtype=torch.int64)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return ids, mask, labels


def pipeline_input_variants(rank: int, world_size: int, mesh: dict) -> dict:
    """2 AdamW steps of `pm.step` and of the eager model per case: "int32 mask" (an int32 mask where int64 was
    traced: int32 values sent into the int64 buffers of the next stage), "expanded target" (labels[:1] expanded
    over the batch: a stride-0 dim 0 that loss_fn's count program viewed). Returns per case the largest loss
    difference and the parameters' after the steps, or the error text."""
    out = {}
    for case in ("int32 mask", "expanded target"):
        torch.manual_seed(0)
        model = MaskedStack()
        reference = copy.deepcopy(model)
        ids, mask, _ = _batch(0)
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            pm = parallelizer.auto_parallelize(model, (ids, mask), mesh=mesh, microbatches=2)
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (pm, reference)]
        worst = 0.0
        try:
            for step in range(2):
                ids, mask, labels = _batch(1 + step)
                if case == "int32 mask":
                    mask = mask.int()
                else:
                    labels = labels[:1].expand(4, 6)
                loss = pm.step(ids, mask, target=labels, loss_fn=lm_loss)
                ref_loss = lm_loss(reference(ids, mask), labels)
                ref_loss.backward()
                for opt in opts:
                    opt.step()
                    opt.zero_grad()
                worst = max(worst, abs(loss.item() - ref_loss.item()))
            full = pm.full_state_dict()
            params = max((full[k] - v).abs().max().item() for k, v in reference.state_dict().items())
            out[case] = {"loss": worst, "params": params}
        except Exception as exc:  # noqa: BLE001 - the test reports what each rank met
            out[case] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out
