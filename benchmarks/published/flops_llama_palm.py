"""graph_flops (fwd+bwd) on Llama shapes vs PaLM's 6N + 12 L H Q T FLOPs per token (Chowdhery et al. 2022,
App. B; N = matmul parameters: the layers' weights and the output head, not the input embedding lookup).
Traced on meta in bf16, batch 1, with 1 and 2 layers; F(l) = F(1) + (l-1)(F(2) - F(1)). Also prints the exact
ratio for the GPT rows of flops_megatron.py."""
import torch
import parallelizer
from cost_model import graph_flops

ROWS = [  # name, hidden, ffn, layers, heads, kv heads, vocab, seq
    ("Llama-2-7B", 4096, 11008, 32, 32, 32, 32000, 4096), ("Llama-2-70B", 8192, 28672, 80, 64, 8, 32000, 4096),
    ("Llama-3-8B", 4096, 14336, 32, 32, 8, 128256, 8192)]


def flops(layers, h, ffn, a, kv, v, s):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=a,
                      num_key_value_heads=kv, vocab_size=v, max_position_embeddings=s, use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    tg = parallelizer.trace(model, (torch.zeros(1, s, dtype=torch.long, device="meta"),))
    f, b = graph_flops(tg.graph_module)
    return f + b


if __name__ == "__main__":
    print("| model | ours fwd+bwd per token (GFLOP) | PaLM 6N + 12 l h s (GFLOP) | ours/PaLM |")
    for name, h, ffn, l, a, kv, v, s in ROWS:
        f1, f2 = flops(1, h, ffn, a, kv, v, s), flops(2, h, ffn, a, kv, v, s)
        ours = (f1 + (l - 1) * (f2 - f1)) / s
        d = h // a
        n = l * (2 * h * h + 2 * h * kv * d + 3 * h * ffn) + v * h
        palm = 6 * n + 12 * l * h * s
        print(f"| {name} | {ours/1e9:.3f} | {palm/1e9:.3f} | {ours/palm:.6f} |", flush=True)
