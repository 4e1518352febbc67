"""Convergence under compression (issue 15, first "Done when"): `python -m benchmarks.bench_convergence`
(also run by `make bench`; about 15-20 minutes on this 2-core machine).

A character-level (byte) GPT-2 (4 layers, hidden 64, 4 heads, context 64; transformers GPT2Config, random
init, seed 0) trained with AdamW (lr 3e-3) on random windows of the Python standard library's source
(its top-level *.py files, the first 2 MB: a real corpus every machine with Python has offline), 4 gloo
ranks, pp=2 x dp=2 (gpipe, 2 microbatches, global batch 16), the same batches in every arm:
  * none: no compression (the reference);
  * powersgd: data-parallel gradients by PowerSGD rank 4 (`--dp-compression powersgd`: the `compression` plan
    option of the data-parallel compression work; skipped, and said so, where the plan has no such option);
  * int8: activations and activation gradients between the two stages as int8 with one scale per 64 values;
  * lowrank: the same projected onto a fixed rank-16 subspace of the hidden 64 (`core.boundary_codec`).
"Final loss" = the mean training loss of the last 10% of the steps (every arm sees the same batches).
Writes benchmarks/convergence.json (per-step losses and settings) and benchmarks/convergence.png; `run()`
returns the markdown for RESULTS.md. `--plot-only` redraws the PNG from the saved JSON. `--probe WARMUP --steps N`
prints the PowerSGD arm's per-step gradient error against the exact average (why a warm-up helps; RESULTS.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JSON_PATH, PNG_PATH = HERE / "convergence.json", HERE / "convergence.png"
CONFIG = dict(model=dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, n_positions=64), batch=16, seq_len=64,
              microbatches=2, schedule="gpipe", steps=400, lr=3e-3, seed=0, corpus_bytes=2_000_000)
ARMS = {  # name: plan options (None: needs the data-parallel compression option, resolved in `arms`)
    "none": {},
    "powersgd": None,
    "int8": {"boundary_compression": "int8"},
    "lowrank": {"boundary_compression": "lowrank", "boundary_rank": 16},
}
TAIL = 0.1  # the final loss averages the last 10% of the steps
BOUND = 0.05  # issue 15: each compressed arm's final loss within 5% of the uncompressed one
WARMUP_FRACTION = 0.1  # PowerSGD's exact warm-up: torch's PowerSGDState docs advise "10% of total training steps"


def arms(dp_compression: str = "powersgd", rank: int = 4, steps: int = CONFIG["steps"]) -> dict[str, dict | str]:
    """The arms to run: plan options, or for the PowerSGD arm a string saying why it is skipped. PowerSGD's
    warm-up (exact steps before compression starts) is `WARMUP_FRACTION` of `steps`."""
    from parallelizer.config import PlanConfig
    names = {f.name for f in dataclasses.fields(PlanConfig)}
    out = {}
    for name, options in ARMS.items():
        if options is not None:
            out[name] = options
        elif "compression" in names:
            out[name] = {"compression": dp_compression, **({"powersgd_rank": rank} if "powersgd_rank" in names else {}),
                         **({"powersgd_warmup": int(steps * WARMUP_FRACTION)} if "powersgd_warmup" in names else {})}
        else:
            out[name] = ("skipped: PlanConfig has no 'compression' option on this branch (data-parallel "
                         "gradient compression not merged yet)")
    return out


def train_all(steps: int, dp_compression: str, only: tuple[str, ...] = ()) -> dict:
    """Run every arm (4 ranks each, in turn) and return the JSON record."""
    from benchmarks._convergence_workers import train_rank
    from parallelizer.runtime import spawn
    cfg = dict(CONFIG, steps=steps)
    record = {"config": cfg, "tail": TAIL, "arms": {}}
    for name, options in arms(dp_compression, steps=steps).items():
        if only and name not in only:
            continue
        if isinstance(options, str):
            record["arms"][name] = {"skipped": options}
            continue
        start = time.perf_counter()
        reports = spawn(train_rank, 4, cfg, options, timeout_s=3600)
        record["arms"][name] = {"options": options, "losses": reports[0]["losses"],
                                "boundary": reports[0]["boundary"], "dp_compression": reports[0]["dp_compression"],
                                "train_s": max(r["seconds"] for r in reports),
                                "wall_s": time.perf_counter() - start}
        print(f"{name}: final loss {final_loss(record['arms'][name]['losses']):.4f} "
              f"({record['arms'][name]['wall_s']:.0f} s)", flush=True)
    return record


def probe(warmup: int, steps: int, at: tuple[int, ...]) -> str:
    """The PowerSGD arm for `steps` steps with `warmup` exact steps, probed at steps `at` (0-based; ranks 0 and
    2, i.e. one rank of each stage, `_convergence_workers._probe_powersgd`): one line per stage and step, the
    all-reduced gradient's relative error against the exact average and the worst matrices."""
    from benchmarks._convergence_workers import train_rank
    from parallelizer.runtime import spawn
    options = {**arms(steps=steps)["powersgd"], "powersgd_warmup": warmup}
    reports = spawn(train_rank, 4, dict(CONFIG, steps=steps), options, tuple(at), timeout_s=3600)
    lines = [f"PowerSGD rank 4, first {warmup} of {steps} steps exact: ||PowerSGD - exact|| / ||exact|| of the "
             "all-reduced average gradient"]
    for stage, rank in enumerate((0, 2)):
        for step, row in sorted(reports[rank]["probe"].items()):
            worst = sorted(row["per_param"].items(), key=lambda kv: -kv[1])[:3]
            lines.append(f"stage {stage} step {step}: {row['total']:.3f} (exact gradient norm {row['grad_norm']:.3f}); "
                         "worst " + ", ".join(f"{k.split('transformer.')[-1]} {v:.2f}" for k, v in worst))
    return "\n".join(lines)


def final_loss(losses: list[float]) -> float:
    tail = max(1, int(len(losses) * TAIL))
    return sum(losses[-tail:]) / tail


def plot(record: dict, path: Path = PNG_PATH) -> None:
    """Training loss per step of every arm (a 10-step moving average), final losses in the legend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, arm in _ordered(record):
        if "losses" not in arm:
            continue
        y = arm["losses"]
        smooth = [sum(y[max(0, i - 9):i + 1]) / len(y[max(0, i - 9):i + 1]) for i in range(len(y))]
        style = dict(color="black", linestyle="--", zorder=5) if name == "none" else {}
        ax.plot(range(1, len(y) + 1), smooth, label=f"{name} (final {final_loss(y):.3f})", **style)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte, 10-step mean)")
    ax.set_title("char-level GPT-2 on Python stdlib source, pp=2 x dp=2 (4 gloo ranks)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(record: dict) -> str:
    """The RESULTS.md section: per arm its final loss, its ratio to the uncompressed one, and the codec."""
    cfg = record["config"]
    base = final_loss(record["arms"]["none"]["losses"]) if "losses" in record["arms"].get("none", {}) else None
    rows = []
    for name, arm in _ordered(record):
        if "skipped" in arm:
            rows.append(f"| {name} | - | - | - | {arm['skipped']} |")
            continue
        final = final_loss(arm["losses"])
        b = arm["boundary"]
        codec = (", ".join(f"{x['codec']} ({'8-bit' if x['bits'] else 'rank ' + str(x['rank'])}, wire "
                           f"{x['wire_ratio']:.3f})" for x in b["boundaries"]) if b else "-")
        ratio = f"{final / base:.4f}" if base else "-"
        ok = ("yes" if abs(final / base - 1) <= BOUND else "NO") if base else "-"
        rows.append(f"| {name} | {final:.4f} | {ratio} | {ok} | boundary: {codec}; "
                    f"dp: {_dp_text(arm['dp_compression'])}; {arm['train_s']:.0f} s |")
    return "\n".join([
        "## Convergence under compression (issue 15): char-level GPT-2, pp=2 x dp=2 on 4 gloo ranks",
        "",
        f"{cfg['steps']} AdamW steps (lr {cfg['lr']}), global batch {cfg['batch']} x {cfg['seq_len']} bytes of the "
        f"Python standard library's source, {cfg['microbatches']} microbatches, model {cfg['model']}. Final loss = "
        f"mean training loss of the last {int(TAIL * 100)}% of the steps; bound: within {int(BOUND * 100)}% of "
        "`none`. Plot: benchmarks/convergence.png; data: benchmarks/convergence.json.",
        "",
        "| arm | final loss | / none | within 5% | compression, train time |",
        "|---|---:|---:|---|---|", *rows])


def _ordered(record: dict) -> list[tuple[str, dict]]:
    """The saved arms in `ARMS` order (the JSON sorts its keys)."""
    return [(n, record["arms"][n]) for n in ARMS if n in record["arms"]]


def _dp_text(record) -> str:
    """The data-parallel compression record of a plan (a dict from that work, or None) in a few words."""
    if not record or record.get("chosen", "none") == "none":
        return "-"
    if not record.get("rank"):
        return str(record["chosen"])
    warmup = record.get("warmup_steps", 0)
    return f"{record['chosen']} rank {record['rank']}" + (f", first {warmup} steps exact" if warmup else "")


def run() -> str:
    """`make bench`: train every arm, save JSON and PNG, return the markdown."""
    record = train_all(CONFIG["steps"], "powersgd")
    JSON_PATH.write_text(json.dumps(record, indent=1, sort_keys=True))
    plot(record)
    return markdown(record)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=CONFIG["steps"])
    ap.add_argument("--dp-compression", default="powersgd", help="the PowerSGD arm's `compression` plan option")
    ap.add_argument("--only", nargs="*", default=(), help="run only these arms (merged into the saved JSON)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG and print the table from the JSON")
    ap.add_argument("--probe", type=int, metavar="WARMUP", default=None,
                    help="instead: run the PowerSGD arm for --steps steps with WARMUP exact steps and print its "
                         "gradient error at --probe-at (nothing saved)")
    ap.add_argument("--probe-at", type=int, nargs="*", default=(0, 1, 2, 5, 10, 20, 40, 59))
    args = ap.parse_args()
    if args.probe is not None:
        print(probe(args.probe, args.steps, tuple(args.probe_at)))
        return
    if args.plot_only:
        record = json.loads(JSON_PATH.read_text())
    else:
        record = train_all(args.steps, args.dp_compression, tuple(args.only))
        if args.only and JSON_PATH.exists():  # keep the other arms' saved results
            saved = json.loads(JSON_PATH.read_text())
            record = dict(saved, arms={**saved["arms"], **record["arms"]})
        JSON_PATH.write_text(json.dumps(record, indent=1, sort_keys=True))
    plot(record)
    print(markdown(record))


if __name__ == "__main__":
    main()
