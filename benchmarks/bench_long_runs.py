"""Long runs: does a plan's loss curve stay on the single-device curve? (`make longrun`, or
`python -m benchmarks.bench_long_runs [--steps 200] [--only NAME ...]`; about 1 s per step of a 4-rank run on
this 2-core machine, ~30 min for every run at 200 steps.)

Every run trains the same model on the same data from the same weights with one recipe (AdamW with a no-decay
mask, warm-up + cosine LR, clip_grad_norm_(1.0), gradient accumulation of 2, label smoothing:
`_long_run_workers`), three ways: on one device in float32 ("eager"), on one device in float64 (the
reference), and on gloo ranks under a plan in float32 (bf16 runs: autocast around the forward, against eager
under the same autocast). The judge, at every step t and for each quantity q (the step's loss, the global
gradient norm before clipping):

    |q_plan(t) - q_64(t)|  <=  K * max( max_{s <= t} |q_eager(s) - q_64(s)|,  FLOOR * |q_64(t)| )

K = 8: a plan is another float32 (bf16) computation of the same function, summing in another order, so its
rounding error against float64 is of the eager run's size; training amplifies both alike (the envelope is the
running maximum of eager's error because that error crosses zero at random steps). 8 is the factor the
rehearsal already allows a computation against float64 (`runtime.rehearsal.float64_excess`). A systematic
error (a term missing or doubled, an eps per shard, a scheduler stepped twice) grows away from the envelope and
is reported with the step where the ratio first exceeds 1. FLOOR = 1e-6 (8 float32 ulps of the loss) keeps
the bound from 0 at the first steps, where eager may equal float64 to the last bit. K is tight at 500 steps: on Llama tp=2
the plan reached 0.98 of the bound (8.7e-5 at step 174), and one device with its batch rows reversed (the same
mean, summed in another order) lies 7.7e-5 from float64 at the same step, 0.65 of the bound: eager's own error is
one sample of float32 rounding, so a ratio near 1 on a long run is first compared with such a reordered run. Parameters and buffers at
the end: per tensor, max |plan - f64| <= K * max(max |eager - f64|, FLOOR * max |f64|).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
JSON_PATH = HERE / "long_runs.json"
K, FLOOR = 8.0, 1e-6
DDP, FSDP, TP = {"axis_roles": {"dp": "ddp"}}, {"axis_roles": {"dp": "fsdp"}}, {"axis_roles": {"tp": "tp"}}
FSDP_TP = {"axis_roles": {"dp": "fsdp", "tp": "tp"}}
PIPE = {"axis_roles": {"dp": "ddp"}, "microbatches": 2}
# name: (model, world size, mesh, plan options, extra arguments of `rank_run`)
RUNS = {
    "gpt2 ddp": ("gpt2", 2, {"dp": 2}, DDP, {}),
    "gpt2 fsdp": ("gpt2", 2, {"dp": 2}, FSDP, {}),
    "gpt2 tp=2": ("gpt2", 2, {"tp": 2}, TP, {}),
    "gpt2 zero1 dp=2": ("gpt2", 2, {"dp": 2}, {"zero1": "dp"}, {"zero1": True}),
    "gpt2 fsdp x tp": ("gpt2", 4, {"dp": 2, "tp": 2}, FSDP_TP, {}),
    "gpt2 pp=2 x dp=2": ("gpt2", 4, {"pp": 2, "dp": 2}, PIPE, {}),
    "gpt2odd fsdp dp=4": ("gpt2odd", 4, {"dp": 4}, FSDP, {}),
    "gpt2odd ddp dp=3": ("gpt2odd", 3, {"dp": 3}, DDP, {}),
    "gpt2odd tp=2": ("gpt2odd", 2, {"tp": 2}, TP, {}),
    "cnn tp=2": ("cnn", 2, {"tp": 2}, TP, {}),
    "llama tp=2": ("llama", 2, {"tp": 2}, TP, {}),
    "llama fsdp x tp": ("llama", 4, {"dp": 2, "tp": 2}, FSDP_TP, {}),
    "llama pp=2 x dp=2": ("llama", 4, {"pp": 2, "dp": 2}, PIPE, {}),
    "vit fsdp": ("vit", 2, {"dp": 2}, FSDP, {}),
    "vit tp=2": ("vit", 2, {"tp": 2}, TP, {}),
    "cnn ddp": ("cnn", 2, {"dp": 2}, DDP, {}),
    "cnn fsdp": ("cnn", 2, {"dp": 2}, FSDP, {}),
    "moe ddp": ("moe", 2, {"dp": 2}, DDP, {}),
    "moe tp=2": ("moe", 2, {"tp": 2}, TP, {}),
    "moe fsdp x tp": ("moe", 4, {"dp": 2, "tp": 2}, FSDP_TP, {}),
    "gpt2 bf16 ddp": ("gpt2", 2, {"dp": 2}, DDP, {"bf16": True}),
    "gpt2 bf16 tp=2": ("gpt2", 2, {"tp": 2}, TP, {"bf16": True}),
    "gpt2 precision=bf16 tp=2": ("gpt2", 2, {"tp": 2}, {**TP, "precision": "bf16"}, {"bf16": True, "planned": True}),
    "gpt2 zero1 pp=2 x dp=2": ("gpt2", 4, {"pp": 2, "dp": 2}, {**PIPE, "zero1": "dp"}, {"zero1": True}),
    "gpt2 frozen wpe until 60 tp=2": ("gpt2", 2, {"tp": 2}, TP, {"frozen": True}),
    "gpt2 frozen wpe until 60 fsdp": ("gpt2", 2, {"dp": 2}, FSDP, {"frozen": True}),
    "gpt2drop ddp": ("gpt2drop", 2, {"dp": 2}, DDP, {}),
    "gpt2drop tp=2": ("gpt2drop", 2, {"tp": 2}, TP, {}),
    "gpt2drop fsdp x tp": ("gpt2drop", 4, {"dp": 2, "tp": 2}, FSDP_TP, {}),
    "gpt2drop pp=2 x dp=2": ("gpt2drop", 4, {"pp": 2, "dp": 2}, PIPE, {}),
    "llama bf16 fsdp x tp": ("llama", 4, {"dp": 2, "tp": 2}, FSDP_TP, {"bf16": True}),
}
# resumes: (model, save plan (world, mesh, options), load plans {name: (world, mesh, options)})
RESUME = ("gpt2", (2, {"dp": 2}, DDP), {"ddp -> tp=2": (2, {"tp": 2}, TP),
                                          "ddp -> pp=2 x dp=2": (4, {"pp": 2, "dp": 2}, PIPE)})


def reference(name: str, steps: int, bf16: bool, cache: dict, frozen: bool = False) -> tuple[dict, dict]:
    """(eager float32 or bf16-autocast run, float64 run) of `name`, computed once per process."""
    from benchmarks._long_run_workers import eager_run
    key64, key = (name, steps, "f64", frozen), (name, steps, bf16, frozen)
    if key64 not in cache:
        cache[key64] = eager_run(name, steps, torch.float64, frozen=frozen)
    if key not in cache:
        cache[key] = eager_run(name, steps, bf16=bf16, frozen=frozen)
    return cache[key], cache[key64]


def judge(curves: dict, eager: dict, ref: dict, offset: int = 0) -> dict:
    """Worst ratio per quantity (module docstring), the step where it first exceeds 1 (None: never), the
    worst |plan - f64| and |eager - f64| seen, and the final state's worst tensor."""
    out = {}
    for q in ("loss", "norm", "eval"):
        env, worst, first, diffs = 0.0, (0.0, None), None, (0.0, 0.0)
        for t in range(len(ref[q])):
            if ref[q][t] is None:
                continue
            env = max(env, abs(eager[q][t] - ref[q][t]))
            if t < offset or curves[q][t - offset] is None:
                continue
            got = curves[q][t - offset]
            bound = K * max(env, FLOOR * abs(ref[q][t]))
            ratio = abs(got - ref[q][t]) / bound
            diffs = (max(diffs[0], abs(got - ref[q][t])), env)
            if ratio > worst[0]:
                worst = (ratio, t)
            if ratio > 1 and first is None:
                first = t
        out[q] = {"worst_ratio": worst[0], "at_step": worst[1], "first_over": first, "plan_diff": diffs[0],
                  "eager_diff": diffs[1]}
    worst = (0.0, None, 0.0, 0.0)
    for k, ref_t in ref["state"].items():
        if k not in curves["state"]:
            continue
        d_plan = (curves["state"][k] - ref_t).abs().max().item()
        d_eager = (eager["state"][k] - ref_t).abs().max().item()
        ratio = d_plan / (K * max(d_eager, FLOOR * ref_t.abs().max().item(), 1e-30))
        if ratio > worst[0]:
            worst = (ratio, k, d_plan, d_eager)
    out["state"] = {"worst_ratio": worst[0], "tensor": worst[1], "plan_diff": worst[2], "eager_diff": worst[3],
                    "keys_equal": sorted(curves["state"]) == sorted(ref["state"])}
    out["clipped_steps"] = sum(n > 1.0 for n in ref["norm"][offset:])
    tail = max(1, len(curves["loss"]) // 5)
    out["tail"] = (sum(curves["loss"][-tail:]) / sum(eager["loss"][-tail:])) - 1  # last 20%: plan / eager - 1
    out["replicas"] = curves.get("replicas")
    return out


def run_one(name: str, steps: int, cache: dict) -> dict:
    from benchmarks._long_run_workers import rank_run
    from parallelizer.runtime import spawn
    model, world, mesh, options, extra = RUNS[name]
    eager, ref = reference(model, steps, extra.get("bf16", False), cache, extra.get("frozen", False))
    start = time.perf_counter()
    # a plan made with precision="bf16" runs its forward under autocast itself: no autocast around pm(...)
    reports = spawn(rank_run, world, model, mesh, options, steps, extra.get("bf16", False) and not extra.get("planned"),
                    extra.get("zero1", False), None, None, None, extra.get("frozen", False),
                    timeout_s=60 + 3.0 * steps * world)
    rec = {"curves": {q: reports[0][q] for q in ("loss", "norm", "lr", "eval", "replicas")}, "wall_s": time.perf_counter() - start,
           "train_s": max(r["seconds"] for r in reports)}
    rec["judge"] = judge(reports[0], eager, ref)
    return rec


def run_resume(steps: int, cache: dict, at: int | None = None) -> dict:
    """Save on the first plan at step `at` (half the run), load on each other plan, run to the end."""
    import tempfile
    from benchmarks._long_run_workers import rank_run
    from parallelizer.runtime import spawn
    model, (world, mesh, options), targets = RESUME
    at = steps // 2 if at is None else at
    eager, ref = reference(model, steps, False, cache)
    out = {}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = f"{tmp}/ckpt"
        spawn(rank_run, world, model, mesh, options, steps, False, False, (0, at), path,
              timeout_s=60 + 3.0 * steps * world)
        for name, (w, m, o) in targets.items():
            start = time.perf_counter()
            reports = spawn(rank_run, w, model, m, o, steps, False, False, (at, steps), None, path,
                            timeout_s=60 + 3.0 * steps * w)
            rec = {"curves": {q: reports[0][q] for q in ("loss", "norm", "lr", "eval", "replicas")}, "at": at,
                   "wall_s": time.perf_counter() - start}
            rec["judge"] = judge(reports[0], eager, ref, offset=at)
            out[f"resume {name} at {at}"] = rec
    return out


def table(record: dict) -> str:
    rows = ["| run | steps | loss: worst ratio (step) / first > 1 | grad norm: worst ratio (step) | eval loss: worst "
            "ratio (step) | loss |plan - f64| vs eager's | final state: worst ratio (tensor) | replicas: spread "
            "(tensors compared) | tail loss / eager - 1 | clipped steps | wall s |",
            "|---|---:|---|---|---|---|---|---|---|---:|---:|"]
    for name, rec in record["runs"].items():
        if "error" in rec:
            rows.append(f"| {name} | - | {rec['error'][:200]} | | | | | |")
            continue
        j = rec["judge"]
        rows.append(
            f"| {name} | {len(rec['curves']['loss'])} | {j['loss']['worst_ratio']:.3f} ({j['loss']['at_step']}) / "
            f"{j['loss']['first_over']} | {j['norm']['worst_ratio']:.3f} ({j['norm']['at_step']}) | "
            + (f"{j['eval']['worst_ratio']:.3f} ({j['eval']['at_step']}) | " if j.get("eval", {}).get("at_step")
               is not None else "- | ") +
            f"{j['loss']['plan_diff']:.2e} vs {j['loss']['eager_diff']:.2e} | {j['state']['worst_ratio']:.3f} "
            f"({j['state']['tensor']}) | " + (f"{j['replicas']['spread']:.1e} ({j['replicas']['compared']}"
                                              f"{'' if j['replicas']['rng_equal'] else ', generators differ'}) | "
                                              if j.get("replicas") else "- | ")
            + (f"{j['tail']:+.1e} | " if "tail" in j else "- | ") + f"{j['clipped_steps']} | {rec['wall_s']:.0f} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--only", nargs="*", default=None,
                        help="runs whose name contains one of these words (RUNS keys, 'resume'), e.g. --only gpt2 bf16")
    parser.add_argument("--json", default=str(JSON_PATH))
    args = parser.parse_args(argv)
    path = Path(args.json)
    record = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    record.update(K=K, FLOOR=FLOOR)
    cache: dict = {}
    names = [n for n in (*RUNS, "resume") if args.only is None or n in args.only or any(o in n for o in args.only)]
    for name in names:
        try:
            if name == "resume":
                record["runs"].update(run_resume(args.steps, cache))
            else:
                record["runs"][name] = run_one(name, args.steps, cache)
        except Exception as exc:  # noqa: BLE001 - a failed run is a row of the report, the others still run
            record["runs"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        path.write_text(json.dumps(record))
        print(table({"runs": {k: v for k, v in record["runs"].items() if k == name or k.startswith(name)}}
                    ).splitlines()[-1], flush=True)
    print(table(record))


if __name__ == "__main__":
    main()
