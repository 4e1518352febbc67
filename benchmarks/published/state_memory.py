"""Planner's per-rank param / grad / optimizer bytes vs ZeRO (Rajbhandari et al. SC'20 Sec. 3.1, Fig. 1) and
Megatron's distributed-optimizer table (NVIDIA/Megatron-LM docs/user-guide/features/dist_optimizer.md, formerly
docs/api-guide/: bf16 params + fp32 grads: 18 B/param, 6 + 12/d distributed). GPT-2 shape (4 layers, hidden
1024, vocab 51200, seq 1024) traced in bf16 on meta, priced on the h100:1x8 preset with bf16 + AdamW."""
import torch
import parallelizer
from parallelizer import zoo

if __name__ == "__main__":
    model, inputs = zoo.gpt2(n_layer=4, n_embd=1024, n_head=16, vocab_size=51200, n_positions=1024, batch=8,
                             seq_len=1024, device="meta")
    traced = parallelizer.trace(model.to(torch.bfloat16), inputs)
    psi = sum(p.numel() for p in model.parameters())
    print(f"Psi = {psi} params; per rank B/param = bytes / Psi")
    print("| mesh / roles | params B/p | grads B/p | optim B/p | total B/p | closed form (2+4+12 bf16 Megatron; ZeRO) |")
    cases = [({"dp": 8}, {"dp": "ddp"}, "DDP: 2 + 4 + 12 = 18"),
             ({"dp": 8}, {"dp": "fsdp"}, "ZeRO-3 / FSDP: 18/8 = 2.25"),
             ({"tp": 8}, {"tp": "tp"}, "TP 8: ~18/8 = 2.25 (+ replicated norms/biases)"),
             ({"dp": 2, "tp": 4}, {"dp": "ddp", "tp": "tp"}, "TP 4 x DDP 2: ~18/4 = 4.5"),
             ({"dp": 2, "tp": 4}, {"dp": "fsdp", "tp": "tp"}, "TP 4 x FSDP 2: ~18/8 = 2.25")]
    for mesh, roles, closed in cases:
        try:
            p = parallelizer.plan(traced, mesh, cluster="h100:1x8", axis_roles=roles, precision="bf16",
                                  optimizer="adamw")
        except Exception as e:  # noqa: BLE001
            print(f"| {mesh} {roles} | {type(e).__name__}: {str(e)[:200]} |")
            continue
        m = p.cost.memory_bytes
        print(f"| {mesh} {roles} | {m['params']/psi:.3f} | {m['grads']/psi:.3f} | {m['optimizer']/psi:.3f} | "
              f"{(m['params']+m['grads']+m['optimizer'])/psi:.3f} | {closed} |", flush=True)
