"""Benchmark: predicted vs measured memory per rank, by category, for plans of different kinds on gloo ranks.

Issue 13 (a memory model you can trust) asks for predicted vs measured peak per rank within 10% on at least
8 plans. Each plan is made by the planner (`parallelizer.plan`, real costs, the kind forced with
`axis_roles`) for the very model and batch that then runs on CPU gloo ranks; the prediction is the plan's
`cost.memory_bytes` (params, grads, optimizer, activations, buffers); the measurement is what each rank
holds (`benchmarks._memory_workers`: local parameters and buffers, `.grad`s after backward, AdamW state
after one step, tensors saved for backward during one forward via saved-tensor hooks). The largest rank is
reported; the error is (predicted - measured) / measured of the sum of the categories.

Models (fp32, CPU): transformers GPT-2 (2 layers, hidden 64, 4 heads, vocab 256; batch 8 x 64 tokens, labels
inside the model, so logits and loss are part of the graph), the zoo MLP (in 32, dim 64, hidden 256,
depth 2, batch 256) and, on tp and fsdp x tp, a reduced Llama (hidden 64, 2 layers, GQA 4/2 heads, rotary,
RMSNorm, vocab 256, 8 x 64 tokens, loss returned alone).
Kinds: ddp, fsdp (ZeRO-3, reshard after forward), tp, ddp + zero1 on 2 ranks; ddp, fsdp, tp, ddp x tp, fsdp x tp,
ddp + zero1, ddp x tp + zero1 on 4 ranks. A zero1 plan (`PlanConfig.zero1`) runs torch's ZeroRedundancyOptimizer
over `pm.process_group("dp")` (`runtime.zero1.plan_optimizer`), which partitions whole tensors greedily by size:
its measured optimizer state is the largest rank's partition, the prediction 1/N of the whole.

Pipeline plans (4 gloo ranks; microbatch 2 x 64 tokens, 4 microbatches): GPT-2 with 4 layers on pp=2 x dp=2,
pp=2 x tp=2 and pp=4 with 1F1B, pp=4 with GPipe; the reduced Llama with 4 layers on pp=2 x tp=2 1F1B. Predicted per pipeline rank by
`parallelizer.pipeline_memory.pipeline_rank_memory` (stage training state + in-flight microbatches x the
stage's saved activations); measured per rank during one pipeline step (`_memory_workers.measure_pipeline_rank`:
the PEAK of saved tensors alive at once, via saved-tensor hooks). The row shows the rank holding the most, and
the largest error over all ranks.
Run: `python -m benchmarks.bench_memory` (prints the table and replaces its section of benchmarks/RESULTS.md);
`python -m benchmarks.bench_memory --peak`: the step-peak table alone (2x2 meshes, bf16, recomputation and pipeline
plans beside the 2-rank ones; round 27), printed only.
"""
from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import parallelizer
from benchmarks._memory_workers import (measure_peak_rank, measure_pipeline_peak_rank, measure_pipeline_rank,
                                        measure_rank)
from parallelizer import zoo
from parallelizer.pipeline_memory import pipeline_rank_memory
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import launch

_LLAMA = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              seq_len=64, labels=True, returns="loss")  # RESULTS.md Round 22 (r22e) / Round 23 (r23e): rotary, GQA
MODELS = {  # name: (builder, kwargs[, the kinds it runs; default all])
    "gpt2": (zoo.gpt2, dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, batch=8, seq_len=64, labels=True)),
    "mlp": (zoo.mlp, dict(in_features=32, dim=64, hidden=256, depth=2, batch=256)),
    "llama": (zoo.llama, dict(_LLAMA, batch=8), ("tp", "fsdp x tp")),
}
KINDS = {  # name: (mesh, axis roles[, other plan options])
    2: {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"}),
        "ddp + zero1": ({"dp": 2}, {}, {"zero1": "dp"})},
    4: {"ddp": ({"dp": 4}, {"dp": "ddp"}), "fsdp": ({"dp": 4}, {"dp": "fsdp"}), "tp": ({"tp": 4}, {"tp": "tp"}),
        "ddp x tp": ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}),
        "fsdp x tp": ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}),
        "ddp + zero1": ({"dp": 4}, {}, {"zero1": "dp"}),
        "ddp x tp + zero1": ({"dp": 2, "tp": 2}, {"tp": "tp"}, {"zero1": "dp"})},
}
PIPELINE_MODELS = {  # name: (builder, kwargs without the batch, the kinds it runs)
    "gpt2 (4 layers)": (zoo.gpt2, dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, seq_len=64, labels=True),
                        ("pp=2 x dp=2 1f1b", "pp=2 x tp=2 1f1b", "pp=4 1f1b", "pp=4 gpipe")),
    "llama (4 layers)": (zoo.llama, dict(_LLAMA, num_hidden_layers=4), ("pp=2 x tp=2 1f1b",)),
}
PIPELINE_MICROBATCH, PIPELINE_MICROBATCHES = 2, 4
PIPELINE_KINDS = {  # name: (mesh, axis roles, schedule)
    "pp=2 x dp=2 1f1b": ({"pp": 2, "dp": 2}, {"dp": "ddp"}, "1f1b"),
    "pp=2 x tp=2 1f1b": ({"pp": 2, "tp": 2}, {"tp": "tp"}, "1f1b"),
    "pp=4 1f1b": ({"pp": 4}, {}, "1f1b"),
    "pp=4 gpipe": ({"pp": 4}, {}, "gpipe"),
}
CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")
TARGET = 0.10


def measure() -> list[dict]:
    """One row per (model, world size, kind): predicted and measured bytes by category (largest rank)."""
    rows = []
    for world_size, kinds in KINDS.items():
        cases, meta = [], []
        for model, (fn, kwargs, *only) in MODELS.items():
            traced = parallelizer.trace(*fn(**kwargs))
            for kind, (mesh, roles, *options) in kinds.items():
                if only and kind not in only[0]:
                    continue
                with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
                    plan = parallelizer.plan(traced, mesh, axis_roles=roles, precision="fp32",  # as it runs on CPU
                                             **(options[0] if options else {}))
                cases.append((fn, kwargs, spec_from_plan(plan)))
                meta.append((model, kind, plan))
        per_rank = launch.spawn(measure_rank, world_size, cases, timeout_s=600)
        for i, (model, kind, plan) in enumerate(meta):
            measured = max((ranks[i] for ranks in per_rank), key=lambda r: sum(r.values()))
            predicted = {k: int(plan.cost.memory_bytes.get(k, 0)) for k in CATEGORIES}
            rows.append({"model": model, "devices": world_size, "kind": kind, "predicted": predicted,
                         "measured": measured, "worst": _error(predicted, measured)})
    return rows


def measure_pipeline() -> list[dict]:
    """One row per pipeline kind on 4 ranks: predicted (`pipeline_rank_memory`) and measured bytes by category
    of the rank holding the most; "worst": the largest |error| of the total over all ranks."""
    cases, meta = [], []
    for model, (fn, kwargs, kinds) in PIPELINE_MODELS.items():
        traced = parallelizer.trace(*fn(batch=PIPELINE_MICROBATCH, **kwargs))  # ONE microbatch (pipeline plans)
        global_kwargs = dict(kwargs, batch=PIPELINE_MICROBATCH * PIPELINE_MICROBATCHES)
        for kind in kinds:
            mesh, roles, schedule = PIPELINE_KINDS[kind]
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(traced, mesh, axis_roles=roles, precision="fp32", schedule=schedule,
                                         microbatches=PIPELINE_MICROBATCHES)
            cases.append((fn, global_kwargs, spec_from_plan(plan), plan.pipeline.to_dict()))
            meta.append((model, kind, plan, pipeline_rank_memory(plan, traced)))
    per_rank = launch.spawn(measure_pipeline_rank, 4, cases, timeout_s=900)
    rows = []
    for i, (model, kind, plan, predicted) in enumerate(meta):
        width = plan.mesh.world_size
        pairs = [({k: predicted[g // width][k] for k in CATEGORIES}, ranks[i]) for g, ranks in enumerate(per_rank)]
        pred, meas = max(pairs, key=lambda pm: sum(pm[1].values()))
        worst = max((_error(p, m) for p, m in pairs), key=abs)
        rows.append({"model": model, "devices": 4, "kind": kind, "predicted": pred, "measured": meas,
                     "worst": worst})
    return rows


PEAK_MODELS = {  # name: (builder, kwargs, kinds): weights small against activations, and large (wide, few layers)
    "gpt2": (zoo.gpt2, MODELS["gpt2"][1], ("ddp", "fsdp", "tp")),
    "gpt2 wide": (zoo.gpt2, dict(n_layer=2, n_embd=256, n_head=4, vocab_size=256, batch=2, seq_len=16, labels=True),
                  ("ddp", "fsdp", "tp")),
    "llama": (zoo.llama, dict(_LLAMA, batch=8), ("fsdp", "tp")),
    "llama wide": (zoo.llama, dict(_LLAMA, hidden_size=256, intermediate_size=704, batch=2, seq_len=16), ("ddp", "tp")),
}


PEAK_MORE = (  # (model, kind, world size, mesh, axis roles, plan options): 2x2 meshes, bf16, recomputation (round 27)
    ("gpt2", "ddp x tp 2x2", 4, {"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}, {}),
    ("gpt2", "fsdp x tp 2x2", 4, {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, {}),
    ("llama", "fsdp x tp 2x2", 4, {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, {}),
    ("gpt2", "ddp x tp 2x2, bf16", 4, {"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}, {"precision": "bf16"}),
    ("gpt2", "ddp, bf16", 2, {"dp": 2}, {"dp": "ddp"}, {"precision": "bf16"}),
    ("gpt2", "fsdp, recompute full", 2, {"dp": 2}, {"dp": "fsdp"}, {"recompute": "full"}),
    ("gpt2", "tp, bf16 + recompute full", 2, {"tp": 2}, {"tp": "tp"}, {"precision": "bf16", "recompute": "full"}),
)
PEAK_PIPELINES = (  # (model of PIPELINE_MODELS, kind of PIPELINE_KINDS): priced by `pipeline_rank_memory`
    ("gpt2 (4 layers)", "pp=2 x dp=2 1f1b"), ("gpt2 (4 layers)", "pp=4 1f1b"), ("gpt2 (4 layers)", "pp=4 gpipe"),
)


def measure_peak(world_sizes: tuple[int, ...] = (2, 4)) -> list[dict]:
    """One row per plan of `PEAK_MODELS` (2 ranks) and `PEAK_MORE`: the plan's priced peak (`memory_bytes["peak"]`,
    `planner.peak.step_peak`) and its sum of kinds ("total") against the largest rank's TRUE peak of a training step
    (`_memory_workers.measure_peak_rank`: every storage alive as the step's ops run, the second of two steps)."""
    plans = [(m, k, 2, *KINDS[2][k][:2], dict(*KINDS[2][k][2:])) for m, (_, _, kinds) in PEAK_MODELS.items()
             for k in kinds] + list(PEAK_MORE)
    rows = []
    for world in world_sizes:
        cases, meta = [], []
        for model, kind, size, mesh, roles, options in plans:
            if size != world:
                continue
            fn, kwargs = (PEAK_MODELS.get(model) or MODELS[model])[:2]
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(parallelizer.trace(*fn(**kwargs)), mesh, axis_roles=roles,
                                         **{"precision": "fp32", **options})
            cases.append((fn, kwargs, spec_from_plan(plan)))
            meta.append((model, kind, plan))
        per_rank = launch.spawn(measure_peak_rank, world, cases, timeout_s=900) if cases else []
        for i, (model, kind, plan) in enumerate(meta):
            measured = max(ranks[i]["peak"] for ranks in per_rank)
            rows.append({"model": model, "kind": kind, "peak": plan.cost.memory_bytes["peak"],
                         "total": plan.cost.memory_bytes["total"], "measured": measured,
                         "at": next(r[i]["at"] for r in per_rank if r[i]["peak"] == measured)})
    return rows


def measure_pipeline_peak() -> list[dict]:
    """One row per `PEAK_PIPELINES` plan on 4 ranks: the pipeline rank's priced memory (`pipeline_rank_memory`'s
    total: training state + in-flight microbatches x the stage's saved activations + returned values) against its
    TRUE peak (`_memory_workers.measure_pipeline_peak_rank`); the row is the rank whose peak is the largest."""
    cases, meta = [], []
    for model, kind in PEAK_PIPELINES:
        fn, kwargs, _ = PIPELINE_MODELS[model]
        traced = parallelizer.trace(*fn(batch=PIPELINE_MICROBATCH, **kwargs))
        mesh, roles, schedule = PIPELINE_KINDS[kind]
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(traced, mesh, axis_roles=roles, precision="fp32", schedule=schedule,
                                     microbatches=PIPELINE_MICROBATCHES)
        cases.append((fn, dict(kwargs, batch=PIPELINE_MICROBATCH * PIPELINE_MICROBATCHES), spec_from_plan(plan),
                      plan.pipeline.to_dict()))
        meta.append((model, kind, plan, pipeline_rank_memory(plan, traced)))
    per_rank = launch.spawn(measure_pipeline_peak_rank, 4, cases, timeout_s=900)
    rows = []
    for i, (model, kind, plan, priced) in enumerate(meta):
        g, ranks = max(enumerate(per_rank), key=lambda gr: gr[1][i]["peak"])
        rows.append({"model": model, "kind": kind, "peak": priced[g // plan.mesh.world_size]["total"],
                     "total": priced[g // plan.mesh.world_size]["total"], "measured": ranks[i]["peak"],
                     "at": f"rank {g}: {ranks[i]['at']}"})
    return rows


def peak_table(rows: list[dict]) -> list[str]:
    """The markdown lines of `measure_peak`'s rows."""
    lines = ["| model | kind | priced peak | sum of kinds (total) | measured peak | peak error | sum error "
             "| measured at |",
             "|---|---|---|---|---|---|---|---|"]
    within = 0
    for r in rows:
        err, old = (r["peak"] - r["measured"]) / r["measured"], (r["total"] - r["measured"]) / r["measured"]
        within += abs(err) <= TARGET
        lines.append(f"| {r['model']} | {r['kind']} | {_kb(r['peak'])} | {_kb(r['total'])} | {_kb(r['measured'])} | "
                     f"{err:+.1%} | {old:+.1%} | {r['at']} |")
    return lines + ["", f"{within} of {len(rows)} plans' priced peak within {TARGET:.0%} of the measured peak."]


def _error(predicted: dict, measured: dict) -> float:
    tp, tm = sum(predicted[c] for c in CATEGORIES), sum(measured[c] for c in CATEGORIES)
    return (tp - tm) / tm if tm else 0.0


def _kb(n: int) -> str:
    return f"{n / 1024:.1f}"


def run() -> str:
    peaks = measure_peak() + measure_pipeline_peak()
    rows = measure() + measure_pipeline()
    lines = ["## Memory per rank: predicted vs measured (`benchmarks/bench_memory.py`)", "",
             "KiB on the largest rank; predicted = the plan's `cost.memory_bytes`, measured = local parameters, "
             "buffers, grads after backward, AdamW state, tensors saved for backward (saved-tensor hooks). "
             f"Target: total within {TARGET:.0%}.", "",
             "| model | devices | kind | " + " | ".join(f"{c} pred / meas" for c in CATEGORIES)
             + " | total pred / meas | error | worst rank |", "|" + "---|" * (6 + len(CATEGORIES))]
    within = 0
    for r in rows:
        p, m = r["predicted"], r["measured"]
        tp, tm = sum(p.values()), sum(m.values())
        err = (tp - tm) / tm if tm else 0.0
        within += abs(r["worst"]) <= TARGET
        lines.append(f"| {r['model']} | {r['devices']} | {r['kind']} | "
                     + " | ".join(f"{_kb(p[c])} / {_kb(m[c])}" for c in CATEGORIES)
                     + f" | {_kb(tp)} / {_kb(tm)} | {err:+.1%} | {r['worst']:+.1%} |")
    lines += ["", f"{within} of {len(rows)} plans within {TARGET:.0%} (worst rank).", "",
              "Pipeline rows (4 layers, 4 microbatches of 2): predicted by "
              "`parallelizer.pipeline_memory.pipeline_rank_memory` (stage training state + in-flight microbatches x "
              "the stage's saved activations), measured as the PEAK of saved tensors alive during one pipeline step; "
              "the row is the rank holding the most, `worst rank` the largest error over all ranks. Saved "
              "activations count each storage once, charged to its first saver (`cost_model.memory."
              "saved_tensor_owners`); not counted: the stage outputs and receive buffers torch's pipelining keeps, "
              "transient collective buffers.", "",
              "**Peak of a step** (2 and 4 ranks, KiB on the largest rank): the plan's priced peak "
              "(`memory_bytes[\"peak\"]`, a timeline of the forward and backward: `parallelizer/planner/peak.py`) and "
              "its sum of kinds against the TRUE peak of the second of two training steps (forward, backward, AdamW, "
              "`zero_grad`; the output held through the step): every storage alive as the step's ops run "
              "(`_memory_workers.LiveStorages`, DDP's default 25 MiB buckets). Pipeline rows (4 ranks, 4 microbatches "
              "of 2): priced by `pipeline_rank_memory` (its total, a sum of kinds: both columns), measured the same "
              "way over a pipeline step on the rank whose peak is the largest.", ""] + peak_table(peaks)
    return "\n".join(lines)


def write_results(text: str, path: Path = Path(__file__).with_name("RESULTS.md")) -> None:
    """Replace this benchmark's section of RESULTS.md (its heading through its `_bench_memory:` line) by `text`,
    or append it.

    Raises:
        ValueError: the section's heading is there without its closing `_bench_memory:` line (remedy: fix the
            file by hand).
    """
    old = path.read_text() if path.exists() else ""
    stamp = f"_bench_memory: measured {time.strftime('%Y-%m-%d', time.gmtime())} on this machine_"
    section = f"{text}\n\n{stamp}"
    head = text.splitlines()[0]
    if head not in old:
        path.write_text(old.rstrip() + "\n\n" + section + "\n")
        return
    start = old.index(head)
    end = old.find("_bench_memory:", start)
    if end < 0:
        raise ValueError(f"{path}: section {head!r} has no closing '_bench_memory:' line; fix the file by hand")
    end = old.index("\n", end) if "\n" in old[end:] else len(old)
    path.write_text(old[:start] + section + old[end:])


if __name__ == "__main__":
    import sys
    if "--peak" in sys.argv:  # the step-peak table alone (printed; RESULTS.md left as it is)
        print("\n".join(peak_table(measure_peak() + measure_pipeline_peak())))
    else:
        table = run()
        print(table)
        write_results(table)
