"""Benchmark: trace a Llama-2-7B-shaped model built on the `meta` device (batch 1 x seq 4096).

Targets (issue: tracer): wall time < 60 s and peak RSS < 4 GB on the 2-core CI machine. Runs the trace in a
fresh subprocess so that peak RSS (resource.getrusage ru_maxrss, KiB on Linux) is the trace's own.
Run: `python -m benchmarks.bench_trace`.
"""
from __future__ import annotations

import json
import subprocess
import sys

_CHILD = r"""
import json, resource, time
import parallelizer
from parallelizer import zoo
t0 = time.perf_counter()
model, inputs = zoo.llama(batch=1, seq_len=4096, device="meta", **zoo.llama2_7b_config())
t1 = time.perf_counter()
traced = parallelizer.trace(model, inputs)
t2 = time.perf_counter()
print(json.dumps({"build_s": t1 - t0, "trace_s": t2 - t1, "nodes": len(traced.nodes),
                  "params": traced.num_parameters, "blocks": [b.name + " x" + str(b.count) for b in traced.blocks],
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def measure() -> dict:
    """Trace the 7B shape in a subprocess; returns build_s, trace_s, nodes, params, blocks, peak_rss_bytes."""
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> str:
    """Markdown report of the measurement against the targets."""
    m = measure()
    ok_t = "yes" if m["trace_s"] < 60 else "NO"
    ok_m = "yes" if m["peak_rss_bytes"] < 4 * 2**30 else "NO"
    return "\n".join([
        "## Tracing a Llama-2-7B shape on `meta` (batch 1 x seq 4096)",
        "",
        "| measure | value | target | met |",
        "|---|---|---|---|",
        f"| parameters | {m['params']:,} | 6.74e9 | |",
        f"| graph nodes | {m['nodes']} | | |",
        f"| repeated blocks | {', '.join(m['blocks'])} | 32 layers | |",
        f"| trace wall time | {m['trace_s']:.1f} s | < 60 s | {ok_t} |",
        f"| peak RSS (process) | {m['peak_rss_bytes'] / 2**30:.2f} GiB | < 4 GiB | {ok_m} |",
        f"| model build on meta | {m['build_s']:.1f} s | | |",
    ])


if __name__ == "__main__":
    print(run())
