"""Llama 3 405B's published layout (Llama Team, "The Llama 3 Herd of Models", 2024, Table 4: 8192 H100s,
TP 8, CP 1, PP 16, DP 64, seq 8192, 16M tokens per batch = 2048 sequences, 430 TFLOP/s per GPU, 43% BF16 MFU)
priced by plan_pipeline on the h100:1024x8 preset. Model: 126 layers, hidden 16384, FFN 53248, 128 heads,
8 KV heads, vocab 128256. Usage: python -m benchmarks.published.steptime_llama3"""
import time
import torch
import parallelizer

if __name__ == "__main__":
    from transformers import LlamaConfig, LlamaForCausalLM
    t0 = time.time()
    cfg = LlamaConfig(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    tg = parallelizer.trace(model, (torch.zeros(1, 8192, dtype=torch.long, device="meta"),))
    print(f"traced in {time.time() - t0:.0f} s", flush=True)
    for sched in (("1f1b", "interleaved_1f1b"),):
        for rc in ("auto", "selective", "none"):
            t0 = time.time()
            try:
                p = parallelizer.plan_pipeline(tg, "h100:1024x8", global_batch=2048, precision="bf16", pp=16, tp=8,
                                               schedules=sched, recompute=rc, progress=False)
            except parallelizer.InfeasiblePlanError as e:
                print(f"recompute={rc}: infeasible: {str(e)[:400]}", flush=True)
                continue
            modes = sorted({s.recompute for s in p.stages})
            print(f"recompute={rc}: pp={p.pp} dp={p.dp} tp={p.tp} {p.schedule} m={p.num_microbatches} x "
                  f"{p.microbatch_size}, step {p.step_time_s:.2f} s, {p.tflops_per_gpu:.0f} TFLOP/s/GPU, MFU "
                  f"{p.mfu:.1%} (published: 430 TFLOP/s, 43%), peak {p.memory_bytes / 1e9:.1f} GB, stage modes "
                  f"{modes} ({time.time() - t0:.0f} s)", flush=True)
