"""Models that flatten (L, N, E) rows to (L*N, E) around row-wise ops and unflatten them again, with the batch N
on dim 1 (`tracer.normalize` 12); importable by spawned ranks. Round 18 (g): a ViT of nn.TransformerEncoderLayer
under "ddp" moved activations (all_to_all x4) for MultiheadAttention's out-projection."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WHICH = ("vit_encoder_layer", "mha_seq_first", "flat_rows_mlp", "mha_need_weights")


class RowModel(nn.Module):
    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.inp, self.head = nn.Linear(6, 16), nn.Linear(16, 3)
        self.pos = nn.Parameter(torch.randn(1, 5, 16) * 0.02)
        if which == "vit_encoder_layer":
            self.block = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True,
                                                    activation="gelu")
        elif which in ("mha_seq_first", "mha_need_weights"):
            self.block = nn.MultiheadAttention(16, 2, batch_first=which == "mha_need_weights")
        else:
            self.fc1, self.fc2 = nn.Linear(16, 24), nn.Linear(24, 16)

    def forward(self, x):  # x: (B, 5, 6)
        h = self.inp(x) + self.pos  # (B, 5, 16)
        if self.which == "vit_encoder_layer":
            h = self.block(h)
        elif self.which == "mha_seq_first":
            s = h.transpose(0, 1)  # (5, B, 16): the layer's own (L, N, E)
            h = h + self.block(s, s, s, need_weights=False)[0].transpose(0, 1)
        elif self.which == "mha_need_weights":  # the bmm path: (L, N*H, D) -> (L*N, E)
            y, w = self.block(h, h, h, need_weights=True)
            h = h + y + w.sum(-1, keepdim=True)
        else:
            s = h.transpose(0, 1)  # (L, N, E) rows flattened by hand
            y = self.fc2(F.gelu(self.fc1(s.reshape(-1, 16)))).reshape(5, -1, 16)
            h = h + y.transpose(0, 1)
        return self.head(h.mean(1))


def row_model(which: str):
    torch.manual_seed(0)
    return RowModel(which), (torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(1)),)
