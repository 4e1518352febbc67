"""Every pipeline schedule simulated from its own action list (`parallelizer.planner.simulate`): step time,
bubble and peak in-flight activations per (p, m), with equal work per rank and microbatch, then with a
point-to-point transfer per stage boundary; and which schedule the planner picks for a small GPT on two
clusters (why: `PipelinePlan.alternatives`).

Units: a rank's per-microbatch work is F + I + W = 3 (F = I = W = 1 per unit of model on one rank); a
schedule with 2 stages per rank runs chunks of half that (BitPipe: 2 copies, each m/2 microbatches).
`python -m benchmarks.bench_schedules` prints markdown for benchmarks/RESULTS.md.
"""
from __future__ import annotations

import time

import torch

import parallelizer
from parallelizer import zoo
from parallelizer.planner.simulate import StageTimes, simulate

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe")
SHAPES = ((4, 8), (4, 16), (8, 16), (8, 32), (16, 64))


def _row(name: str, p: int, m: int, p2p: float) -> str:
    v = 1 if name in ("gpipe", "1f1b") else 2
    start = time.perf_counter()
    sim = simulate(name, p, m, StageTimes.uniform(p * v, 1.0 / v, 1.0 / v, 1.0 / v, p2p=p2p))
    took = time.perf_counter() - start
    ideal = max(sim.busy_s)
    return (f"| {name} | {p} | {m} | {p2p:g} | {sim.makespan_s:.2f} | {sim.bubble_s / ideal:.4f} | "
            f"{sim.bubble_s / sim.compute_end_s:.1%} | {max(sim.inflight_microbatches):.2f} | {took * 1e3:.0f} |")


def table() -> str:
    rows = ["| schedule | p | m | p2p | step (units) | bubble / ideal | bubble fraction | peak in flight (mb) "
            "| simulate (ms, incl. compile) |", "|---|---|---|---|---|---|---|---|---|"]
    for p, m in SHAPES:
        for name in SCHEDULES:
            rows.append(_row(name, p, m, 0.0))
    for name in SCHEDULES:
        rows.append(_row(name, 8, 32, 0.1))
    return "\n".join(rows)


def planner_choice() -> str:
    """The schedule the search picks for an 8-block GPT (hidden 1024, vocabulary 50304) on 8 GPUs, pp = 4
    fixed, all six schedules: A100 and H100 nodes with the device's memory, then A100 with 2 GB per device
    (BitPipe's second weight copy no longer fits)."""
    model, inputs = zoo.gpt(n_layer=8, n_embd=1024, n_head=16, block_size=1024, vocab_size=50304, batch=1,
                            with_targets=True, device="meta")
    traced = parallelizer.trace(model.to(torch.bfloat16), inputs)
    out = []
    for cluster, batch, budget in (("a100:1x8", 32, None), ("h100:1x8", 8, None), ("a100:1x8", 32, 2 * 10**9)):
        plan = parallelizer.plan_pipeline(traced, cluster, global_batch=batch, pp=4, schedules=SCHEDULES,
                                          precision="bf16", progress=False, memory_budget_bytes=budget)
        out.append(f"\n{cluster}, global batch {batch}, pp=4" + (f", {budget / 1e9:g} GB per device" if budget else "")
                   + ":")
        out += [f"- {a.line()}" for a in plan.alternatives]
    return "\n".join(out)


if __name__ == "__main__":
    import sys
    print(planner_choice() if "--choice" in sys.argv else table() + "\n" + planner_choice())
