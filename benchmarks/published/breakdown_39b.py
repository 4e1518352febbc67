"""Step breakdown of Megatron's 39.1B layout (tp 8, pp 2, dp 32, full recomputation, 1F1B) as our model prices it."""
import parallelizer
from benchmarks.published.models import gpt_loss_only
from cost_model.topology import dgx_a100

if __name__ == "__main__":
    tg = gpt_loss_only(48, 8192, 64, 51200, 2048, "eager")  # the loss alone, as Megatron
    p = parallelizer.plan_pipeline(tg, dgx_a100(64), global_batch=1536, precision="bf16", pp=2, tp=8,
                                   schedules=("1f1b",), recompute="full", progress=False)
    print(p.step_time_s, p.step_breakdown_s, p.num_microbatches, p.microbatch_size)
    for k in p.stage_kinds:
        print(k.kind, k.stages, f"compute {k.compute_s*1e3:.2f} ms", {a: round(b * 1e3, 3) for a, b in k.comm_s.items()},
              {a: round(b / 1e9, 2) for a, b in k.memory_bytes.items()})
    for r in p.ranks:
        print("rank", r.pp_rank, f"{r.time_s*1e3:.2f} ms per microbatch", r.inflight_microbatches, f"{r.memory_bytes/1e9:.1f} GB")
