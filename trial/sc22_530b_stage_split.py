"""Korthikanti et al. 2022 530B layout (tp 8, pp 35, dp 1, 280 A100, batch 280, selective recompute) priced by
plan_pipeline: stages get 2 / 3 / 4 blocks because the ILP stage layouts keep ~1.6x Megatron TP+SP+selective
activations per block; step 50.3 s vs the measured 37.9 s (RESULTS "More published measurements priced").
Usage: python trial/sc22_530b_stage_split.py [selective|auto]  (~2-5 min on meta, no ranks)"""
import sys, torch, parallelizer
from parallelizer import zoo
from cost_model.topology import dgx_a100
a, h, l, tp, pp, gpus, batch, rc = 128, 20480, 105, 8, 35, 280, 280, sys.argv[1] if len(sys.argv) > 1 else "selective"
if __name__ == "__main__":
    model, inputs = zoo.gpt2(n_layer=l, n_embd=h, n_head=a, vocab_size=51200, n_positions=2048, batch=1, seq_len=2048, device="meta")
    tg = parallelizer.trace(model.to(torch.bfloat16), inputs)
    p = parallelizer.plan_pipeline(tg, dgx_a100(gpus // 8), global_batch=batch, precision="bf16", pp=pp, tp=tp,
                                   schedules=("1f1b",), recompute=rc, progress=False)
    print(p.step_time_s, p.step_breakdown_s, p.num_microbatches, p.microbatch_size)
    for k in p.stage_kinds:
        print(k.kind, k.stages, f"compute {k.compute_s*1e3:.2f} ms", {x: round(y * 1e3, 3) for x, y in k.comm_s.items()})
    for r in p.ranks[:3] + p.ranks[-2:]:
        print("rank", r.pp_rank, f"{r.time_s*1e3:.2f} ms per microbatch", r.inflight_microbatches, f"{r.memory_bytes/1e9:.1f} GB")
