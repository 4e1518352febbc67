"""Measured step time per pipeline schedule on 4 gloo ranks (issue 14): gpipe, 1f1b, interleaved_1f1b,
dualpipev and bitpipe, each running the same GPT-2 (8 blocks, hidden 512, 8 heads, vocab 1024, sequence 128,
global batch 8 = 8 microbatches of 1) through `auto_parallelize` + `pm.step` + AdamW.

Plans: gpipe / 1f1b on 4 stages (2 blocks each), the others on 8 stages (1 block each: interleaved_1f1b
looped, dualpipev in a V, bitpipe two mirrored V pipelines; the 8-stage plans share one cut and differ only
in the schedule). Per schedule: `WARMUP` untimed steps, then `ITERS` timed steps (wall time of `pm.step` +
`opt.step()` on rank 0, after a barrier), median reported; one thread per rank.

    PYTHONPATH=. python -m benchmarks.bench_schedules_runtime        # prints a markdown table

The figures depend on the machine's load (the numbers in benchmarks/RESULTS.md say what it was); use them for
the ORDER of the schedules, to set beside the simulator's (planner side), not as absolute times.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import statistics
import time

import torch
import torch.distributed as dist

import parallelizer
from parallelizer import zoo
from parallelizer.runtime import spawn

GPT = dict(n_layer=8, n_embd=512, n_head=8, vocab_size=1024, batch=8, seq_len=128)
PP, MICROBATCHES, WARMUP, ITERS = 4, 8, 1, 3
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "dualpipev", "bitpipe")


def _plans() -> dict[str, str]:
    """Plan JSON per schedule, made on one microbatch (dualpipev / bitpipe: the interleaved cut, renamed)."""
    traced = parallelizer.trace(*zoo.gpt2(**{**GPT, "batch": GPT["batch"] // MICROBATCHES}))
    out = {}
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        for name in ("gpipe", "1f1b", "interleaved_1f1b"):
            out[name] = parallelizer.plan(traced, {"pp": PP}, schedule=name, microbatches=MICROBATCHES)
    for name in ("dualpipev", "bitpipe"):
        base = out["interleaved_1f1b"]
        out[name] = dataclasses.replace(base, pipeline=dataclasses.replace(base.pipeline, schedule=name))
    return {k: v.to_json() for k, v in out.items()}


def _loss(output, target):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def bench_rank(rank: int, world_size: int, plans: dict[str, str]) -> dict:
    """Median step milliseconds per schedule (rank 0's wall clock) and the first step's loss."""
    torch.set_num_threads(1)
    out = {}
    for name in SCHEDULES:
        torch.manual_seed(0)
        model, (ids,) = zoo.gpt2(**GPT)
        labels = torch.roll(ids, -1, dims=1)
        pm = parallelizer.auto_parallelize(model, (ids,), plan=parallelizer.Plan.from_json(plans[name]))
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-4)
        times, first = [], None
        for i in range(WARMUP + ITERS):
            dist.barrier()
            start = time.perf_counter()
            loss = pm.step(ids, target=labels, loss_fn=_loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            dist.barrier()
            if i >= WARMUP:
                times.append((time.perf_counter() - start) * 1e3)
            first = loss.item() if first is None else first
        out[name] = {"median_ms": statistics.median(times), "ms": times, "loss1": first}
        del pm, opt
    return out


def run() -> str:
    plans = _plans()
    load = os.getloadavg()[0]
    result = spawn(bench_rank, PP, plans, timeout_s=3000)[0]
    rows = ["| schedule | stages | median step (ms) | steps (ms) | first loss |", "|---|---|---|---|---|"]
    for name in SCHEDULES:
        r = result[name]
        stages = len(parallelizer.Plan.from_json(plans[name]).pipeline.stages)
        rows.append(f"| {name} | {stages} | {r['median_ms']:.0f} | {', '.join(f'{t:.0f}' for t in r['ms'])} | "
                    f"{r['loss1']:.6f} |")
    order = sorted(SCHEDULES, key=lambda n: result[n]["median_ms"])
    return "\n".join(rows + ["", f"measured order (fastest first): {' < '.join(order)}; load average at start "
                                 f"{load:.1f} on {os.cpu_count()} cores"])


if __name__ == "__main__":
    print(run())
