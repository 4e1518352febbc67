"""Per-process slowdown of k processes computing at once on the machine's cores (matmul, memory-bound add, an AdamW
step): :func:`measure_contention`, its clamp :func:`contention_factor` and bound :func:`contention_floor`. Split out of
:mod:`cost_model.measure` (round 23, when that module passed 700 lines); the method and its history are in that
module's docstring.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

from .measure import _ADAMW_NUMEL, _MATMUL_N, _cores, pin_allocator

__all__ = ["contention_floor", "contention_factor", "measure_contention"]


def _throughput(fn: Callable[[], object], work: float, seconds: float) -> float:
    """Work per wall-clock second of calling ``fn`` for ``seconds`` (time-slicing counts)."""
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls * work / (time.perf_counter() - start)


def _keep_busy(fn: Callable[[], object], done, target: int) -> None:
    """Count this process's window as done, then keep calling ``fn`` until ``target`` windows are done (all
    ``k`` processes of this window): so every process's counted window runs with all ``k`` competing.

    Before (round 17), a process that finished its window went to the barrier and left the cores to the rest,
    whose last calls then ran with fewer than ``k`` competing: with AdamW calls of ~90 ms at k = 4 (3-4 per
    0.3 s window) the tails were a large share of each window, and the x4 AdamW factor read 1.41, 4.00, 1.46,
    3.77 and 4.00 in five calibrations of 2026-12-03 (below 2 is impossible for 4 processes on 2 cores)."""
    with done.get_lock():
        done.value += 1
    while done.value < target:
        fn()


def _contention_worker(rank: int, nprocs: int, barrier, done, window_s: float, rounds: int, queue) -> None:
    """Spawned worker: ``rounds`` x (process 0 alone for ``window_s``, then all processes at once, each kept busy
    until all have finished their window: :func:`_keep_busy`), for mm, add and an AdamW step; puts
    ``(rank, {"solo": [mm, add, adamw] rates, "all": [...]})`` (medians over rounds)."""
    try:
        torch.set_num_threads(1)
        pin_allocator()  # the AdamW kernel's temporaries reuse heap memory in every process (module docstring)
        a, b = torch.randn(_MATMUL_N, _MATMUL_N), torch.randn(_MATMUL_N, _MATMUL_N)
        x, y, z = torch.randn(1 << 22), torch.randn(1 << 22), torch.empty(1 << 22)
        param = torch.nn.Parameter(torch.randn(_ADAMW_NUMEL))
        param.grad = torch.randn_like(param)
        adamw = torch.optim.AdamW([param], lr=1e-3)
        kernels = ((lambda: torch.mm(a, b), 2 * _MATMUL_N ** 3), (lambda: torch.add(x, y, out=z), 3 * 4 * (1 << 22)),
                   (adamw.step, 28 * _ADAMW_NUMEL))
        for fn, _ in kernels:
            fn()
        solo: list[list[float]] = [[] for _ in kernels]
        together: list[list[float]] = [[] for _ in kernels]
        windows = 0
        for _ in range(rounds):
            for i, (fn, work) in enumerate(kernels):
                barrier.wait(timeout=120)
                if rank == 0:
                    solo[i].append(_throughput(fn, work, window_s))
                barrier.wait(timeout=120)
                together[i].append(_throughput(fn, work, window_s))
                windows += 1
                _keep_busy(fn, done, nprocs * windows)
        queue.put(("ok", (rank, {"solo": [statistics.median(r) for r in solo] if rank == 0 else None,
                                 "all": [statistics.median(r) for r in together]})))
    except Exception as exc:
        queue.put(("error", f"process {rank}: {type(exc).__name__}: {exc}"))


def contention_floor(k: int, cores: int | None) -> float:
    """The least per-process slowdown of ``k`` single-threaded processes computing at once on ``cores`` cores:
    ``max(1, k / cores)`` (time-sharing: with more processes than cores each gets ``cores / k`` of a core on
    average, whatever the kernel); 1 where the core count is unknown. A measured factor below it means the
    processes did not all run at once during the window (measured: AdamW x1.46 with 4 processes on 2 cores,
    /tmp/r16/calC.json, where another calibration of the same machine gave x4.00)."""
    return max(1.0, k / cores) if cores else 1.0


def measure_contention(counts: Sequence[int] = (2, 4), window_s: float = 0.3,
                       rounds: int = 9) -> dict[int, tuple[float, float, float]]:
    """Per-process slowdown ``(matmul, memory, optimizer)`` of ``k`` concurrent processes (the optimizer: torch's
    AdamW step on 1M elements), for each ``k`` in ``counts``: the
    rate of one process alone over the median rate of the ``k`` running at once (module docstring). The two are
    measured in alternating windows of ``window_s`` seconds (``rounds`` times, medians), so that load from
    outside (other jobs on a shared machine) weighs on both alike; ``k = 1`` gives (1.0, 1.0, 1.0). Each factor
    is clamped to [:func:`contention_floor`, k] (:func:`contention_factor`): k single-threaded processes on fewer cores
    cannot each run faster than cores / k of one alone (a ratio below 1, measured: 0.65 for AdamW at k = 2 in one
    of two idle calibrations, 0.98 in the other, is noise), nor all together do less than one alone. Every process
    keeps computing until all have finished the window (:func:`_keep_busy`). The AdamW kernel steps 4M elements (64 MiB of state, beyond the caches like a model's
    optimizer step; with 1M elements, which fit in the last-level cache alone but not four at once, the x4
    factor ranged 2.2-6.6 between calibrations, now 2.1-2.6).

    Raises:
        ValueError: a count < 1.
        RuntimeError: a process failed or did not report in time.
    """
    if any(not isinstance(k, int) or k < 1 for k in counts):
        raise ValueError(f"counts={tuple(counts)}: each must be an int >= 1")
    out: dict[int, tuple[float, float, float]] = {}
    ctx = torch.multiprocessing.get_context("spawn")
    for k in sorted(set(counts)):
        if k == 1:
            out[1] = (1.0, 1.0, 1.0)
            continue
        queue, barrier, done = ctx.Queue(), ctx.Barrier(k), ctx.Value("i", 0)
        procs = [ctx.Process(target=_contention_worker, args=(r, k, barrier, done, window_s, rounds, queue))
                 for r in range(k)]
        for proc in procs:
            proc.start()
        try:
            got = [queue.get(timeout=120 + 4 * rounds * window_s) for _ in range(k)]
        except Exception as exc:
            raise RuntimeError(f"contention measurement with {k} processes got no result in time") from exc
        finally:
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
        errors = [p for status, p in got if status != "ok"]
        if errors:
            raise RuntimeError(f"contention measurement with {k} processes failed: {errors[0]}")
        results = [p[1] for _, p in got]
        solo = next(r["solo"] for r in results if r["solo"] is not None)
        out[k] = tuple(contention_factor(solo[i], [r["all"][i] for r in results], k, _cores()) for i in range(3))
    return out


def contention_factor(solo_rate: float, rates: Sequence[float], k: int, cores: int) -> float:
    """The slowdown of each of ``k`` processes: ``solo_rate`` over the median of their ``rates``, clamped to
    ``[max(1, k / cores), k]``. Below ``k / cores`` is impossible (``k`` single-threaded processes on ``cores`` cores
    get at most ``cores / k`` of a core each), so such a reading is a measurement fault and is raised to the bound;
    above ``k`` (all together doing less than one alone) is noise. ``cores`` < 1 counts as 1."""
    return min(float(k), max(contention_floor(k, max(1, cores)), solo_rate / statistics.median(rates)))
