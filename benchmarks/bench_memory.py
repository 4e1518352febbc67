"""Benchmark: predicted vs measured memory per rank, by category, for plans of different kinds on gloo ranks.

Issue 13 (a memory model you can trust) asks for predicted vs measured peak per rank within 10% on at least
8 plans. Each plan is made by the planner (`parallelizer.plan`, real costs, the kind forced with
`axis_roles`) for the very model and batch that then runs on CPU gloo ranks; the prediction is the plan's
`cost.memory_bytes` (params, grads, optimizer, activations, buffers); the measurement is what each rank
holds (`benchmarks._memory_workers`: local parameters and buffers, `.grad`s after backward, AdamW state
after one step, tensors saved for backward during one forward via saved-tensor hooks). The largest rank is
reported; the error is (predicted - measured) / measured of the sum of the categories.

Models (fp32, CPU): transformers GPT-2 (2 layers, hidden 64, 4 heads, vocab 256; batch 8 x 64 tokens, labels
inside the model, so logits and loss are part of the graph) and the zoo MLP (in 32, dim 64, hidden 256,
depth 2, batch 256).
Kinds: ddp, fsdp (ZeRO-3), tp on 2 ranks; ddp, fsdp, tp, ddp x tp, fsdp x tp on 4 ranks.
Run: `python -m benchmarks.bench_memory`.
"""
from __future__ import annotations

import contextlib
import io

import parallelizer
from benchmarks._memory_workers import measure_rank
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import launch

MODELS = {
    "gpt2": (zoo.gpt2, dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, batch=8, seq_len=64, labels=True)),
    "mlp": (zoo.mlp, dict(in_features=32, dim=64, hidden=256, depth=2, batch=256)),
}
KINDS = {
    2: {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"})},
    4: {"ddp": ({"dp": 4}, {"dp": "ddp"}), "fsdp": ({"dp": 4}, {"dp": "fsdp"}), "tp": ({"tp": 4}, {"tp": "tp"}),
        "ddp x tp": ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}),
        "fsdp x tp": ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})},
}
CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")
TARGET = 0.10


def measure() -> list[dict]:
    """One row per (model, world size, kind): predicted and measured bytes by category (largest rank)."""
    rows = []
    for world_size, kinds in KINDS.items():
        cases, meta = [], []
        for model, (fn, kwargs) in MODELS.items():
            traced = parallelizer.trace(*fn(**kwargs))
            for kind, (mesh, roles) in kinds.items():
                with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
                    plan = parallelizer.plan(traced, mesh, axis_roles=roles, precision="fp32")  # as it runs on CPU
                cases.append((fn, kwargs, spec_from_plan(plan)))
                meta.append((model, kind, plan))
        per_rank = launch.spawn(measure_rank, world_size, cases, timeout_s=600)
        for i, (model, kind, plan) in enumerate(meta):
            measured = max((ranks[i] for ranks in per_rank), key=lambda r: sum(r.values()))
            predicted = {k: int(plan.cost.memory_bytes.get(k, 0)) for k in CATEGORIES}
            rows.append({"model": model, "devices": world_size, "kind": kind, "predicted": predicted,
                         "measured": measured})
    return rows


def _kb(n: int) -> str:
    return f"{n / 1024:.1f}"


def run() -> str:
    rows = measure()
    lines = ["## Memory per rank: predicted vs measured (`benchmarks/bench_memory.py`)", "",
             "KiB on the largest rank; predicted = the plan's `cost.memory_bytes`, measured = local parameters, "
             "buffers, grads after backward, AdamW state, tensors saved for backward (saved-tensor hooks). "
             f"Target: total within {TARGET:.0%}.", "",
             "| model | devices | kind | " + " | ".join(f"{c} pred / meas" for c in CATEGORIES)
             + " | total pred / meas | error |", "|" + "---|" * (5 + len(CATEGORIES))]
    within = 0
    for r in rows:
        p, m = r["predicted"], r["measured"]
        tp, tm = sum(p.values()), sum(m.values())
        err = (tp - tm) / tm if tm else 0.0
        within += abs(err) <= TARGET
        lines.append(f"| {r['model']} | {r['devices']} | {r['kind']} | "
                     + " | ".join(f"{_kb(p[c])} / {_kb(m[c])}" for c in CATEGORIES)
                     + f" | {_kb(tp)} / {_kb(tm)} | {err:+.1%} |")
    lines += ["", f"{within} of {len(rows)} plans within {TARGET:.0%}."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
