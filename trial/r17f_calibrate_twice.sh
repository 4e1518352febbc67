#!/bin/bash
# Round 17 (r17f), issue 13: two back-to-back `parallelizer calibrate --quick` runs on an IDLE machine (nothing
# else running; load < 1 before the start), then the drift between them (the issue asks < 10% median).
# Run from the repository root: bash trial/r17f_calibrate_twice.sh [OUTDIR]   (~4-5 minutes)
set -e
OUT=${1:-/tmp/r17f_cal}
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
P=${PYTHON:-.venv/bin/python}
uptime
timeout 600 $P -m parallelizer calibrate --quick -o "$OUT/calA.json" 2>&1 | grep -v "calibrate:" | tail -4
uptime
timeout 600 $P -m parallelizer calibrate --quick -o "$OUT/calB.json" --compare "$OUT/calA.json" 2>&1 \
  | grep -v "calibrate:" | tail -5
uptime
# the quantities issue 13 named: x4 AdamW contention, pipeline actions (torch's and our BitPipe runner's),
# x2 send_recv 64 KiB, x4 all_to_all
$P - "$OUT/calA.json" "$OUT/calB.json" <<'PY'
import statistics, sys
from cost_model.calibrate import compare_profiles, load_profile
d = compare_profiles(load_profile(sys.argv[1]), load_profile(sys.argv[2]))
print(f"median |difference| {statistics.median(abs(v) for v in d.values()):.1%} over {len(d)} quantities; "
      f"within 10%: {sum(abs(v) <= 0.1 for v in d.values())}")
import json  # round 19 (r19b): each run's own prediction of the drift (median split-half difference / sqrt(2))
for path in sys.argv[1:3]:
    drift = json.load(open(path))["measurements"].get("split_half_median")
    print(f"  {path}: predicted median |difference| "
          + ("n/a (profile before round 19)" if drift is None else f"{drift / 2 ** 0.5:.1%} (split-half {drift:.1%})"))
    m = json.load(open(path))["measurements"]
    passes = m.get("pass_half_median")  # round 20 (r20b): between passes; round 21 (r21c): every quantity's passes
    if passes is not None:
        what = "every quantity" if "device_pass_half" in m else "collectives"
        print(f"    {what} between passes: predicted {passes / 2 ** 0.5:.1%} (pass-half {passes:.1%})")
    if "pass_reference_flops_per_s" in m:  # round 21: each pass's reference matmul, steal, the passes left out
        print("    pass reference matmul " + " / ".join(f"{r / 1e9:.1f}" for r in m["pass_reference_flops_per_s"])
              + " GFLOP/s, steal " + " / ".join("n/a" if s is None else f"{s:.1%}" for s in m["pass_steal"])
              + f", passes dropped {m['passes_dropped'] or 'none'}, {m['seconds']:.0f} s")
for k, v in sorted(d.items(), key=lambda kv: -abs(kv[1])):
    if any(w in k for w in ("optimizer", "pipeline action", "send_recv 64 ", "all_to_all")) or abs(v) > 0.3:
        print(f"  {k}: {v:+.1%}")
PY
# round 23 (r23c): what the pair's differences do to the bench's 42 plans' predicted steps (plans made on A; ~3 min)
timeout 1200 $P -m benchmarks.bench_steptime --compare-profiles "$OUT/calA.json" "$OUT/calB.json" | sed -n '3p;/^| group/,$p'
