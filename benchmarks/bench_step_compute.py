"""Benchmark: how well the compute model prices a real training step's compute on one CPU thread, robust to the
load of other jobs (diagnostic for `benchmarks/bench_steptime.py`).

For each model of `bench_steptime.MODELS`, one process with one thread alternates, `ROUNDS` rounds: the
calibration's matmul kernel (`cost_model.device_rounds._measure_matmul_flops_per_s`, squares 512-2048), its
memory kernel (`_measure_memory_bytes_per_s`, STREAM add), its launch overhead and one forward + backward of the model at a dp=2
rank's batch (half the global batch). The step is then priced (`estimate_step_time` of the ddp plan on dp=2:
its forward + backward compute, which is one rank's half batch) on a device whose FLOP/s, bytes/s and launch are
the medians measured in those same rounds, so a burst of outside load moves both sides alike. Reported:
measured and priced milliseconds and the error (priced / measured - 1). A negative error is compute the
cost model does not see (e.g. matmuls of a training step's shapes and layouts slower than the calibrated
squares, per-op autograd and allocation work).

Run: `python -m benchmarks.bench_step_compute` (~1-2 min).
"""
from __future__ import annotations

import contextlib
import io
import statistics
import time

import torch

import parallelizer
from benchmarks._steptime_workers import build
from benchmarks.bench_steptime import MODELS
from cost_model.device_rounds import (DEFAULT_MATMUL_SIZES, _measure_launch_overhead_s, _measure_matmul_flops_per_s,
                                     _measure_memory_bytes_per_s, calibration_threads)
from cost_model.hardware import DeviceSpec
from cost_model.topology import Cluster, Link
from parallelizer.planner.steptime import estimate_step_time
from parallelizer.runtime.rehearsal import _loss

ROUNDS = 5
_LINK = Link("unused", 1e-4, 1e9)  # the compute parts of the estimate do not read the link


def measure_model(name: str, rounds: int = ROUNDS) -> dict:
    """{"model", "measured_ms", "priced_ms", "error", "matmul_gflops", "memory_gbs"} of one model (module
    docstring)."""
    builder, kwargs = MODELS[name]
    traced = parallelizer.trace(*build(builder, kwargs))
    model, inputs, kw = build(builder, dict(kwargs, batch=kwargs["batch"] // 2))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        _loss(model(*inputs, **kw)).backward()

    step()  # warm-up
    flops, bandwidth, launch, seconds = [], [], [], []
    for _ in range(rounds):
        flops.append(_measure_matmul_flops_per_s(DEFAULT_MATMUL_SIZES))
        bandwidth.append(_measure_memory_bytes_per_s(1 << 24))
        launch.append(_measure_launch_overhead_s())
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    rate, bytes_per_s, launch_s, measured = (statistics.median(x) for x in (flops, bandwidth, launch, seconds))
    device = DeviceSpec("cpu", {torch.float32: rate}, 1 << 34, bytes_per_s, 1.0, 1.0, launch_s, kind="cpu")
    cluster = Cluster(device, 1, 2, _LINK, _LINK)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        plan = parallelizer.plan(traced, {"dp": 2}, cluster=cluster, axis_roles={"dp": "ddp"})
    est = estimate_step_time(traced, plan, cluster=cluster)
    priced = est.forward_compute_s + est.backward_compute_s
    return {"model": name, "measured_ms": measured * 1e3, "priced_ms": priced * 1e3, "error": priced / measured - 1,
            "matmul_gflops": rate / 1e9, "memory_gbs": bytes_per_s / 1e9}


def main() -> None:
    import os
    print(f"load average {os.getloadavg()[0]:.1f}\n\n| model | matmul GFLOP/s | add GB/s | forward + backward measured ms "
          "| priced ms | error |\n|---|---|---|---|---|---|")
    with calibration_threads():
        for name in MODELS:
            r = measure_model(name)
            print(f"| {name} | {r['matmul_gflops']:.1f} | {r['memory_gbs']:.1f} | {r['measured_ms']:.1f} | "
                  f"{r['priced_ms']:.1f} | {r['error']:+.0%} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
