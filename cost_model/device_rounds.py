"""The device quantities of one process, measured in interleaved rounds (split from :mod:`cost_model.calibrate`,
round 21, which re-exports these names): matmul FLOP/s, memory bandwidth, launch overhead, the AdamW rate (fresh
processes, :func:`cost_model.measure.measure_optimizer`) and the reference step of
:mod:`cost_model.step_efficiency` (the calibrate module's docstring says what each is and why), and the per-pass
reference rate (:func:`reference_flops_per_s`) with which :mod:`cost_model.passes` tells a pass measured in another
machine state.
"""
from __future__ import annotations

import contextlib
import statistics
from typing import Callable, Iterator, Sequence

import torch

from cost_model.host_cost import HostPrograms, measure_host_slope_s
from cost_model.measure import measure_optimizer, median_time_s
from cost_model.rounds import pool_rounds
from cost_model.step_efficiency import reference_model, time_reference_s

__all__ = ["measure_device", "measure_device_rounds", "reference_flops_per_s", "time_callable_s", "calibration_threads",
           "DEFAULT_MATMUL_SIZES", "DEVICE_ROUNDS", "CALIBRATION_NUM_THREADS", "REFERENCE_MATMUL_N"]

DEFAULT_MATMUL_SIZES = (512, 1024, 2048)
DEVICE_ROUNDS = 5  # interleaved rounds of the device measurements (cost_model.calibrate's docstring)
CALIBRATION_NUM_THREADS = 1
REFERENCE_MATMUL_N = 512  # the per-pass reference: fp32 mm of 512 x 512 (0.27 GFLOP, ~3 ms at 85 GFLOP/s)


def time_callable_s(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs
    (:func:`cost_model.measure.median_time_s`)."""
    return median_time_s(fn, repeats, warmup)


@contextlib.contextmanager
def calibration_threads(num_threads: int = CALIBRATION_NUM_THREADS) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(num_threads)``, restoring the previous value after.

    Calibration measures one intra-op thread because each gloo rank runs one thread (and a single thread
    avoids OpenMP barrier stalls when other processes share the cores)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _measure_matmul_flops_per_s(sizes: Sequence[int]) -> float:
    rates = []
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        seconds = time_callable_s(lambda: torch.mm(a, b), repeats=3 if n >= 2048 else 7)
        rates.append(2 * n**3 / seconds)
    return statistics.median(rates)


def _measure_memory_bytes_per_s(numel: int) -> float:
    a, b, c = torch.randn(numel), torch.randn(numel), torch.empty(numel)
    seconds = time_callable_s(lambda: torch.add(a, b, out=c), repeats=10)
    return 3 * numel * a.element_size() / seconds


def _measure_launch_overhead_s() -> float:
    a, b = torch.ones(1), torch.ones(1)
    return time_callable_s(lambda: torch.add(a, b), repeats=2000, warmup=200)


def measure_device_rounds(matmul_sizes: Sequence[int] = DEFAULT_MATMUL_SIZES, memory_numel: int = 1 << 24,
                          rounds: int = DEVICE_ROUNDS, host: HostPrograms | None = None) -> dict[str, list[float]]:
    """The raw rounds of :func:`measure_device`: per quantity its ``rounds`` values in round order, after one
    warm-up round (first touch of the pages, lazy initialisation; not returned). Per round: matmul FLOP/s over
    ``matmul_sizes``, memory bytes/s of ``memory_numel`` fp32 elements, launch seconds, the reference step's seconds
    (the faster of two), and AdamW's ``optimizer_bytes_per_s`` and ``optimizer_tensor_s`` in one fresh process (which
    warms itself up, so it is not run in the warm-up round), and (round 22) the host seconds per node measured on
    ``host`` (:func:`cost_model.host_cost.measure_host_slope_s`: ``op_host_slope_s``, ``op_host_bwd_slope_s``; built
    here when None; not in the warm-up round: building warms them up). Call inside :func:`calibration_threads`.

    Raises:
        ValueError: ``rounds`` < 1.
    """
    if rounds < 1:
        raise ValueError(f"measure_device(rounds={rounds}): need >= 1 round")
    got: dict[str, list[float]] = {}
    reference = reference_model()
    host = host or HostPrograms.build()
    for r in range(rounds + 1):
        values = {"matmul_flops_per_s": _measure_matmul_flops_per_s(matmul_sizes),
                  "memory_bytes_per_s": _measure_memory_bytes_per_s(memory_numel),
                  "launch_overhead_s": _measure_launch_overhead_s(),
                  "reference_step_s": min(time_reference_s(*reference) for _ in range(2))}
        if r:
            values["optimizer_bytes_per_s"], values["optimizer_tensor_s"] = measure_optimizer()
            values["op_host_slope_s"], values["op_host_bwd_slope_s"] = measure_host_slope_s(host)
            for key, value in values.items():
                got.setdefault(key, []).append(value)
    return got


def measure_device(matmul_sizes: Sequence[int] = DEFAULT_MATMUL_SIZES, memory_numel: int = 1 << 24,
                   rounds: int = DEVICE_ROUNDS) -> dict[str, float]:
    """The device quantities of one process, each the median over ``rounds`` interleaved rounds
    (:func:`measure_device_rounds`): ``matmul_flops_per_s``, ``memory_bytes_per_s`` (FLOP/s, bytes/s),
    ``launch_overhead_s``, ``optimizer_bytes_per_s`` and ``optimizer_tensor_s``, ``reference_step_s`` (seconds);
    and per quantity ``<key>_split_half``, :func:`cost_model.rounds.split_half_difference` of its rounds (what two
    calibrations are predicted to differ by, times sqrt(2)). Call inside :func:`calibration_threads`.

    Raises:
        ValueError: ``rounds`` < 1.
    """
    pooled = pool_rounds([measure_device_rounds(matmul_sizes, memory_numel, rounds)])
    return {**pooled["median"], **{f"{key}_split_half": h for key, h in pooled["split_half"].items()}}


def reference_flops_per_s(n: int = REFERENCE_MATMUL_N, repeats: int = 7) -> float:
    """The per-pass reference (round 21): FLOP/s of one fp32 ``torch.mm`` of ``n`` x ``n`` matrices (2 n^3 FLOPs),
    the median of ``repeats`` timings after 2 warm-up calls (~30 ms at n = 512 here). Taken before every block of a
    calibration pass in the calibrating process (:mod:`cost_model.passes`): a pass whose median reference is off the
    others' ran in another machine state (steal, throttling, outside load). Call inside :func:`calibration_threads`."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n ** 3 / time_callable_s(lambda: torch.mm(a, b), repeats=repeats)
