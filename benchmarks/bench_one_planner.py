"""The one planner on the user's path (`parallelizer.plan` without a mesh = `parallelizer plan` without
`--mesh`): wall time by phase for Llama-2-7B on 64 simulated H100s (issue 13's target: < 30 s with pp searched).
`python -m benchmarks.bench_one_planner` (about 30 s idle on 2 cores; prints markdown).

Model: transformers LlamaConfig hidden 4096, intermediate 11008, 32 layers, 32 heads, vocab 32000 (the
Llama-2-7B shape), seq 4096, global batch 64, cluster h100:8x8, bf16 (the CLI's default on a GPU preset),
built on `meta` by `parallelizer.presets` exactly as the CLI does. Phases: import, build + trace at the
global batch, the search (`plan_pipeline` inside `plan`), the re-trace at the winner's microbatch (when it
differs), the final ILP and Plan assembly, JSON save. Also the load average, since the machine is shared.
"""
from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time

START = time.perf_counter()
import parallelizer  # noqa: E402
from parallelizer import presets  # noqa: E402

CONFIG = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
              vocab_size=32000)
GLOBAL_BATCH, SEQ_LEN, CLUSTER = 64, 4096, "h100:8x8"


def run() -> str:
    """Plan once with per-phase timers; returns a markdown section."""
    phases = {"import": time.perf_counter() - START}
    t = time.perf_counter()
    traced = parallelizer.trace(*presets.build(presets.recipe("llama", CONFIG, GLOBAL_BATCH, SEQ_LEN), "meta"))
    phases["build + trace"] = time.perf_counter() - t
    retraced = []

    def retrace(batch):
        t0 = time.perf_counter()
        out = parallelizer.trace(*presets.build(presets.recipe("llama", CONFIG, batch, SEQ_LEN), "meta"))
        retraced.append(time.perf_counter() - t0)
        return out

    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, cluster=CLUSTER, global_batch=GLOBAL_BATCH, retrace=retrace, progress=False)
    total = time.perf_counter() - t
    phases["re-trace at the winner's microbatch"] = sum(retraced)
    phases["search + final ILP + Plan"] = total - sum(retraced)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        plan.save(os.path.join(d, "plan.json"))
        size = os.path.getsize(os.path.join(d, "plan.json"))
    phases["save JSON"] = time.perf_counter() - t
    s = plan.model["search"]
    mesh = dict(zip(s["mesh"]["axis_names"], s["mesh"]["shape"]))
    lines = ["## One planner: Llama-2-7B shape on h100:8x8 (`benchmarks/bench_one_planner.py`)", "",
             f"Load average at the end: {os.getloadavg()[0]:.1f} (2 cores, shared). Chosen: {mesh}, "
             f"{s['schedule'] if plan.pipeline else 'no pipeline'}, {s['microbatches']} microbatches; search "
             f"estimate {s['step_s'] * 1e3:.1f} ms per step; {s['candidates']} candidates, {s['priced']} priced, "
             f"{s['pruned']} pruned; peak memory {plan.cost.memory_bytes['total'] / 1e9:.1f} GB + reserve "
             f"{plan.cost.memory_bytes['reserve'] / 1e9:.1f} GB of {plan.config['memory_budget_bytes'] / 1e9:.0f} GB; "
             f"plan JSON {size / 1e3:.0f} KB.", "", "| phase | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in phases.items()]
    lines.append(f"| **total** | **{sum(phases.values()):.1f}** |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run())
