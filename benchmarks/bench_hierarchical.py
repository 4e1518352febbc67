"""Benchmark: two-level (hierarchical) vs flat all-reduce on 4 gloo ranks of this machine, a simulated
2-node x 2-device cluster (ranks {0, 1} and {2, 3} are "nodes"; `parallelizer.rewriter.hierarchical`).

On one machine every "link" is the same loopback, so this cannot show the bandwidth benefit of two-level
all-reduce (it exists when the intra-node link is much faster than the inter-node one: NVLink vs
InfiniBand, `cost_model.communication`); it measures what the extra phases cost here, and checks that the
two-level result equals the flat one within fp32 rounding. Per size: median of `--repeats` timed calls after
one warm-up, each call preceded by a barrier.

Run: `python -m benchmarks.bench_hierarchical [--repeats 9]` (~30 s on 2 idle cores).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from parallelizer.rewriter import collectives, hierarchical
from parallelizer.runtime import create_groups, spawn

SIZES_BYTES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)
ALWAYS = hierarchical.hierarchy_arg(2, {"all_reduce": [[0, None]]})


def _worker(rank: int, world_size: int, repeats: int) -> dict:
    ranks = list(range(world_size))
    create_groups(hierarchical.sub_groups([ranks], 2))
    torch.set_num_threads(1)
    out = {}
    for nbytes in SIZES_BYTES:
        x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank))
        row = {}
        for name, rule in (("flat", None), ("two_level", ALWAYS)):
            collectives.all_reduce(x, ranks, rule)  # warm-up
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                y = collectives.all_reduce(x, ranks, rule)
                times.append(time.perf_counter() - t0)
            row[name] = statistics.median(times)
            row[name + "_value"] = y
        row["max_abs_diff"] = (row.pop("flat_value") - row.pop("two_level_value")).abs().max().item()
        out[nbytes] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    reports = spawn(_worker, 4, args.repeats, timeout_s=600)
    print("| message | flat ms | two-level ms | two-level / flat | max |diff| |")
    print("|---|---|---|---|---|")
    for nbytes in SIZES_BYTES:
        flat = max(r[nbytes]["flat"] for r in reports)  # the slowest rank bounds the collective
        two = max(r[nbytes]["two_level"] for r in reports)
        diff = max(r[nbytes]["max_abs_diff"] for r in reports)
        print(f"| {nbytes / 2**20:g} MiB | {flat * 1e3:.2f} | {two * 1e3:.2f} | {two / flat:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
