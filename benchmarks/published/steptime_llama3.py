"""Llama 3 405B's published layouts (Llama Team, "The Llama 3 Herd of Models", 2024, Table 4; the same figures on
the slide of Balaji, SC'24, as transcribed at glennklockwood.com/garden/llama-3.1): TP 8, CP 1, PP 16, seq 8192,
16M tokens per batch = 2048 sequences, on 8192 H100s (DP 64): 430 TFLOP/s per GPU, 43% BF16 MFU, and on 16384
(DP 128): 400 TFLOP/s, 41%; priced by plan_pipeline on the h100:(GPUs/8)x8 preset. (Table 4's third row, CP 16 at
seq 131072, 380 TFLOP/s, needs context parallelism, which the planner does not price.) Model: 126 layers, hidden
16384, FFN 53248, 128 heads, 8 KV heads, vocab 128256.
Usage: python -m benchmarks.published.steptime_llama3 [GPUs ...] (default 8192; recompute modes: RECOMPUTE,
default auto,selective,none)"""
import os
import sys
import time
import parallelizer
from benchmarks.published.models import llama_loss_only

if __name__ == "__main__":
    t0 = time.time()
    tg = llama_loss_only(126, 16384, 53248, 128, 8, 128256, 8192)  # the loss alone, as the Llama 3 trainer returns
    print(f"traced in {time.time() - t0:.0f} s", flush=True)
    published = {8192: (430, 0.43), 16384: (400, 0.41)}  # GPUs: TFLOP/s per GPU, BF16 MFU (Table 4)
    for gpus in [int(g) for g in sys.argv[1:]] or [8192]:
        sched, (tflops, mfu) = ("1f1b", "interleaved_1f1b"), published[gpus]
        for rc in os.environ.get("RECOMPUTE", "auto,selective,none").split(","):
            t0 = time.time()
            try:
                p = parallelizer.plan_pipeline(tg, f"h100:{gpus // 8}x8", global_batch=2048, precision="bf16", pp=16,
                                               tp=8, schedules=sched, recompute=rc, progress=False)
            except parallelizer.InfeasiblePlanError as e:
                print(f"recompute={rc}: infeasible: {str(e)[:400]}", flush=True)
                continue
            modes = sorted({s.recompute for s in p.stages})
            print(f"recompute={rc}: pp={p.pp} dp={p.dp} tp={p.tp} {p.schedule} m={p.num_microbatches} x "
                  f"{p.microbatch_size}, step {p.step_time_s:.2f} s, {p.tflops_per_gpu:.0f} TFLOP/s/GPU, MFU "
                  f"{p.mfu:.1%} (published: {tflops} TFLOP/s, {mfu:.0%}; ours/published "
                  f"{p.tflops_per_gpu / tflops:.3f}), peak {p.memory_bytes / 1e9:.1f} GB, stage modes {modes} "
                  f"({time.time() - t0:.0f} s)", flush=True)
