"""Megatron-LM's published layouts (Narayanan et al. SC'21, Table 1: tp, pp, GPUs, global batch; seq 2048,
V 51200, A100-80GB DGX nodes, full activation recomputation) priced by our plan_pipeline, vs their measured
per-GPU throughput. Their TFLOP/s count F_rc = 96 B s l h^2 (1 + s/6h + V/(16 l h)) (recomputation included),
so their step time is T = F_rc / (TFLOP/s x GPUs); our TFLOP/s counts model FLOPs (no recomputation):
compare step times, and MFU = model FLOPs / (T x GPUs x 312e12) for both.
Usage: [SCHEDULES=1f1b] python -m benchmarks.published.steptime_megatron [row names...]
(schedules offered: SCHEDULES, default 1f1b,interleaved_1f1b)"""
import os
import sys
import time
import torch
import parallelizer
from parallelizer import zoo
from cost_model.topology import dgx_a100

ROWS = [  # name, heads, hidden, layers, tp, pp, GPUs, batch, measured TFLOP/s per GPU (Table 1)
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137), ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142), ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138), ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148), ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163), ("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163)]
S, V, PEAK = 2048, 51200, 312e12

if __name__ == "__main__":
    want = sys.argv[1:] or [r[0] for r in ROWS]
    print("| model | tp x pp x dp | their T (s) | their MFU | ours full-rc: plan | T (s) | MFU | ours/their T | ours recompute=auto: T (s) | MFU |")
    for name, a, h, l, tp, pp, gpus, batch, tflops in ROWS:
        if name not in want:
            continue
        t0 = time.time()
        model, inputs = zoo.gpt2(n_layer=l, n_embd=h, n_head=a, vocab_size=V, n_positions=S, batch=1, seq_len=S,
                                 device="meta")
        tg = parallelizer.trace(model.to(torch.bfloat16), inputs)
        f_rc = 96 * batch * S * l * h * h * (1 + S / (6 * h) + V / (16 * l * h))
        f_model = 72 * batch * S * l * h * h * (1 + S / (6 * h)) + 6 * batch * S * h * V
        t_their = f_rc / (tflops * 1e12 * gpus)
        cl = dgx_a100(gpus // 8)
        out = []
        for rc in ("full", "auto"):
            try:
                p = parallelizer.plan_pipeline(tg, cl, global_batch=batch, precision="bf16", pp=pp, tp=tp,
                                               schedules=tuple(os.environ.get("SCHEDULES", "1f1b,interleaved_1f1b").split(",")), recompute=rc, progress=False)
                out.append((p, p.step_time_s, f_model / (p.step_time_s * gpus * PEAK)))
            except Exception as e:  # noqa: BLE001
                out.append((None, f"{type(e).__name__}: {str(e)[:150]}", None))
        (p, t_full, mfu_full), (_, t_auto, mfu_auto) = out
        cfg = (f"{p.schedule}, m={p.num_microbatches} x {p.microbatch_size}" if p else "-")
        fmt = lambda x: f"{x:.3f}" if isinstance(x, float) else str(x)
        ratio = f"{t_full / t_their:.3f}" if isinstance(t_full, float) else "-"
        print(f"| {name} | {tp} x {pp} x {gpus // (tp * pp)} | {t_their:.3f} | {f_model / (t_their * gpus * PEAK):.1%} | "
              f"{cfg} | {fmt(t_full)} | {fmt(mfu_full)} | {ratio} | {fmt(t_auto)} | {fmt(mfu_auto)} |  ({time.time()-t0:.0f} s)",
              flush=True)
