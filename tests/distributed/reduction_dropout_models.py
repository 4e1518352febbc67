"""Models that run sum_to_size, the feature dropouts (nn.Dropout1d / 2d / 3d: aten.feature_dropout; nn.
FeatureAlphaDropout) and nn.AlphaDropout on a batch-sharded conv activation (round 19's leftover: no rule, so each
ran replicated with its input gathered over the data axis); importable by spawned ranks. (4, 3, 6, 6) -> Conv2d ->
op -> mean over space -> Linear."""
from __future__ import annotations

import torch
from torch import nn

WHICH = ("sum_to_size_batch", "sum_to_size_space", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
         "feature_alpha_dropout")
OP = {"sum_to_size_batch": "sum_to_size", "sum_to_size_space": "sum_to_size", "dropout1d": "feature_dropout",
      "dropout2d": "feature_dropout", "dropout3d": "feature_dropout"}  # the aten op each model runs


class ReductionDropout(nn.Module):
    def __init__(self, which: str, p: float = 0.5) -> None:
        super().__init__()
        self.which = which
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)
        self.drop = {"dropout1d": nn.Dropout1d, "dropout2d": nn.Dropout2d, "dropout3d": nn.Dropout3d,
                     "alpha_dropout": nn.AlphaDropout, "feature_alpha_dropout": nn.FeatureAlphaDropout}.get(which)
        self.drop = self.drop(p) if self.drop else None

    def forward(self, x):
        h = self.conv(x)  # (B, 8, 6, 6)
        w = self.which
        if w == "sum_to_size_batch":  # (1, 8, 1, 1): over the batch and space (a Partial over dp)
            h = h * torch.tanh(h.sum_to_size(1, 8, 1, 1))
        elif w == "sum_to_size_space":  # (B, 8, 1, 1): the batch kept
            h = h * torch.sigmoid(h.sum_to_size(h.shape[0], 8, 1, 1))
        elif w == "dropout1d":
            h = self.drop(h.flatten(2)).unflatten(2, (6, 6))  # (B, 8, 36): one mask entry per (sample, channel)
        elif w == "dropout3d":
            h = self.drop(h.unsqueeze(2)).squeeze(2)  # (B, 8, 1, 6, 6)
        else:
            h = self.drop(h)
        return self.head(h.mean((2, 3)))


def reduction_dropout(which: str, train: bool = True):
    """The model (dropouts with p=0.5; `train=False`: in eval mode, where they are the identity) and its input."""
    torch.manual_seed(0)
    model = ReductionDropout(which)
    return model.train(train), (torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(1)),)
