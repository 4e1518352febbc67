"""Benchmark: what activation recomputation (`Plan.recompute`, `rewriter.recompute`) does on gloo ranks.

For 2-layer GPT-2 (transformers, fp32, hidden 64, 4 heads, vocab 256, batch 4 x 16 tokens, dropout 0.1)
and the planner's plans of each kind (forced with `axis_roles`: ddp, fsdp, tp on 2 ranks; ddp x tp on 4),
the plan is run as planned and with `Plan.recompute` set to "full" and to "selective" for both blocks,
3 AdamW steps each with the same RNG (`benchmarks._recompute_workers.recompute_rank`). Per (kind, mode),
over all ranks: the largest difference of losses / gradients (every step) / parameters against the plan
without recomputation, bytes saved for backward outside recomputed regions (unique storages, each counted
at its size when saved, so a gathered FSDP weight released after forward counts whole; step 0; the
largest rank), softmax calls in one step's forward + backward (2 without recomputation), and the
forward collectives inside the recomputed regions (they run again in backward).
Run: `python -m benchmarks.bench_recompute` (about 4 min on this machine under load).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io

import parallelizer
from benchmarks._recompute_workers import GPT2, recompute_rank
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn

KINDS = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"}),
         "ddp x tp": ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"})}
BLOCKS = ("transformer.h.0", "transformer.h.1")


def main() -> None:
    traced = parallelizer.trace(*zoo.gpt2(dropout=0.1, **GPT2))
    print("| kind | ranks | mode | max diff (loss, grads, params) | saved bytes (plain -> recomputed) "
          "| softmax calls | collectives in regions |\n|---|---|---|---|---|---|---|")
    for kind, (mesh, roles) in KINDS.items():
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            plan = parallelizer.plan(traced, mesh, axis_roles=roles, precision="fp32")
        by_mode = {m: spec_from_plan(dataclasses.replace(plan, recompute={b: m for b in BLOCKS}))
                   for m in ("full", "selective")}
        world = plan.mesh.world_size
        ranks = spawn(recompute_rank, world, [(kind, spec_from_plan(plan), by_mode)], 0.1, 3, [], timeout_s=900)
        for mode in by_mode:
            rows = [r["recompute"][f"{kind}_{mode}"] for r in ranks]
            worst = max(max(r["loss"], r["grad"], r["params"]) for r in rows)
            saved = max(rows, key=lambda r: r["saved"][0])["saved"]
            print(f"| {kind} | {world} | {mode} | {worst:.1e} | {saved[0]:,} -> {saved[1]:,} "
                  f"({saved[1] / saved[0]:.2f}x) | {rows[0]['softmax'][0]} -> {rows[0]['softmax'][1]} "
                  f"| {rows[0]['region_collectives']} |", flush=True)


if __name__ == "__main__":
    main()
