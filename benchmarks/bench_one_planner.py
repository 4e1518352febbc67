"""The one planner on the user's path (`parallelizer.plan` without a mesh = `parallelizer plan` without
`--mesh`): wall and CPU time by phase for Llama-2-7B on 64 simulated H100s (issue 13's target: < 30 s with pp
searched). `python -m benchmarks.bench_one_planner` (about 20 s of CPU on 2 cores; prints markdown).

Model: transformers LlamaConfig hidden 4096, intermediate 11008, 32 layers, 32 heads, vocab 32000 (the
Llama-2-7B shape), seq 4096, global batch 64, cluster h100:8x8, bf16 (the CLI's default on a GPU preset),
built on `meta` by `parallelizer.presets` exactly as the CLI does (the search graph traced at ONE sample,
`cli.cmd_plan`). Phases: import, build + trace at batch 1, the search (`plan_pipeline` inside `plan`), the
re-trace at the winner's microbatch, the final per-stage ILPs and Plan assembly, JSON save: wall seconds and
CPU seconds of this process (`time.process_time`, which other jobs on a shared machine inflate far less than
wall time). Also the load average, since the machine is shared.
"""
from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time

START, START_CPU = time.perf_counter(), time.process_time()
import parallelizer  # noqa: E402
from parallelizer import presets  # noqa: E402

CONFIG = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
              vocab_size=32000)
GLOBAL_BATCH, SEQ_LEN, CLUSTER = 64, 4096, "h100:8x8"


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since `t = _clock()`."""
    now = _clock()
    return now[0] - t[0], now[1] - t[1]


def run() -> str:
    """Plan once with per-phase timers; returns a markdown section."""
    phases = {"import": _since((START, START_CPU))}
    t = _clock()
    traced = parallelizer.trace(*presets.build(presets.recipe("llama", CONFIG, 1, SEQ_LEN), "meta"))
    phases["build + trace at batch 1"] = _since(t)
    retraced = []

    def retrace(batch):
        t0 = _clock()
        out = parallelizer.trace(*presets.build(presets.recipe("llama", CONFIG, batch, SEQ_LEN), "meta"))
        retraced.append(_since(t0))
        return out

    t = _clock()
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, cluster=CLUSTER, global_batch=GLOBAL_BATCH, retrace=retrace, progress=False)
    total = _since(t)
    again = tuple(sum(r[i] for r in retraced) for i in range(2))
    phases["re-trace at the winner's microbatch"] = again
    phases["search + final ILP + Plan"] = (total[0] - again[0], total[1] - again[1])
    t = _clock()
    with tempfile.TemporaryDirectory() as d:
        plan.save(os.path.join(d, "plan.json"))
        size = os.path.getsize(os.path.join(d, "plan.json"))
    phases["save JSON"] = _since(t)
    s = plan.model["search"]
    mesh = dict(zip(s["mesh"]["axis_names"], s["mesh"]["shape"]))
    mem = plan.cost.memory_bytes
    lines = ["## One planner: Llama-2-7B shape on h100:8x8 (`benchmarks/bench_one_planner.py`)", "",
             f"Load average at the end: {os.getloadavg()[0]:.1f} (2 cores, shared). Chosen: {mesh}, "
             f"{s['schedule'] if plan.pipeline else 'no pipeline'}, {s['microbatches']} microbatches; search "
             f"estimate {s['step_s'] * 1e3:.1f} ms per step; {s['candidates']} candidates, {s['priced']} priced, "
             f"{s['pruned']} pruned; peak memory {mem.get('peak', mem['total']) / 1e9:.1f} GB + reserve "
             f"{plan.cost.memory_bytes['reserve'] / 1e9:.1f} GB of {plan.config['memory_budget_bytes'] / 1e9:.0f} GB; "
             f"plan JSON {size / 1e3:.0f} KB.", "", "| phase | wall s | CPU s |", "|---|---|---|"]
    lines += [f"| {k} | {w:.1f} | {c:.1f} |" for k, (w, c) in phases.items()]
    lines.append(f"| **total** | **{sum(w for w, _ in phases.values()):.1f}** | "
                 f"**{sum(c for _, c in phases.values()):.1f}** |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run())
