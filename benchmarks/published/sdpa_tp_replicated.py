"""Under a forced tp role, does the planner shard scaled_dot_product_attention by heads (Megatron's layout,
Korthikanti's 24/t and 5as/(ht) terms)? Minimal attention block, bf16, h100:1x2, mesh {"tp": 2}."""
import torch, torch.nn as nn, torch.nn.functional as F
import parallelizer


class Attn(nn.Module):
    def __init__(self, h=1024, a=16, fused=True, mask=False):
        super().__init__()
        self.a, self.fused, self.mask = a, fused, mask
        if fused:
            self.qkv = nn.Linear(h, 3 * h)
        else:
            self.q, self.k, self.v = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.o = nn.Linear(h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=-1) if self.fused else (self.q(x), self.k(x), self.v(x))
        q, k, v = (t.view(b, s, self.a, h // self.a).transpose(1, 2) for t in (q, k, v))
        if self.mask:
            m = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()[None, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, h)).float().pow(2).mean()


if __name__ == "__main__":
    for fused in (True, False):
        for mask in (False, True):
            with torch.device("meta"):
                m = Attn(fused=fused, mask=mask).to(torch.bfloat16)
                x = torch.empty(1, 1024, 1024, dtype=torch.bfloat16)
            tg = parallelizer.trace(m, (x,))
            p = parallelizer.plan(tg, {"tp": 2}, cluster="h100:1x2", axis_roles={"tp": "tp"}, precision="bf16")
            sd = [(n.inputs, n.output) for n in p.nodes.values() if "scaled_dot" in n.op]
            print(f"fused_qkv={fused} explicit_mask={mask}: sdpa {sd}; activations {p.cost.memory_bytes['activations']/2**20:.1f} MiB, "
                  f"step {p.cost.compute_s*1e6:.0f} us compute + {sum(p.cost.comm_s.values())*1e6:.0f} us comm", flush=True)
