"""Benchmark: predicted vs measured training-step time of many plans on gloo ranks of this machine.

Issue 13 item 6: with a calibration profile of this machine (`cost_model.calibrate`), the step time the cost
model predicts for a plan (`parallelizer.planner.steptime.estimate_step_time`: compute, blocking collectives,
exposed bucketed gradient sync, AdamW step) against the median measured step (`benchmarks._steptime_workers`:
AdamW training steps on CPU gloo ranks, one thread each, cases interleaved round by round).

Plans (each made by `parallelizer.plan` on the profile, fp32, the kind forced with `axis_roles`, or "free":
the planner's own choice on that mesh): for each model, on 2 ranks free (dp=2), ddp, fsdp, tp and free
(tp=2); on 4 ranks free (2x2), ddp, fsdp, tp, ddp x tp, fsdp x tp (`KINDS`). Models: zoo mlp, a 4-layer GPT-2
and a 2-layer Llama (sizes in `MODELS`). With recomputation (`RECOMPUTE_KINDS`, GPT-2 and Llama: every block
recomputed, `PlanConfig.recompute`): ddp + full and tp + selective on 2 ranks, ddp x tp + full on 4.
Pipelines (`PIPELINE_KINDS`, GPT-2, schedule 1F1B, microbatches = pp, the same global batch of 8, the loss
outside the model: `pm.step(ids, target=, loss_fn=)`): pp=2 on 2 ranks, pp=2 x dp=2 and pp=4 on 4 ranks,
priced by the pipeline search (`planner.search` + `planner.simulate`) and `estimate_step_time`. 42 plans.

Reported: per plan predicted and measured ms and the error; Spearman rank correlation over all plans and
within each world size; the median |error|; per (model, world size) group the planner's pick (the plan of
least predicted time, what a search over meshes and roles with this model picks) and whether its measured
time is within 5% of the measured fastest of the group, identical plans merged (`_distinct`).

Run: `python -m benchmarks.bench_steptime [--profile P.json] [--quick] [--json out.json]`. Without
`--profile` it calibrates first (quick message sizes, ~2 min). Each plan's step is timed once per round in
turn, over 9 rounds (`--quick`: 4), after one warm-up step: the median of 9 steps spread over the whole run, so
that a burst of load from other jobs hits every plan alike (~6 min on 2 idle cores, more under load).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import parallelizer
from benchmarks._steptime_workers import build, time_rank
from cost_model.calibrate import QUICK_MESSAGE_SIZES_BYTES, calibrate, summary
from parallelizer.planner.steptime import estimate_step_time
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import launch

MODELS = {
    "mlp": ("mlp", dict(in_features=256, dim=512, hidden=2048, depth=2, batch=128)),
    "gpt2": ("gpt2", dict(n_layer=4, n_embd=256, n_head=4, vocab_size=2048, batch=8, seq_len=128, labels=True)),
    "llama": ("llama", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=2048, batch=8, seq_len=128, labels=True)),
}
KINDS = {  # kind -> (mesh, axis_roles), every model
    2: {"free dp=2": ({"dp": 2}, {}), "ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}),
        "tp": ({"tp": 2}, {"tp": "tp"}), "free tp=2": ({"tp": 2}, {})},
    4: {"free 2x2": ({"dp": 2, "tp": 2}, {}), "ddp": ({"dp": 4}, {"dp": "ddp"}), "fsdp": ({"dp": 4}, {"dp": "fsdp"}),
        "tp": ({"tp": 4}, {"tp": "tp"}), "ddp x tp": ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}),
        "fsdp x tp": ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"})},
}
RECOMPUTE_MODELS = ("gpt2", "llama")
RECOMPUTE_KINDS = {  # kind -> (mesh, axis_roles, recompute mode of every block)
    2: {"ddp + full recompute": ({"dp": 2}, {"dp": "ddp"}, "full"),
        "tp + selective recompute": ({"tp": 2}, {"tp": "tp"}, "selective")},
    4: {"ddp x tp + full recompute": ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}, "full")},
}
PIPELINE_MODELS = ("gpt2",)
PIPELINE_SCHEDULE = "1f1b"
PIPELINE_KINDS = {2: {"pp=2 1f1b": {"pp": 2}}, 4: {"pp=2 x dp=2 1f1b": {"pp": 2, "dp": 2}, "pp=4 1f1b": {"pp": 4}}}
PICK_TOLERANCE = 0.05


def spearman(a, b) -> float:
    """Spearman rank correlation of two equal-length sequences (Pearson correlation of their ranks, ties given
    their mean rank; Spearman 1904)."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # ties: mean rank
            r[x == v] = r[x == v].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def measure(profile_path: str, quick: bool = False, worlds=(2, 4), models=tuple(MODELS)) -> list[dict]:
    """One row per plan: model, world size, kind, predicted parts (ms), measured step ms (median) and spread."""
    warmup, rounds, per_round = (1, 4, 1) if quick else (1, 9, 1)
    rows = []
    for world in worlds:
        cases, meta = [], []
        for model, kind, traced, plan, case in _plans(world, profile_path, models):
            cases.append(case)
            meta.append((model, kind, estimate_step_time(traced, plan, cluster=profile_path)))
        print(f"timing {len(cases)} plans on {world} ranks (load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
        per_rank = launch.spawn(time_rank, world, cases, warmup, rounds, per_round, timeout_s=1500)
        for i, (model, kind, est) in enumerate(meta):
            samples = per_rank[0][i]
            rows.append({"model": model, "world": world, "kind": kind, "predicted_ms": est.total_s * 1e3,
                         "parts_ms": {"fwd": est.forward_compute_s * 1e3, "bwd": est.backward_compute_s * 1e3,
                                      "blocking_comm": est.blocking_comm_s * 1e3,
                                      "grad_sync": est.grad_sync_s * 1e3,
                                      "grad_sync_exposed": est.grad_sync_exposed_s * 1e3,
                                      "recompute": est.recompute_s * 1e3, "pipeline": est.pipeline_s * 1e3,
                                      "optimizer": est.optimizer_s * 1e3},
                         "measured_ms": statistics.median(samples) * 1e3,
                         "samples_ms": [t * 1e3 for t in samples],
                         "measured_min_max_ms": (min(samples) * 1e3, max(samples) * 1e3)})
    return rows


def _plans(world: int, profile_path: str, models=tuple(MODELS)):
    """(model, kind, traced, plan, worker case) of every plan on `world` ranks (module docstring). A case is
    ("spec", builder, kwargs, ShardingSpec) or ("pipeline", builder, kwargs without labels, plan JSON)."""
    def solve(traced, mesh, **options):
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            return parallelizer.plan(traced, mesh, cluster=profile_path, **options)

    for model in models:
        builder, kwargs = MODELS[model]
        module, inputs, kw = build(builder, kwargs)
        traced = parallelizer.trace(module, inputs, kw)
        for kind, (mesh, roles) in KINDS[world].items():
            plan = solve(traced, mesh, axis_roles=roles)
            yield model, kind, traced, plan, ("spec", builder, kwargs, spec_from_plan(plan))
        for kind, (mesh, roles, mode) in (RECOMPUTE_KINDS[world].items() if model in RECOMPUTE_MODELS else ()):
            plan = solve(traced, mesh, axis_roles=roles, recompute=mode)
            yield model, kind, traced, plan, ("spec", builder, kwargs, spec_from_plan(plan))
        for kind, mesh in (PIPELINE_KINDS[world].items() if model in PIPELINE_MODELS else ()):
            plain = {k: v for k, v in kwargs.items() if k != "labels"}  # the loss is computed outside the model
            m = mesh["pp"]
            micro_traced = parallelizer.trace(*build(builder, {**plain, "batch": kwargs["batch"] // m}))
            plan = solve(micro_traced, mesh, schedule=PIPELINE_SCHEDULE, microbatches=m)
            yield model, kind, micro_traced, plan, ("pipeline", builder, plain, plan.to_json())


def report(rows: list[dict], header: str) -> str:
    """Markdown table and summary statistics (module docstring)."""
    errors = [r["predicted_ms"] / r["measured_ms"] - 1 for r in rows]
    lines = [header, "",
             "| model | ranks | plan | predicted ms (fwd / bwd / blocking comm / grad sync exposed of full / "
             "recompute / AdamW; pipeline: simulated schedule + AdamW) | measured ms (median; min-max) | error |",
             "|---|---|---|---|---|---|"]
    for r, e in zip(rows, errors):
        p = r["parts_ms"]
        lo, hi = r["measured_min_max_ms"]
        parts = (f"pipeline {p['pipeline']:.1f} + {p['optimizer']:.1f}" if p.get("pipeline") else
                 f"{p['fwd']:.1f} / {p['bwd']:.1f} / {p['blocking_comm']:.1f} / {p['grad_sync_exposed']:.1f} of "
                 f"{p['grad_sync']:.1f} / {p.get('recompute', 0.0):.1f} / {p['optimizer']:.1f}")
        lines.append(f"| {r['model']} | {r['world']} | {r['kind']} | {r['predicted_ms']:.1f} ({parts}) | "
                     f"{r['measured_ms']:.1f} ({lo:.0f}-{hi:.0f}) | {e:+.0%} |")
    pred, meas = [r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows]
    per_world = {w: spearman([r["predicted_ms"] for r in rows if r["world"] == w],
                             [r["measured_ms"] for r in rows if r["world"] == w]) for w in sorted({r["world"] for r in rows})}
    lines += ["", f"Plans: {len(rows)}. Spearman {spearman(pred, meas):.3f} (target >= 0.9; "
              + ", ".join(f"{w} ranks {s:.3f}" for w, s in per_world.items())
              + f"). Median |error| {statistics.median(abs(e) for e in errors):.0%} (target <= 25%).", "",
              "| model | ranks | planner's pick (least predicted) | its measured ms | measured fastest | ms | "
              "pick within 5% |", "|---|---|---|---|---|---|---|"]
    hits = groups = 0
    for key in sorted({(r["model"], r["world"]) for r in rows}, key=lambda k: (k[1], k[0])):
        group = _distinct([r for r in rows if (r["model"], r["world"]) == key])
        pick = min(group, key=lambda r: r["predicted_ms"])
        fastest = min(group, key=lambda r: r["measured_ms"])
        ok = pick["measured_ms"] <= fastest["measured_ms"] * (1 + PICK_TOLERANCE)
        hits, groups = hits + ok, groups + 1
        lines.append(f"| {key[0]} | {key[1]} | {pick['kind']} | {pick['measured_ms']:.1f} | {fastest['kind']} | "
                     f"{fastest['measured_ms']:.1f} | {'yes' if ok else 'no'} |")
    lines += ["", f"Pick within {PICK_TOLERANCE:.0%} of the measured fastest in {hits} of {groups} groups."]
    return "\n".join(lines)


def run(quick: bool = False) -> str:
    """`make bench` (`benchmarks.run_all`): calibrate with messages up to 64 MiB, then measure and report."""
    with tempfile.TemporaryDirectory() as tmp:
        profile_path = os.path.join(tmp, "cpu.profile.json")
        calibrate(out_path=profile_path, message_sizes_bytes=QUICK_MESSAGE_SIZES_BYTES, progress=False)
        load_before = os.getloadavg()[0]
        rows = measure(profile_path, quick=quick)
        return report(rows, _header(profile_path, load_before))


def _header(profile_path: str, load_before: float) -> str:
    from cost_model.calibrate import load_profile
    return ("## Step time: predicted vs measured (`benchmarks/bench_steptime.py`)\n\nProfile "
            f"`{profile_path}`: " + summary(load_profile(profile_path)).replace("\n", "; ")
            + f"\n\nMachine load (1-minute load average on {os.cpu_count()} cores): {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after.")


def _distinct(group: list[dict]) -> list[dict]:
    """The group's distinct plans: rows with the same predicted breakdown are one plan (the planner's free plan
    on dp=2 and on tp=2 is the same program under another axis name) and are merged: kinds joined with "=",
    measured = the median of all their steps (of their medians for rows without samples)."""
    merged: dict[tuple, dict] = {}
    for r in group:
        key = tuple(round(v, 9) for v in r["parts_ms"].values())
        if key not in merged:
            merged[key] = dict(r)
            continue
        m = merged[key]
        m["kind"] += f" = {r['kind']}"
        if "samples_ms" in m and "samples_ms" in r:
            m["samples_ms"] = m["samples_ms"] + r["samples_ms"]
            m["measured_ms"] = statistics.median(m["samples_ms"])
        else:
            m.setdefault("_medians", [m["measured_ms"]]).append(r["measured_ms"])
            m["measured_ms"] = statistics.median(m["_medians"])
    return list(merged.values())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="calibration profile JSON of this machine (default: calibrate first)")
    ap.add_argument("--quick", action="store_true", help="fewer timed steps per plan")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--models", nargs="+", choices=tuple(MODELS), default=tuple(MODELS), help="models to time")
    ap.add_argument("--worlds", nargs="+", type=int, choices=(2, 4), default=(2, 4), help="rank counts to time")
    ap.add_argument("--report", metavar="ROWS.json", help="only print the report of rows written by --json earlier")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f), "## Step time: predicted vs measured (`benchmarks/bench_steptime.py`)"))
        return
    profile_path = args.profile
    if profile_path is None:
        profile_path = tempfile.NamedTemporaryFile(suffix=".profile.json", delete=False).name
        calibrate(out_path=profile_path, message_sizes_bytes=QUICK_MESSAGE_SIZES_BYTES, progress=False)
    load_before = os.getloadavg()[0]
    rows = measure(profile_path, quick=args.quick, worlds=tuple(args.worlds), models=tuple(args.models))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    header = _header(profile_path, load_before)
    print(report(rows, header))
    print(f"\n_bench_steptime: {time.perf_counter() - started:.0f} s_")


if __name__ == "__main__":
    main()
