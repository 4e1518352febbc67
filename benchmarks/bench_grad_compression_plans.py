"""Data-parallel gradient compression chosen by the planner (issue 15): the GPT-3 XL shape on slow-link and
DGX cluster presets, best uncompressed plan vs `compression="auto"`.
`python -m benchmarks.bench_grad_compression_plans` (about 1 minute idle on 2 cores; prints markdown).

Model: `parallelizer.zoo.gpt` with GPT-3 XL's shape (Brown et al. 2020, Table 2.1: 24 layers, d_model 2048,
context 2048, batch 1M tokens -> 512 sequences; the table's 24 heads of d_head 128 do not multiply to d_model
2048, so 16 heads of 128), vocabulary 50304, bf16, on `meta`. The search
engine `plan_pipeline` prices every (pp, dp, tp), microbatch count and schedule; with "auto" each candidate's
dp sync may be bf16 or PowerSGD rank 4 (`planner/compression.py`). Estimates only: nothing here is measured.
"""
from __future__ import annotations

import time

import torch

import parallelizer
from parallelizer import zoo

CLUSTERS = ("internet:8x1", "ethernet:4x8", "a100:8x8", "h100:8x8")
GLOBAL_BATCH = 512  # GPT-3 XL: 1M tokens per batch (Table 2.1) / 2048 tokens per sequence


def run() -> str:
    """Plan each cluster twice (compression none / auto); returns a markdown section."""
    model, inputs = zoo.gpt(n_layer=24, n_embd=2048, n_head=16, block_size=2048, vocab_size=50304, batch=1,
                            with_targets=True, device="meta")
    traced = parallelizer.trace(model.to(torch.bfloat16), inputs)
    rows = []
    for cluster in CLUSTERS:
        t = time.perf_counter()
        plain = parallelizer.plan_pipeline(traced, cluster, global_batch=GLOBAL_BATCH, progress=False)
        auto = parallelizer.plan_pipeline(traced, cluster, global_batch=GLOBAL_BATCH, compression="auto",
                                          progress=False)
        c = auto.compression
        rows.append(f"| {cluster} | {plain.mesh} x{plain.num_microbatches} {plain.schedule} | "
                    f"{plain.step_time_s:.3f} | {c['chosen']} | {auto.mesh} x{auto.num_microbatches} | "
                    f"{auto.step_time_s:.3f} | {auto.step_breakdown_s['dp_grad_sync']:.3f} | {c['speedup']:.1f}x | "
                    f"{time.perf_counter() - t:.1f} |")
    head = (f"## Gradient compression chosen by the planner (`benchmarks/bench_grad_compression_plans.py`)\n\n"
            f"GPT-3 XL shape ({traced.num_parameters / 1e9:.2f}B parameters), global batch {GLOBAL_BATCH} x 2048 "
            "tokens, bf16; estimated seconds per step.\n\n"
            "| cluster | best uncompressed plan | step s | auto picks | its plan | step s | dp sync s | speedup | "
            "planning s |\n|---|---|---|---|---|---|---|---|---|")
    return "\n".join([head, *rows])


if __name__ == "__main__":
    print(run())
