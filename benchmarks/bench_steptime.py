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

Reported: per plan predicted and measured ms (median, interquartile range of its steps, and the median CPU
seconds rank 0's process spent per step) and the error; Spearman rank correlation over all plans and within
each world size; the median |error|; per (model, world size) group the planner's pick (the plan of least
predicted time, what a search over meshes and roles with this model picks) and whether it is within 5% of the
measured fastest of the group, judged on the paired ratio (`paired_ratio`: pick / fastest step of the same
round, median over rounds, with its interquartile range as the measurement's spread; "clear" when the whole
range lies on one side of 1.05, else "within noise"), identical plans merged (`_distinct`).

Identical plans are timed once (`same_program`): the planner's free plan on dp=2 and on tp=2 is one program
under two axis names; the row of the second label says "timed once, = <first>" and carries the first's steps.

Run: `python -m benchmarks.bench_steptime [--profile P.json] [--quick] [--json out.json] [--predict-only]`, or
`--compare-profiles A.json B.json` (no ranks started): the plans made on profile A, each estimated on A and on B,
the relative differences of their predicted steps (`cost_model.profile_compare.compare_step_predictions`) and each
group's pick under either profile: what two calibrations' differences mean for a user's plans (round 23, r23c).
Without `--profile` it calibrates first (quick message sizes, ~2 min). `--predict-only`: only the predictions
and each group's pick, no ranks started. Timing (`_steptime_workers.time_rank`): 2 untimed warm-up rounds
(`--quick`: 1), then 15 timed rounds (`--quick`: 5); each round steps every distinct plan once, in an order
of its own (seeded by the round's number; a model's plans together, after one untimed step of the first of
them, since the first step after another model's runs slower), so that drift and bursts of load hit every plan
alike and no plan always runs first or after the same neighbour (~5 min on 2 idle cores, more under load).
Round 17 (r17e) added the warm-up rounds (the first 2-3 rounds of a run were 1.3-3x slower,
/tmp/r17/bench1.json), the per-round orders and the untimed step at a model switch, the paired verdict and the
CPU seconds, after one run measured the same program 262.9 and 197.9 ms (gpt2, 2 ranks): the label timed first
for its model in the fixed order of before.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
from cost_model.profile_compare import StepPredictionDiff, compare_step_predictions
from parallelizer.core.mesh import MeshSpec
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
WARMUP_ROUNDS, ROUNDS, QUICK_WARMUP_ROUNDS, QUICK_ROUNDS = 2, 15, 1, 5


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


def same_program(a: tuple, b: tuple) -> bool:
    """Whether two worker cases run the same program: same builder and arguments, and the same sharding spec
    up to the mesh's axis names (layouts are positional; a spec naming axes elsewhere, e.g. `hierarchy` or
    `zero1`, then differs), or the same pipeline plan JSON."""
    if a[:3] != b[:3]:
        return False
    if a[0] != "spec":
        return a[3] == b[3]
    sa, sb = a[3], b[3]
    if sa.mesh.shape != sb.mesh.shape:
        return False
    canon = MeshSpec(tuple(f"axis{i}" for i in range(len(sa.mesh.shape))), sa.mesh.shape)
    return dataclasses.replace(sa, mesh=canon) == dataclasses.replace(sb, mesh=canon)


def predictions(profile_path: str, worlds=(2, 4), models=tuple(MODELS)) -> list[dict]:
    """One row per plan with its predicted parts and no measurement (`--predict-only`); `timed_as`: the kind of
    the first row of its world running the same program (`same_program`), else its own; `_first`: that row's
    index among the rows of its world, `_case`: the worker case."""
    rows = []
    for world in worlds:
        cases: list[tuple] = []
        kinds: list[str] = []
        for model, kind, traced, plan, case in _plans(world, profile_path, models):
            est = estimate_step_time(traced, plan, cluster=profile_path)
            first = next((i for i, c in enumerate(cases) if same_program(c, case)), len(cases))
            cases.append(case)
            kinds.append(kind)
            rows.append({"model": model, "world": world, "kind": kind, "predicted_ms": est.total_s * 1e3,
                         "parts_ms": {"fwd": est.forward_compute_s * 1e3, "bwd": est.backward_compute_s * 1e3,
                                      "blocking_comm": est.blocking_comm_s * 1e3,
                                      "grad_sync": est.grad_sync_s * 1e3,
                                      "grad_sync_exposed": est.grad_sync_exposed_s * 1e3,
                                      "recompute": est.recompute_s * 1e3, "pipeline": est.pipeline_s * 1e3,
                                      "optimizer": est.optimizer_s * 1e3},
                         "timed_as": kinds[first], "_first": first, "_case": case})
    return rows


def compare_on_plans(path_a: str, path_b: str, worlds=(2, 4), models=tuple(MODELS)
                     ) -> tuple[StepPredictionDiff, list[tuple[str, str, str]]]:
    """The bench's plans made on profile `path_a`, each estimated on `path_a` and on `path_b` (module docstring):
    (`compare_step_predictions` of their step seconds keyed "model xN kind", per (model, world size) group
    (group, pick under A, pick under B): the plan of least predicted step among the group's distinct programs).
    A pipeline plan's step on B reuses the simulated schedule its plan recorded on A (`steptime._pipeline_step`:
    `PipelineEstimate.step_s`); only its optimizer step is priced on B, so its difference understates."""
    a, b, picks = {}, {}, []
    for world in worlds:
        groups: dict[str, list[tuple[str, float, float]]] = {}
        cases: list[tuple] = []
        for model, kind, traced, plan, case in _plans(world, path_a, models):
            key = f"{model} x{world} {kind}"
            a[key] = estimate_step_time(traced, plan, cluster=path_a).total_s
            b[key] = estimate_step_time(traced, plan, cluster=path_b).total_s
            if not any(same_program(c, case) for c in cases):  # identical programs count once in the pick
                groups.setdefault(f"{model} x{world}", []).append((kind, a[key], b[key]))
            cases.append(case)
        for group, rows in groups.items():
            picks.append((group, min(rows, key=lambda r: r[1])[0], min(rows, key=lambda r: r[2])[0]))
    return compare_step_predictions(a, b), picks


def compare_report(diff: StepPredictionDiff, picks: list[tuple[str, str, str]], path_a: str, path_b: str) -> str:
    """`--compare-profiles`' text: the summary line, each plan's difference (largest first), the picks."""
    lines = [f"## Plans' predicted step time, profile `{path_b}` vs `{path_a}` (plans made on the first)", "",
             diff.line(), "", "| plan | difference |", "|---|---|"]
    lines += [f"| {k} | {v:+.1%} |" for k, v in sorted(diff.differences.items(), key=lambda kv: -abs(kv[1]))]
    lines += ["", "| group | pick on A | pick on B |", "|---|---|---|"]
    lines += [f"| {g} | {pa} | {pb}{'' if pa == pb else ' (changed)'} |" for g, pa, pb in picks]
    return "\n".join(lines)


def measure(profile_path: str, quick: bool = False, worlds=(2, 4), models=tuple(MODELS)) -> list[dict]:
    """One row per plan: model, world size, kind, predicted parts (ms), measured step ms (median), its steps
    (wall and rank 0's process CPU, ms, in round order) and spread; identical plans timed once (module docstring)."""
    warmup, rounds = (QUICK_WARMUP_ROUNDS, QUICK_ROUNDS) if quick else (WARMUP_ROUNDS, ROUNDS)
    rows = []
    for world in worlds:
        world_rows = predictions(profile_path, (world,), models)
        timed = sorted({r["_first"] for r in world_rows})
        cases = [world_rows[i]["_case"] for i in timed]
        print(f"timing {len(cases)} distinct plans of {len(world_rows)} on {world} ranks, {warmup} + {rounds} "
              f"rounds (load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
        per_rank = launch.spawn(time_rank, world, cases, warmup, rounds, 1, timeout_s=1500)
        wall, cpu = per_rank[0]["wall"], per_rank[0]["cpu"]
        for r in world_rows:
            j = timed.index(r.pop("_first"))
            samples = [t * 1e3 for t in wall[j]]
            q1, q3 = np.percentile(samples, [25, 75])
            r.pop("_case")
            r.update({"measured_ms": statistics.median(samples), "samples_ms": samples,
                      "cpu_samples_ms": [t * 1e3 for t in cpu[j]], "cpu_ms": statistics.median(cpu[j]) * 1e3,
                      "measured_iqr_ms": (float(q1), float(q3)),
                      "measured_min_max_ms": (min(samples), max(samples))})
            rows.append(r)
    return rows


def paired_ratio(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(median, 25th, 75th percentile) over rounds of a[k] / b[k]: two plans' steps of the same round k, so that
    drift of the machine's load between rounds cancels (module docstring)."""
    ratios = [x / y for x, y in zip(a, b)]
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    return float(med), float(q1), float(q3)


def verdict(group: list[dict]) -> dict:
    """The planner's pick (least predicted) of a group of distinct plans against its measured fastest (least
    median step): paired ratio, its interquartile range, whether the pick is within `PICK_TOLERANCE`, and
    whether the range lies wholly on one side of it ("clear") or straddles it ("within noise"). Rows without
    per-round samples of equal count (JSON of older runs, where identical plans' steps were pooled) compare
    medians, and `clear` is None."""
    pick = min(group, key=lambda r: r["predicted_ms"])
    fastest = min(group, key=lambda r: r["measured_ms"])
    paired = ("samples_ms" in pick and "samples_ms" in fastest
              and len(pick["samples_ms"]) == len(fastest["samples_ms"]))
    if paired:
        med, q1, q3 = paired_ratio(pick["samples_ms"], fastest["samples_ms"])
    else:
        med = q1 = q3 = pick["measured_ms"] / fastest["measured_ms"]
    limit = 1 + PICK_TOLERANCE
    ok = med <= limit
    clear = None if not paired else (q3 <= limit if ok else q1 > limit)
    return {"pick": pick, "fastest": fastest, "ratio": med, "ratio_iqr": (q1, q3), "ok": ok, "clear": clear}


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
             "recompute / AdamW; pipeline: simulated schedule + AdamW) | measured ms (median; IQR; min-max) | "
             "CPU ms | error |",
             "|---|---|---|---|---|---|---|"]
    for r, e in zip(rows, errors):
        lo, hi = r["measured_min_max_ms"]
        q1, q3 = r.get("measured_iqr_ms", (lo, hi))
        once = f" (timed once, = {r['timed_as']})" if r.get("timed_as", r["kind"]) != r["kind"] else ""
        cpu = f"{r['cpu_ms']:.1f}" if "cpu_ms" in r else "-"
        lines.append(f"| {r['model']} | {r['world']} | {r['kind']}{once} | {r['predicted_ms']:.1f} ({_parts(r)}) | "
                     f"{r['measured_ms']:.1f} ({q1:.0f}-{q3:.0f}; {lo:.0f}-{hi:.0f}) | {cpu} | {e:+.0%} |")
    pred, meas = [r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows]
    per_world = {w: spearman([r["predicted_ms"] for r in rows if r["world"] == w],
                             [r["measured_ms"] for r in rows if r["world"] == w]) for w in sorted({r["world"] for r in rows})}
    lines += ["", f"Plans: {len(rows)}. Spearman {spearman(pred, meas):.3f} (target >= 0.9; "
              + ", ".join(f"{w} ranks {s:.3f}" for w, s in per_world.items())
              + f"). Median |error| {statistics.median(abs(e) for e in errors):.0%} (target <= 25%).", "",
              "| model | ranks | planner's pick (least predicted) | its measured ms | measured fastest | ms | "
              "pick / fastest, paired per round (median; IQR) | pick within 5% |",
              "|---|---|---|---|---|---|---|---|"]
    hits = groups = 0
    for key in sorted({(r["model"], r["world"]) for r in rows}, key=lambda k: (k[1], k[0])):
        v = verdict(_distinct([r for r in rows if (r["model"], r["world"]) == key]))
        hits, groups = hits + v["ok"], groups + 1
        q1, q3 = v["ratio_iqr"]
        lines.append(f"| {key[0]} | {key[1]} | {v['pick']['kind']} | {v['pick']['measured_ms']:.1f} | "
                     f"{v['fastest']['kind']} | {v['fastest']['measured_ms']:.1f} | {v['ratio']:.3f} "
                     f"({q1:.3f}-{q3:.3f}) | {'yes' if v['ok'] else 'no'}"
                     f"{_spread_word(v)} |")
    lines += ["", f"Pick within {PICK_TOLERANCE:.0%} of the measured fastest in {hits} of {groups} groups."]
    return "\n".join(lines)


def _spread_word(v: dict) -> str:
    if v["pick"] is v["fastest"]:
        return ""
    return {None: " (medians: no per-round pairs)", True: " (clear)", False: " (within noise)"}[v["clear"]]


def _parts(r: dict) -> str:
    p = r["parts_ms"]
    return (f"pipeline {p['pipeline']:.1f} + {p['optimizer']:.1f}" if p.get("pipeline") else
            f"{p['fwd']:.1f} / {p['bwd']:.1f} / {p['blocking_comm']:.1f} / {p['grad_sync_exposed']:.1f} of "
            f"{p['grad_sync']:.1f} / {p.get('recompute', 0.0):.1f} / {p['optimizer']:.1f}")


def predict_report(rows: list[dict], header: str) -> str:
    """`--predict-only`: every plan's prediction and each group's pick (least predicted), with the runner-up
    and its margin."""
    lines = [header, "", "| model | ranks | plan | predicted ms (parts as in the timed report) |", "|---|---|---|---|"]
    for r in rows:
        once = f" (= {r['timed_as']})" if r.get("timed_as", r["kind"]) != r["kind"] else ""
        lines.append(f"| {r['model']} | {r['world']} | {r['kind']}{once} | {r['predicted_ms']:.1f} ({_parts(r)}) |")
    lines += ["", "| model | ranks | pick | predicted ms | runner-up | predicted ms | margin |", "|---|---|---|---|---|---|---|"]
    for key in sorted({(r["model"], r["world"]) for r in rows}, key=lambda k: (k[1], k[0])):
        group = sorted(_distinct([r for r in rows if (r["model"], r["world"]) == key]), key=lambda r: r["predicted_ms"])
        pick, second = group[0], group[1] if len(group) > 1 else group[0]
        lines.append(f"| {key[0]} | {key[1]} | {pick['kind']} | {pick['predicted_ms']:.1f} | {second['kind']} | "
                     f"{second['predicted_ms']:.1f} | {second['predicted_ms'] / pick['predicted_ms'] - 1:+.1%} |")
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
    """The group's distinct plans, merged with kinds joined by "=": rows timed as one program (`timed_as`,
    `same_program`) keep their one set of steps; rows of older runs without it are matched by the same
    predicted breakdown (the planner's free plan on dp=2 and on tp=2), measured = the median of all their steps
    (of their medians for rows without samples)."""
    merged: dict[tuple, dict] = {}
    for r in group:
        same = "timed_as" in r
        key = (("timed", r["timed_as"]) if same
               else tuple(round(v, 9) for v in r["parts_ms"].values()))
        if key not in merged:
            merged[key] = dict(r)
            continue
        m = merged[key]
        m["kind"] += f" = {r['kind']}"
        if same:
            continue
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
    ap.add_argument("--compare-profiles", nargs=2, metavar=("A.json", "B.json"),
                    help="the plans made on A, their predicted steps on A vs on B (starts no ranks)")
    ap.add_argument("--predict-only", action="store_true",
                    help="only the predictions and each group's pick (needs --profile; starts no ranks)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f), "## Step time: predicted vs measured (`benchmarks/bench_steptime.py`)"))
        return
    if args.compare_profiles:
        path_a, path_b = args.compare_profiles
        diff, picks = compare_on_plans(path_a, path_b, tuple(args.worlds), tuple(args.models))
        print(compare_report(diff, picks, path_a, path_b))
        return
    profile_path = args.profile
    if args.predict_only:
        if profile_path is None:
            ap.error("--predict-only needs --profile (a calibration profile of the machine to predict for)")
        rows = predictions(profile_path, tuple(args.worlds), tuple(args.models))
        for r in rows:
            r.pop("_case"), r.pop("_first")
        print(predict_report(rows, f"## Step time predicted (`benchmarks/bench_steptime.py --predict-only`), "
                                   f"profile `{profile_path}`"))
        return
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
