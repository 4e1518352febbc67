"""Our graph_flops (fwd+bwd) on GPT-2 shapes of Narayanan et al. SC'21 Table 1 vs the paper's closed form.

Narayanan et al. Sec. 5.1 / App.: per iteration, with activation recomputation,
    F_rc = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
which is 4 passes of the transformer layers (72 -> 96) plus 3 passes (6 B s h V) of the logit layer.
Without recomputation: F = 72 B s l h^2 (1 + s/(6h)) + 6 B s h V = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
PaLM (Chowdhery et al. 2022, App. B): 6 N + 12 L H Q T per token (N = params incl. the tied embedding
used as the logit layer; 12 L H Q T = 12 l h s, the attention score / AV matmuls, fwd+bwd).
Traced on meta (bf16, batch 1, seq 2048, V = 51200) with 1 and 2 layers; layers are identical, so
F(l) = F(1) + (l - 1) (F(2) - F(1)) exactly.
"""
import sys
import torch
import parallelizer
from parallelizer import zoo
from cost_model import graph_flops

ROWS = [  # name, heads, hidden, layers (Narayanan et al. SC'21 Table 1)
    ("1.7B", 24, 2304, 24), ("3.6B", 32, 3072, 30), ("7.5B", 32, 4096, 36), ("18.4B", 48, 6144, 40),
    ("39.1B", 64, 8192, 48), ("76.1B", 80, 10240, 60), ("145.6B", 96, 12288, 80), ("310.1B", 128, 16384, 96),
    ("529.6B", 128, 20480, 105), ("1008B", 160, 25600, 128)]
S, V = 2048, 51200


def flops(layers, hidden, heads):
    model, inputs = zoo.gpt2(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=V, n_positions=S,
                             batch=1, seq_len=S, device="meta")
    traced = parallelizer.trace(model.to(torch.bfloat16), inputs)
    gm = getattr(traced, "graph_module", None) or traced.exported.graph_module
    f, b = graph_flops(gm)
    return f + b


if __name__ == "__main__":
    rows = sys.argv[1:] or [r[0] for r in ROWS]
    print("| model | ours fwd+bwd (PFLOP/sample) | Megatron 72Bslh^2(1+s/6h)+6BshV | ours/Megatron | PaLM 6N+12lhs per token x s | ours/PaLM |")
    for name, a, h, l in ROWS:
        if name not in rows:
            continue
        f1, f2 = flops(1, h, a), flops(2, h, a)
        ours = f1 + (l - 1) * (f2 - f1)
        meg = 72 * S * l * h * h * (1 + S / (6 * h)) + 6 * S * h * V
        n = l * 12 * h * h + V * h  # PaLM's N: layer weights (biases/norms ~0) + tied embedding
        palm = (6 * n + 12 * l * h * S) * S
        print(f"| {name} | {ours/1e15:.4f} | {meg/1e15:.4f} | {ours/meg:.4f} | {palm/1e15:.4f} | {ours/palm:.4f} |", flush=True)
