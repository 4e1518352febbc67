"""torchtitan's published Llama 3.1 8B FSDP throughput (pytorch/torchtitan,
benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3: 8 and 128 H100 (96 GB HBM2e, 500 W), FSDP,
local batch 2, seq 8192, selective activation checkpointing, bf16; TPS/GPU eager / + torch.compile: 8 GPUs
5,762 / 6,667, 128 GPUs 5,605 / 6,514) against `parallelizer.plan` with the same layout: mesh {"dp": n}
role fsdp on the h100:(n/8)x8 preset with their 96 GB per GPU (budget 96 GiB less the default reserve, 10% +
1 GB), bf16 + AdamW, traced on `meta` with the global batch (2 n sequences of 8192 tokens). recompute="auto":
our "selective" (Korthikanti's: every block keeps all but the attention core) needs >= 141 GB per device here;
torchtitan's selective is op-level SAC (recomputes every second matmul), which we do not model, so the planner
picks per block among none / selective / full to fit. Ours: tokens per GPU per second = 2 x 8192 / plan.cost.total_s
(compute + every collective, nothing overlapped). Model: hidden 4096, FFN 14336, 32 layers, 32 heads,
8 KV heads, vocab 128256 (untied head), SDPA, returning only the loss (`LossOnly`).
Usage: python -m benchmarks.published.steptime_torchtitan [gpus...]"""
import sys
from collections import Counter
import time
import torch
import parallelizer
from cost_model import graph_flops

ROWS = {8: (5762, 6667), 128: (5605, 6514)}  # GPUs: published TPS/GPU (eager FSDP, FSDP + torch.compile)
LOCAL_BATCH, SEQ = 2, 8192


class LossOnly(torch.nn.Module):
    """The causal LM returning its loss alone (torchtitan's step never returns logits; a traced model that
    returns them has them all-gathered whole: 538 GB on 128 GPUs, 2.3 s of the step)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, labels):
        return self.lm(ids, labels=labels).loss


def traced(batch):
    """Llama 3.1 8B on `meta`, the loss inside (`LossOnly`), as torchtitan computes it on each rank."""
    from parallelizer.zoo import hf
    model, args, kwargs = hf.llama(batch, SEQ, device="meta", labels=True, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                   vocab_size=128256, max_position_embeddings=SEQ, attn_implementation="sdpa")
    return parallelizer.trace(LossOnly(model.to(torch.bfloat16)), (*args, kwargs["labels"]))


if __name__ == "__main__":
    want = [int(g) for g in sys.argv[1:]] or list(ROWS)
    print("| GPUs | plan | ours: step (s) | compute / comm (s) | TPS/GPU | model TFLOP/s/GPU (MFU of 989.5) | "
          "torchtitan eager / compile TPS/GPU | ours / eager | ours / compile |")
    for gpus in want:
        t0 = time.time()
        tg = traced(LOCAL_BATCH * gpus)
        f, b = graph_flops(tg.graph_module)
        p = parallelizer.plan(tg, {"dp": gpus}, cluster=f"h100:{gpus // 8}x8", axis_roles={"dp": "fsdp"},
                              precision="bf16", optimizer="adamw", recompute="auto", memory_reserve_bytes=0,
                              memory_budget_bytes=int(96 * 2**30 * 0.9 - 1e9))
        c = p.cost
        tps = LOCAL_BATCH * SEQ / c.total_s
        tflops = (f + b) / gpus / c.total_s / 1e12
        eager, comp = ROWS[gpus]
        comm = {k: round(v, 3) for k, v in c.comm_s.items() if v}
        print(f"| {gpus} | {p.mesh} recompute {dict(Counter(p.recompute.values())) or 'none'} | {c.total_s:.3f} | "
              f"{c.compute_s:.3f} / {comm} | {tps:,.0f} | {tflops:.0f} ({tflops / 989.5:.1%}) | {eager:,} / {comp:,} | "
              f"{tps / eager:.3f} | {tps / comp:.3f} |  ({time.time() - t0:.0f} s, peak "
              f"{c.memory_bytes['total'] / 2**30:.1f} GiB)", flush=True)
