"""Small modules that each hit one member of "a reshape / view / contiguous is a view or a copy by the LOCAL shapes
and strides of a rank's shard" (`planner.local_storage`; RESULTS.md Round 24 (r24d)); importable by spawned ranks.

Each is built for tensor parallelism over its head dim with as many ranks as heads (or KV heads), so that dim is 1 on
a rank, and keeps the value after the view for backward through a Linear or a matmul. Globally the view op copies;
on a rank it is a view of a storage another op already keeps (or of a smaller one).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

B, S, D = 2, 8, 4  # batch, sequence, head dim


class Member(nn.Module):
    """x (B, S, E) -> Linear -> heads (B, S, H, D) -> the member's view chain -> a consumer that keeps it.

    which:
      "repeat_kv": GQA's k[:, :, None].expand(B, kv, n_rep, S, D).reshape(B, kv * n_rep, S, D) into SDPA
          as k and v (2 query heads per KV head; with one KV head per rank the reshape is a view of relu's output);
      "contiguous": transpose(1, 2).contiguous() of the heads, kept by relu first then by matmul (one head per
          rank: the transposed (B, 1, S, D) is contiguous, contiguous() returns it);
      "flatten": heads transposed to (B, H, S, D), relu, flatten(1, 2) -> (B, H * S, D) times a weight, which keeps it
          (merging H and S copies globally, not with one head per rank);
      "merge_heads": relu of (B, H, S, D) transposed back and reshaped to (B, S, H * D) into the output Linear
          (attention's head merge at tp = heads);
      "chunk": a fused (B S, H, 2 D) projection chunked in two on the last dim, reshape(B S, H * D) of a chunk times a
          weight (a reshape after slicing: H and D merge across a gap of D elements globally, not with one head; the
          view keeps the whole fused projection alive).
    """

    def __init__(self, which: str, heads: int = 2) -> None:
        super().__init__()
        self.which, self.heads = which, heads
        e = heads * D
        self.proj = nn.Linear(e, 2 * e if which == "chunk" else e, bias=False)
        self.q = nn.Linear(e, 2 * e, bias=False)  # repeat_kv: 2 query heads per KV head
        self.out = nn.Linear(e, e, bias=False)
        # a weight shardable on the head dim alone (tp stores it sharded), multiplying the member's view
        self.scale = nn.Parameter(torch.randn(heads * S, 1) if which == "flatten" else torch.randn(1, heads * D))

    def forward(self, x):
        h = self.heads
        if self.which == "repeat_kv":
            q = self.q(x).view(B, S, 2 * h, D).transpose(1, 2)            # (B, 2h, S, D)
            k = torch.relu(self.proj(x)).view(B, S, h, D).transpose(1, 2)   # (B, h, S, D), relu keeps it
            k = k[:, :, None].expand(B, h, 2, S, D).reshape(B, 2 * h, S, D)
            return F.scaled_dot_product_attention(q, k, k).sum()  # keeps q, k, v (= k), out, logsumexp
        if self.which == "contiguous":
            t = torch.relu(self.proj(x).view(B, S, h, D)).transpose(1, 2).contiguous()  # (B, h, S, D)
            return (t @ t.transpose(-1, -2)).sum()
        if self.which == "flatten":
            t = torch.relu(self.proj(x).view(B, S, h, D).transpose(1, 2))  # (B, h, S, D) laid as (B, S, h, D)
            return (t.flatten(1, 2) * self.scale).sum()  # kept by mul: self.scale requires grad
        if self.which == "merge_heads":
            t = self.proj(x).view(B, S, h, D).transpose(1, 2).clone(memory_format=torch.contiguous_format)
            t = torch.relu(t)  # (B, h, S, D) contiguous, kept by relu
            return self.out(t.transpose(1, 2).reshape(B, S, h * D)).sum()
        if self.which == "chunk":
            a, _ = self.proj(x).view(B * S, h, 2 * D).chunk(2, dim=-1)    # (B S, h, D), rows of 2 D
            return (a.reshape(B * S, h * D) * self.scale).sum()  # kept by mul: self.scale requires grad
        raise KeyError(self.which)


WHICH = ("repeat_kv", "contiguous", "flatten", "merge_heads", "chunk")


def member(which: str, heads: int = 2, seed: int = 0):
    """(model, (x,)) of one member, seeded."""
    torch.manual_seed(seed)
    return Member(which, heads).train(), (torch.randn(B, S, heads * D),)
