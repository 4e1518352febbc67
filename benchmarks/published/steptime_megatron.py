"""Megatron-LM's published layouts priced by our plan_pipeline, vs their measured per-GPU throughput.
Each row: the published tp, pp, GPUs and global batch on DGX nodes of the table's GPU; microbatches and
schedule free. Tables (`python -m benchmarks.published.steptime_megatron [TABLE] [row names...]`, TABLE one of
sc21 (default), sc22, h100):

* sc21: Narayanan et al. SC'21 Table 1 (= the Megatron-LM README's table of April 2021, images/cases_april2021.png
  at NVIDIA/Megatron-LM@f2e5db402c^: hidden, layers, model-parallel size tp x pp, GPUs, batch, TFLOP/s per GPU);
  seq 2048, V 51200, A100-80GB, full activation recomputation. Their TFLOP/s count F_rc = 96 B s l h^2 (1 + s/6h
  + V/(16 l h)) (recomputation included), so their step is T = F_rc / (TFLOP/s x GPUs).
* sc22: Korthikanti et al. 2022 (arXiv 2205.05198) Table 3 layouts (22B / 175B / 530B / 1T, dp = 1, seq 2048,
  V 51200, A100-80GB) with selective recomputation + sequence parallelism; the model FLOPs utilisation as the
  Megatron-LM README of 2022-2024 gives it (NVIDIA/Megatron-LM@f2e5db402c^ README: 41.5 / 51.4 / 56.0 / 56.3%),
  so T = model FLOPs / (MFU x GPUs x 312 TFLOP/s) (= their Table 5 "present work" 1.10 / 13.75 / 37.83 / 71.49 s
  within 0.3%).
* h100: the Megatron-LM README's weak-scaling table on H100 (images/model_table.png @ f2e5db402c, July 2024):
  seq 4096, V 131072, dp 48, model TFLOP/s per GPU (their `num_floating_point_operations`: 72 B s l h^2 (1 +
  s/6h + V/(12 l h)) for this GPT), DP/TP/PP communication overlapped, recomputation not stated.

Our MFU: model FLOPs (72 form, no recomputation) / (T x GPUs x peak), for both.
The model computes its loss inside and returns it alone, as Megatron's last stage does (`models.gpt_loss_only`).
(schedules offered: SCHEDULES, default 1f1b,interleaved_1f1b; ACTIVATION=gelu: the MLP's GeLU as one op saving only
its input, as Megatron's fused bias-GeLU kernel does and Korthikanti Table 2 counts, instead of transformers GPT-2's
default gelu_new, whose eager decomposition saves several 4h-wide intermediates)"""
import os
import sys
import time
import parallelizer
from benchmarks.published.models import gpt_loss_only
from cost_model.topology import dgx_a100, dgx_h100

# name, heads, hidden, layers, tp, pp, GPUs, batch, published figure
ROWS = [  # Narayanan et al. SC'21 Table 1; figure = achieved TFLOP/s per GPU (recomputation counted)
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137), ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142), ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138), ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148), ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163), ("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163)]
SC22_ROWS = [  # Korthikanti et al. 2022 Table 3; figure = MFU (Megatron-LM README)
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 0.415), ("175B", 96, 12288, 96, 8, 8, 64, 64, 0.514),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 0.560), ("1T", 160, 25600, 128, 8, 64, 512, 512, 0.563)]
H100_ROWS = [  # Megatron-LM README weak scaling on H100 (July 2024); figure = model TFLOP/s per GPU
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8), ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1), ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7), ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8), ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9)]


def model_flops(batch, s, l, h, v):
    """Narayanan eq. (3) without recomputation = Megatron's `num_floating_point_operations` for a GPT."""
    return 72 * batch * s * l * h * h * (1 + s / (6 * h)) + 6 * batch * s * h * v


def their_step_sc21(batch, s, l, h, v, gpus, tflops, peak):
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)) / (tflops * 1e12 * gpus)


TABLES = {  # rows, seq, vocab, cluster(nodes), peak FLOP/s, their step time (s), recompute modes, attention
    # (2021-22 Megatron materialised the s x s scores with a fused softmax: "eager"; 2024 runs flash attention)
    "sc21": (ROWS, 2048, 51200, dgx_a100, 312e12, their_step_sc21, ("full", "auto"), "eager"),
    "sc22": (SC22_ROWS, 2048, 51200, dgx_a100, 312e12,
             lambda b, s, l, h, v, g, mfu, peak: model_flops(b, s, l, h, v) / (mfu * g * peak), ("selective", "auto"), "eager"),
    "h100": (H100_ROWS, 4096, 131072, dgx_h100, 989.5e12,
             lambda b, s, l, h, v, g, tf, peak: model_flops(b, s, l, h, v) / (tf * 1e12 * g), ("auto", "selective"), "sdpa"),
}

# Did the measured runtime overlap the dp gradient all-reduce with backward? Megatron-LM's local DDP all-reduced
# after the backward until `--overlap-grad-reduce` (Sept 2023: NVIDIA/Megatron-LM#391, #428); the H100 table
# ran with DP communication overlapped (its README). Our runtime overlaps (plan_pipeline's default).
OVERLAP = {"sc21": False, "sc22": False, "h100": True}

if __name__ == "__main__":
    args = sys.argv[1:]
    table = args.pop(0) if args and args[0] in TABLES else "sc21"
    rows, S, V, cluster_of, peak, their_step, modes, attn = TABLES[table]
    want = args or [r[0] for r in rows]
    print(f"| model | tp x pp x dp | their T (s) | their MFU | ours {modes[0]}: plan | T (s) | MFU | ours/their T | "
          f"ours recompute={modes[1]}: T (s) | MFU |")
    for name, a, h, l, tp, pp, gpus, batch, figure in rows:
        if name not in want:
            continue
        t0 = time.time()
        tg = gpt_loss_only(l, h, a, V, S, attn, **({"activation_function": os.environ["ACTIVATION"]}
                                                    if "ACTIVATION" in os.environ else {}))
        f_model = model_flops(batch, S, l, h, V)
        t_their = their_step(batch, S, l, h, V, gpus, figure, peak)
        cl = cluster_of(gpus // 8)
        out = []
        for rc in modes:
            try:
                p = parallelizer.plan_pipeline(tg, cl, global_batch=batch, precision="bf16", pp=pp, tp=tp,
                                               schedules=tuple(os.environ.get("SCHEDULES", "1f1b,interleaved_1f1b").split(",")), recompute=rc, progress=False,
                                               overlap_grad_sync=OVERLAP[table])
                out.append((p, p.step_time_s, f_model / (p.step_time_s * gpus * peak)))
            except Exception as e:  # noqa: BLE001
                out.append((None, f"{type(e).__name__}: {str(e)[:150]}", None))
        (p, t_full, mfu_full), (_, t_auto, mfu_auto) = out
        cfg = (f"{p.schedule}, m={p.num_microbatches} x {p.microbatch_size}, {sorted({s.recompute for s in p.stages})}, "
               f"dp sync {p.step_breakdown_s['dp_grad_sync']:.3f} s, bubble {p.step_breakdown_s['bubble']:.3f} s"
               if p else "-")
        fmt = lambda x: f"{x:.3f}" if isinstance(x, float) else str(x)
        ratio = f"{t_full / t_their:.3f}" if isinstance(t_full, float) else "-"
        print(f"| {name} | {tp} x {pp} x {gpus // (tp * pp)} | {t_their:.3f} | {f_model / (t_their * gpus * peak):.1%} | "
              f"{cfg} | {fmt(t_full)} | {fmt(mfu_full)} | {ratio} | {fmt(t_auto)} | {fmt(mfu_auto)} |  ({time.time()-t0:.0f} s)",
              flush=True)
