"""The main job (`make demo`): plan GPT-2 small for one 8-GPU H100 node, then rehearse a 4-GPU plan.

The default model is the GPT-2 small architecture (12 layers, hidden 768, 12 heads, vocab 50257, sequence
1024; Radford et al. 2019) from transformers with random weights on the `meta` device (nothing downloaded or
allocated), traced with a batch of 8 sequences.

1. Plan it for one DGX H100 node ("h100:1x8"), searching (pp, dp, tp) over its 8 GPUs (`parallelizer.plan`); print the
   summary and write `plan.json` (`parallelizer show plan.json` prints its tables).
2. This machine has no GPUs, so the rehearsal uses 4 local gloo ranks. A plan for 4 devices is needed for
   that: the demo plans the same model for 4 GPUs of the same node ("h100:1x4", same devices and NVLink),
   writes `plan-4gpu.json`, and rehearses THAT plan (not a slice of the 8-GPU one). The 4 CPU ranks run the
   plan's layouts on GPT-2 at reduced width (same 12 layers and node names, small hidden/heads/vocab/batch/
   sequence so that every sharded dim stays divisible; `parallelizer.presets.reduced`) and compare outputs,
   loss, gradients and parameters after 3 AdamW steps with the single-device model.

Takes about 2-3 minutes on a 2-core machine. `python -m parallelizer.demo [--out-dir DIR]`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import api, presets
from .cli import rehearse_plan
from .tracer import trace

GPT2_SMALL = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
BATCH, SEQ_LEN = 8, 1024


def _plan(traced, recipe, cluster: str, devices: int, out: Path):
    start = time.perf_counter()
    batch = {"global_batch": BATCH, "grad_accum": 1, "traced_batch": BATCH, "seq_len": SEQ_LEN}
    best = api.plan(traced, cluster=cluster, recipe=recipe, batch=batch)  # no mesh: the search over (pp, dp, tp)
    print(f"\n=== plan for {cluster} ({devices} GPUs), {time.perf_counter() - start:.1f} s ===")
    print(best.summary(max_nodes=10))
    best.save(out)
    print(f"wrote {out}")
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the demo (module docstring); exit code 0 when the rehearsal's numerics match."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=".", help="where plan.json and plan-4gpu.json go (default: here)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    recipe = presets.recipe("gpt2", GPT2_SMALL, batch=BATCH, seq_len=SEQ_LEN)
    traced = trace(*presets.build(recipe, "meta"))
    print(f"traced GPT-2 small (batch {BATCH} x seq {SEQ_LEN}, meta device) in {time.perf_counter() - start:.1f} s")
    print(repr(traced))
    _plan(traced, recipe, "h100:1x8", 8, out / "plan.json")
    plan4 = _plan(traced, recipe, "h100:1x4", 4, out / "plan-4gpu.json")
    print("\n=== rehearsal of plan-4gpu.json on 4 local gloo ranks ===")
    report = rehearse_plan(plan4, 4, width="auto")
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s")
    return 0 if report.matches() else 1


if __name__ == "__main__":
    sys.exit(main())
