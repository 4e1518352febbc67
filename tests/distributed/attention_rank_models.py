"""scaled_dot_product_attention called at ranks other than 4 (round 16, r16a): on (B, L, E) (one head, no head
dim), with an (L, S) mask, and on (B, G, H, L, E). The rule took dims 0 and 1 as batch and heads at every rank,
so a 3-D call could be planned with L and S sharded: each rank attended over its own keys only. Each builder
returns (model, inputs) with a scalar loss output."""
import torch
import torch.nn.functional as F
from torch import nn


class AttentionRanks(nn.Module):
    def __init__(self, width: int = 16, seq: int = 6):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):                                                   # x (B, L, E)
        B, L, E = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        one_head = F.scaled_dot_product_attention(q, k, v, is_causal=True)          # (B, L, E)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)        # (B, L, E), (L, S) mask
        grouped = lambda t: t.view(B, L, 2, 2, E // 4).permute(0, 2, 3, 1, 4)       # (B, G, H, L, E/4)  # noqa: E731
        five = F.scaled_dot_product_attention(grouped(q), grouped(k), grouped(v))
        five = five.permute(0, 3, 1, 2, 4).reshape(B, L, E)
        return self.o(one_head + masked + five).pow(2).mean()


def attention_ranks(batch: int = 5, seed: int = 0):
    torch.manual_seed(seed)
    return AttentionRanks(), (torch.randn(batch, 6, 16, generator=torch.Generator().manual_seed(seed + 1)),)
