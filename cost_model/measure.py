"""Measurements of this machine for :mod:`cost_model.calibrate` (the fitting and the profile live there).

Every figure is a **median** of repeated samples after warm-up (not the fastest sample: on a shared machine
the fastest is the least disturbed run, which a training step does not get; the median is what a step meets).

* :func:`measure_collectives`: each collective kind over gloo with ``nprocs`` spawned processes (one intra-op
  thread each), per message size (nccl-tests byte convention, :mod:`cost_model.communication`), called the
  way a training step calls it (:func:`_collective_op`): the blocking kinds (all_reduce, all_gather,
  reduce_scatter, all_to_all) through torch's functional collectives (``torch.distributed._functional_collectives``:
  out of place, a fresh output tensor per call, waited on at once), which is what an emitted program runs
  (``parallelizer.rewriter.collectives``); send_recv through ``dist.send`` / ``dist.recv``, as pipeline stages
  do. (Until round 15 the blocking kinds were timed as in-place ``dist.all_reduce`` & co.: on 2 gloo ranks of
  this machine the functional call costs 0.1-0.3 ms more CPU per call below 1 MiB and ~1 ms more at 4 MiB,
  1.4-2.8x the in-place call's wall time back to back; benchmarks/RESULTS.md, round 15 r15c.) One sample =
  ``inner`` back-to-back collectives after a barrier, divided by ``inner``; fewer repeats for large messages
  (:func:`repeats_for`) and more calls per sample for small ones (:func:`inner_for`), and since round 23 enough calls
  that a sample lasts >= ``MIN_SAMPLE_S`` (20 ms) at the warm-up round's speed (:func:`sample_calls`); below 64 MiB the repeats go round-robin over all (kind, size) pairs, so that a burst
  of load from other jobs falls on many pairs a little rather than on one pair's every sample (64 MiB and
  larger: one pair at a time, their buffers being hundreds of MiB per rank). send_recv pairs ranks (0->1, 2->3, ...) concurrently, as pipeline stages do.
  The same workers measure ``comm_overlap``: a matmul loop alone (C), an all-reduce alone (A) and both at once
  (all-reduce started asynchronously, the loop run, then waited: B); ``overlap = (C + A - B) / min(C, A)``
  clamped to [0, 1] (1: the collective hid completely; 0: none of it did).
  And ``sync_s``, what a blocking collective that follows compute costs beyond the same collective back to
  back (:func:`_measure_sync`, :func:`sync_wait_s`): each rank runs a compute chunk (``_SYNC_MATMULS``
  matmuls) then a small all-reduce, ``_SYNC_INNER`` times per round, stamping each call's entry and exit on
  ``time.perf_counter`` (the system-wide monotonic clock: the calibration's processes share one machine);
  the stamps are gathered and per call ``max over ranks of exit - mean over ranks of entry`` is what the
  collective adds to a step's critical path: the straggler's lag (the last entry against the mean one: for
  2 ranks half the lag between them, which is what a barrier adds to ``max`` of the two ranks' compute over
  their mean) plus the collective once the last rank is in (a rank that waited asleep in gloo must be
  scheduled again). With more ranks than cores (4 ranks on 2 cores) the lag is left out, per call
  ``max exit - max entry``: the ranks then take turns on the cores, so a rank that waits frees its core for
  the stragglers and the last one enters when the cores have done everyone's work, the time the contention
  slowdown (``measure_contention``, throughput of k processes) already prices as the compute of every rank;
  counting the lag again charged each collective twice for it (round 16: 5.8 ms per collective on 4 ranks,
  idle; fsdp plans on 4 ranks predicted at 2.0-2.6x their measured step, 13 all-gathers' lag alone 227 of
  424 ms). What is left with more ranks than cores (4.7 ms on 4 ranks, round 22) is, by the same reasoning, the
  last rank to leave waiting for a core while the others run their next chunk: the planner charges it only to
  collectives of a sub-group, which run while other ranks compute (round 23,
  :func:`cost_model.communication.collective_wait_s`). ``sync_s = max(0, median over calls - A)``, A the same all-reduce back to back
  (interleaved round by round). The compute never enters the difference, so its noise does not either
  (until round 15 ``sync_s = median T - median C - median A`` of three loop timings: on this shared machine
  C's noise swamped it, 0-194 us between calibrations, and it came out 0 when it mattered most: in the same
  processes at load 12 a collective after compute took 1.2-9x its back-to-back time in a step,
  benchmarks/RESULTS.md, round 15 r15c). The planner adds it to every collective
  (``DeviceSpec.collective_sync_s``, ``planner.costs.Pricer.step_time_s``): a collective that directly
  follows another with no compute between them is charged it too (an upper estimate there: measured, those
  cost their back-to-back time).
* :func:`cost_model.contention.measure_contention`: FLOP/s of ``torch.mm``, bytes/s of ``torch.add`` and of an AdamW step per process when ``k``
  processes (one thread each) run them at once, for each ``k`` (throughput: work done over wall-clock
  seconds, so the time a process waits for a core counts), against one process alone in alternating windows; the slowdown ``rate(1) / rate(k)`` is how much
  slower each of ``k`` ranks computes when they share the machine's cores and memory bandwidth.
* :func:`measure_optimizer`: torch's default AdamW (single thread) on one large tensor and on many small ones:
  bytes/s of its traffic (28 B per fp32 element, :func:`cost_model.compute.optimizer_step_time_s`) and the
  fixed seconds per tensor, in fresh spawned processes (the median over them).
* :func:`pin_allocator`: every measuring process (gloo workers, contention workers, optimizer workers) first fixes
  glibc malloc's thresholds, so that a measured kernel's temporaries come from reused heap memory, as in a
  training rank, and not from fresh pages. Round 19 (r19b), measured with ``getrusage`` (counts and process CPU,
  valid under load): torch's AdamW on one 4M-element tensor allocates two 16 MiB temporaries per step; glibc's
  dynamic mmap / trim thresholds (malloc(3), mallopt(3): the mmap threshold rises to the size of a freed mmapped
  chunk, at most 32 MiB on 64-bit, and the trim threshold to twice that) left 8 of 12 fresh processes taking
  8,160 minor page faults per step (every step's temporaries on fresh pages; 10-27 ms of system CPU per step) and
  4 with none, so the AdamW rate of one process read 1.8-4.2 GB/s or 6.2-9.7 GB/s (process CPU) at random: the
  -61% / +92% between two calibrations of round 18. Pinned, 6 of 6 processes took 0 faults. A rank of the step-time
  bench's llama (2.5M parameters, after forward and backward) took 0-1 faults per AdamW step in 4 of 4 processes:
  the pinned state is the one ranks run in. Round 20 (r20b): with the trim threshold pinned at 64 MiB, 4 of 16 fresh
  pinned processes still trimmed their heap once in the middle of the timed steps (the set-up's free holes plus the
  step's temporaries crossed 64 MiB) and faulted 4,096-8,160 pages in the next step; the trim threshold is now 1 GiB
  (never reached) and the fault count is the median over steps (:func:`_optimizer_step_s`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import socket
import statistics
import time
from datetime import timedelta
from typing import Callable, Sequence

import torch

from .rounds import exit_spread_s, pass_half_difference, pool_passes, split_half_difference

__all__ = ["MEASURABLE_KINDS", "measure_collectives",
           "measure_optimizer", "measure_optimizer_processes", "pin_allocator", "repeats_for", "inner_for", "sample_calls", "MIN_SAMPLE_S", "COLLECTIVE_REPEATS", "LARGE_REPEATS", "median_time_s", "sync_wait_s", "exit_spread_s",
           "split_half_difference", "pass_half_difference", "pool_passes"]

MEASURABLE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
_OVERLAP_BYTES = 16 << 20
_MATMUL_N = 256
_ADAMW_NUMEL = 1 << 22  # 64 MiB of AdamW state: beyond the caches, as a model's optimizer step (1M elements fit in
# the last-level cache alone but not four at once: measured x4 slowdowns of 2.2-6.6 between calibrations)
_ROUND_ROBIN_MAX_BYTES = 64 << 20  # smaller messages are sampled round-robin, larger ones one pair at a time
_SMALL_BYTES, _SMALL_INNER = 1 << 20, 16  # messages below _SMALL_BYTES: >= _SMALL_INNER collectives per sample
_MEDIUM_BYTES, _MEDIUM_INNER = 4 << 20, 4  # messages from _SMALL_BYTES up to _MEDIUM_BYTES: >= _MEDIUM_INNER
_SYNC_MATMULS = 8  # compute chunk before each collective of `_measure_sync`: ~1-3 ms on one core (256^3 mm)
_SYNC_BYTES = 4 << 10  # a small all-reduce: its own time is mostly latency
_SYNC_INNER = 10  # iterations per timed loop of `_measure_sync`
# Round 19 (r19b): rounds per collective (round-robin) below 64 MiB, 9 until then. Two idle calibrations of round 18
# differed by a median 9.8-13.3% over their 52 collective quantities; the spread of a median falls as 1 / sqrt(rounds),
# so 21 rounds cut it by sqrt(21 / 9) = 1.53x. Cost, from the medians those idle profiles recorded: the collectives
# of `calibrate --quick` take 4.8 + 16 s (x2 + x4) with 9 / 3 rounds and 9.3 + 33 s with 21 / 5.
COLLECTIVE_REPEATS = 21
LARGE_REPEATS = 5  # rounds of messages of 64 MiB and more (3 until round 19)
# Round 23 (r23c): a collective's sample lasts at least this long (`sample_calls`: a few scheduler slices).
MIN_SAMPLE_S = 0.020
MAX_SAMPLE_CALLS = 256  # calls per sample at most (a 4 KiB send_recv of 0.26 ms needs 77 for 20 ms)
OVERLAP_ROUNDS = 31  # rounds of comm_overlap's three timings (11 until round 19: it moved 15-36% between idle runs)


# glibc malloc.c: DEFAULT_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * sizeof(long) (32 MiB on 64-bit), the ceiling its
# dynamic mmap threshold rises to (mallopt(3)).
ALLOCATOR_MMAP_THRESHOLD_BYTES = 32 << 20
# Round 20 (r20b): the heap is never trimmed in a measuring process. Until then the trim threshold was pinned at 64 MiB
# (twice the mmap threshold, glibc's dynamic rule): a fresh process whose heap held ~33 MiB of free holes after its
# set-up plus the step's 32 MiB of temporaries crossed it once, glibc returned the top of the heap to the kernel
# (sbrk), and the next step faulted its temporaries in again (4,096-8,160 minor faults in one of the 9 timed steps, 4
# of 16 fresh pinned processes, mallinfo2: arena 234 -> 170 MiB at that step; benchmarks/RESULTS.md, round 20 r20b).
# A training rank pays such a trim at most once; the per-step state both settle in is "temporaries reuse the heap".
# 1 GiB: above any heap top a measuring process frees (the largest round-robin collective is < 64 MiB, larger ones
# are mmapped above the 32 MiB threshold); the memory goes back to the OS when the process exits.
ALLOCATOR_TRIM_THRESHOLD_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h> parameter numbers of mallopt(3)


def pin_allocator() -> bool:
    """Fix this process's glibc malloc thresholds: the mmap threshold at the value its dynamic rule converges to in
    a long-running process (:data:`ALLOCATOR_MMAP_THRESHOLD_BYTES`), the trim threshold above any heap top the
    measuring process frees (:data:`ALLOCATOR_TRIM_THRESHOLD_BYTES`: no trim, so no one-off re-fault in the middle of
    the timed steps), so that a measured kernel's temporaries below 32 MiB reuse heap memory
    instead of faulting in fresh pages on every call (module docstring: the AdamW rate of a fresh process was
    bimodal, 2-3x apart, by which side of the dynamic thresholds its first allocations fell). For the measuring
    processes only (they are spawned for it); it cannot be undone (mallopt disables the dynamic thresholds).

    Returns:
        True when both thresholds were set; False where the C library is not glibc (no ``mallopt``: nothing is
        changed, and the caller records it).
    """
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, ALLOCATOR_MMAP_THRESHOLD_BYTES)) \
        and bool(mallopt(_M_TRIM_THRESHOLD, ALLOCATOR_TRIM_THRESHOLD_BYTES))


def median_time_s(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def repeats_for(nbytes: int, repeats: int, large_repeats: int = LARGE_REPEATS) -> int:
    """Samples taken of a message of ``nbytes``: ``repeats`` below 64 MiB, else at most ``large_repeats``
    (:data:`LARGE_REPEATS`, 5; one 256 MiB collective takes ~0.1-0.5 s here; a median of 3 samples of 4-16 MiB moved
    by up to 45% between two calibrations; 3 until round 19)."""
    return repeats if nbytes < _ROUND_ROBIN_MAX_BYTES else min(repeats, large_repeats)


def inner_for(nbytes: int, inner: int) -> int:
    """Back-to-back collectives per sample of a message of ``nbytes``: at least ``_SMALL_INNER`` (16) below
    ``_SMALL_BYTES`` (1 MiB), at least ``_MEDIUM_INNER`` (4) up to ``_MEDIUM_BYTES`` (4 MiB) inclusive, else
    ``inner``. A single latency-bound collective of ~0.1-1 ms is at the scheduler's resolution: with 4 calls per
    sample below 1 MiB and 1 call at 1 MiB, two calibrations back to back moved the 64 KiB-1 MiB medians by
    -64% .. +151% (benchmarks/RESULTS.md, step-time section); 16 calls of <= 1 ms add < 2 s per calibration."""
    if nbytes < _SMALL_BYTES:
        return max(inner, _SMALL_INNER)
    return max(inner, _MEDIUM_INNER) if nbytes <= _MEDIUM_BYTES else inner


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _collective_op(kind: str, nbytes: int, rank: int, world_size: int):
    """A zero-argument callable running one collective of ``kind`` on ``nbytes`` as a training step runs it
    (module docstring: blocking kinds through torch's functional collectives, waited on at once; send_recv
    through ``dist.send`` / ``dist.recv``), or None on a rank that takes no part (send_recv with an odd world
    size)."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    numel = max(world_size, nbytes // 4)
    numel -= numel % world_size
    group = dist.group.WORLD
    if kind == "all_reduce":
        buf = torch.ones(numel)
        return lambda: _waited(funcol.all_reduce(buf, "sum", group))
    if kind == "all_gather":  # nbytes: the OUTPUT size
        inp = torch.ones(numel // world_size)
        return lambda: _waited(funcol.all_gather_single(inp, 0, group))
    if kind == "reduce_scatter":  # nbytes: the INPUT size
        inp = torch.ones(numel)
        return lambda: _waited(funcol.reduce_scatter_single(inp, "sum", 0, group))
    if kind == "all_to_all":  # nbytes: the per-rank send (= receive) buffer
        inp = torch.ones(numel)
        return lambda: _waited(funcol.all_to_all_single(inp, None, None, group))
    peer = rank + 1 if rank % 2 == 0 else rank - 1  # send_recv: nbytes is the message
    if peer >= world_size:
        return None
    buf = torch.ones(numel)
    return (lambda: dist.send(buf, peer)) if rank % 2 == 0 else (lambda: dist.recv(buf, peer))


def _waited(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor of a functional collective's result, waited on (as the runtime does at once)."""
    import torch.distributed._functional_collectives as funcol
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _interleaved_medians(loops: dict[str, Callable[[], object]], rounds: int, inner: int = 1,
                         closing_barrier: bool = False) -> dict[str, float]:
    """Median seconds per call of each loop body (all ranks take part): ``rounds`` rounds after one warm-up
    round, each timing every body in turn (``inner`` calls from a barrier; to a closing barrier when
    ``closing_barrier``, so the slowest rank counts), so that a burst of outside load hits all bodies alike."""
    import torch.distributed as dist
    samples: dict[str, list[float]] = {key: [] for key in loops}
    for r in range(rounds + 1):
        for key, fn in loops.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            if closing_barrier:
                dist.barrier()
            if r:  # round 0: warm-up
                samples[key].append((time.perf_counter() - start) / inner)
    return {key: statistics.median(got) for key, got in samples.items()}


def _matmuls(count: int) -> Callable[[], None]:
    """A compute chunk: ``count`` fp32 matmuls of ``_MATMUL_N`` x ``_MATMUL_N``."""
    a, b = torch.randn(_MATMUL_N, _MATMUL_N), torch.randn(_MATMUL_N, _MATMUL_N)

    def compute() -> None:
        for _ in range(count):
            torch.mm(a, b)
    return compute


def _measure_overlap(rounds: int = OVERLAP_ROUNDS) -> float:
    """comm_overlap of the module docstring (all ranks take part; comm, compute and both interleaved)."""
    import torch.distributed as dist
    buf = torch.ones(_OVERLAP_BYTES // 4)
    comm = _interleaved_medians({"comm": lambda: dist.all_reduce(buf)}, rounds)["comm"]
    one = _matmuls(1)
    compute = _matmuls(max(1, round(comm / median_time_s(one, repeats=20))))

    def both() -> None:
        work = dist.all_reduce(buf, async_op=True)
        compute()
        work.wait()

    got = _interleaved_medians({"comm": lambda: dist.all_reduce(buf), "compute": compute, "both": both}, rounds)
    comm, comp = got["comm"], got["compute"]
    return min(1.0, max(0.0, (comp + comm - got["both"]) / min(comp, comm)))


def sync_wait_s(entries_s: Sequence[Sequence[float]], exits_s: Sequence[Sequence[float]], alone_s: float,
                oversubscribed: bool = False) -> float:
    """``sync_s`` of the module docstring from per-call stamps: ``entries_s[r][c]`` / ``exits_s[r][c]`` the
    seconds at which rank r entered / left call c (one clock for all ranks), ``alone_s`` the same collective's
    seconds back to back. Returns ``max(0, median_c(max_r exits_s[r][c] - mean_r entries_s[r][c]) - alone_s)``;
    with ``oversubscribed`` (more ranks than cores) the last entry replaces the mean one,
    ``max(0, median_c(max_r exits_s[r][c] - max_r entries_s[r][c]) - alone_s)``: the stragglers' lag is then
    priced by the contention slowdown (module docstring).

    Raises:
        ValueError: no calls, or ranks with different numbers of calls.
    """
    calls = {len(e) for e in (*entries_s, *exits_s)}
    if len(calls) != 1 or calls == {0}:
        raise ValueError(f"sync_wait_s: every rank needs the same number (>= 1) of entry and exit stamps, got "
                         f"{sorted(len(e) for e in entries_s)} entries and {sorted(len(e) for e in exits_s)} exits")
    enter = max if oversubscribed else statistics.fmean
    per_call = [max(x[c] for x in exits_s) - enter([e[c] for e in entries_s]) for c in range(calls.pop())]
    return max(0.0, statistics.median(per_call) - alone_s)


def _measure_sync(rounds: int = 21) -> tuple[float, float]:
    """(sync_s of the module docstring, :func:`exit_spread_s` of the same calls), seconds (all ranks take part)."""
    import torch.distributed as dist
    world = dist.get_world_size()
    reduce = _collective_op("all_reduce", _SYNC_BYTES, dist.get_rank(), world)  # as a step calls it
    compute = _matmuls(_SYNC_MATMULS)
    stamps: list[tuple[float, float]] = []
    alone: list[float] = []
    for r in range(rounds + 1):  # round 0: warm-up
        dist.barrier()
        start = time.perf_counter()
        for _ in range(_SYNC_INNER):
            reduce()
        if r:
            alone.append((time.perf_counter() - start) / _SYNC_INNER)
        dist.barrier()
        for _ in range(_SYNC_INNER):
            compute()
            entry = time.perf_counter()
            reduce()
            if r:
                stamps.append((entry, time.perf_counter()))
    mine = torch.tensor(stamps, dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    exits = [t[:, 1].tolist() for t in every]
    return (sync_wait_s([t[:, 0].tolist() for t in every], exits, statistics.median(alone),
                        oversubscribed=world > _cores()), exit_spread_s(exits))


def _cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def sample_calls(nbytes: int, inner: int, warmup_per_call_s: float, min_sample_s: float = MIN_SAMPLE_S,
                 max_calls: int = MAX_SAMPLE_CALLS) -> int:
    """Back-to-back calls per sample of a collective of ``nbytes``: :func:`inner_for`'s count, raised so that one
    sample lasts at least ``min_sample_s`` at the per-call seconds the warm-up round measured
    (``ceil(min_sample_s / warmup_per_call_s)``), at most ``max_calls`` (and never below :func:`inner_for`).

    Why (round 23, r23c): a sample of a few milliseconds is one or two scheduler time slices (CFS / EEVDF give a
    runnable task ~3 ms before another may run), so whether a wake-up lands in it decides the sample. In the two idle
    calibration pairs of rounds 21 and 22, the split-half difference of a 2-rank collective's median (odd vs even
    rounds, :func:`cost_model.rounds.split_half_difference`) was 30% for samples under 5 ms (x2 send_recv 64 KiB,
    16 calls of 0.27 ms; 1 MiB kinds, 4 calls of 0.5-1.9 ms), 13-14% for 5-20 ms and 12% from 20 ms (x4: 50% under
    5 ms, 7% from 20 ms). Cost at 20 ms: +6 s per calibration (the medians of round 22's idle profile).

    Raises:
        ValueError: ``warmup_per_call_s`` negative or not finite.
    """
    if not (warmup_per_call_s >= 0 and math.isfinite(warmup_per_call_s)):
        raise ValueError(f"sample_calls: warmup_per_call_s={warmup_per_call_s!r} must be finite and >= 0 (seconds per "
                         f"call of the warm-up round of a {nbytes}-byte collective)")
    floor = inner_for(nbytes, inner)
    if warmup_per_call_s == 0:
        return floor
    return max(floor, min(max_calls, math.ceil(min_sample_s / warmup_per_call_s)))


def _sample(pairs: list[tuple[str, int]], rank: int, world_size: int, repeats: int, inner: int,
            cpu: dict | None = None, large_repeats: int = LARGE_REPEATS) -> dict:
    """Seconds per call of each (kind, nbytes) in ``pairs``, one sample per round, sampled round-robin after one
    warm-up round; with ``cpu`` (a dict) also this process's CPU seconds per call of each sample
    (``time.process_time``: every thread of the rank, gloo's included, user + system), appended to
    ``cpu[(kind, nbytes)]``. Calls per sample: :func:`inner_for` in the warm-up round, then :func:`sample_calls`
    of the warm-up's slowest rank (a MAX all-reduce, so that every rank makes the same calls)."""
    import torch.distributed as dist
    ops = {pair: _collective_op(*pair, rank, world_size) for pair in pairs}
    samples: dict[tuple[str, int], list[float]] = {pair: [] for pair in pairs}
    calls = {pair: inner_for(pair[1], inner) for pair in pairs}
    warmup: dict[tuple[str, int], float] = {}
    for r in range(1 + max((repeats_for(n, repeats, large_repeats) for _, n in pairs), default=0)):
        if r == 1:  # after the warm-up: every rank takes the slowest rank's per-call seconds
            slowest = torch.tensor([warmup[pair] for pair in pairs], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            calls = {pair: sample_calls(pair[1], inner, float(t)) for pair, t in zip(pairs, slowest)}
        for (kind, nbytes), op in ops.items():
            if r > repeats_for(nbytes, repeats, large_repeats):
                continue
            n_calls = calls[(kind, nbytes)]
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(n_calls if op is not None else 0):
                op()
            per_call = (time.perf_counter() - start) / n_calls
            if not r:  # round 0: warm-up (connections, first touch of the pages), sizes the samples
                warmup[(kind, nbytes)] = per_call
                continue
            samples[(kind, nbytes)].append(per_call)
            if cpu is not None:
                cpu.setdefault((kind, nbytes), []).append((time.process_time() - cpu_start) / n_calls)
    return samples


def _collective_worker(rank: int, world_size: int, port: int, kinds: tuple[str, ...], sizes_bytes: tuple[int, ...],
                       repeats: int, inner: int, timeout_s: float, queue, large_repeats: int = LARGE_REPEATS,
                       extras: bool = True) -> None:
    """Spawned worker: median seconds of each (kind, size) on rank 0 and its samples in round order, then (with
    ``extras``) comm_overlap and sync_s; results on ``queue``."""
    def body():
        small = [(kind, nbytes) for kind in kinds for nbytes in sizes_bytes if nbytes < _ROUND_ROBIN_MAX_BYTES]
        large = [(kind, nbytes) for kind in kinds for nbytes in sizes_bytes if nbytes >= _ROUND_ROBIN_MAX_BYTES]
        cpu: dict = {}
        samples = _sample(small, rank, world_size, repeats, inner, cpu, large_repeats)
        for pair in large:  # one at a time: their buffers are hundreds of MiB per rank
            samples.update(_sample([pair], rank, world_size, repeats, inner, cpu, large_repeats))
        results: dict[str, dict[int, float]] = {kind: {} for kind in kinds}
        halves: dict[str, dict[int, float]] = {kind: {} for kind in kinds}
        rounds: dict[str, dict[int, list[float]]] = {kind: {} for kind in kinds}
        for (kind, nbytes), got in samples.items():
            results[kind][nbytes] = statistics.median(got)
            halves[kind][nbytes] = split_half_difference(got)
            rounds[kind][nbytes] = list(got)
        cpu_results = _median_over_ranks(cpu, kinds)
        overlap = _measure_overlap() if extras else None
        sync, spread = _measure_sync() if extras else (None, None)
        return {"collectives": results, "comm_overlap": overlap, "sync_s": sync, "sync_exit_spread_s": spread,
                "collective_cpu": cpu_results,
                "split_half": halves, "samples": rounds}
    gloo_worker(rank, world_size, port, timeout_s, queue, body)


def _median_over_ranks(cpu: dict, kinds: Sequence[str]) -> dict[str, dict[int, float]]:
    """``{kind: {nbytes: CPU seconds per call}}``: per (kind, size) the median over this rank's samples, then the
    median over the ranks taking part (all ranks take part; a rank without samples, e.g. the odd one out of
    send_recv, is left out)."""
    import torch.distributed as dist
    keys = sorted(cpu)
    mine = torch.tensor([statistics.median(cpu[k]) if cpu[k] else float("nan") for k in keys], dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    out: dict[str, dict[int, float]] = {kind: {} for kind in kinds}
    for i, (kind, nbytes) in enumerate(keys):
        got = [float(t[i]) for t in every if not torch.isnan(t[i])]
        if got:
            out[kind][nbytes] = statistics.median(got)
    return out


def gloo_worker(rank: int, world_size: int, port: int, timeout_s: float, queue, body: Callable[[], object]) -> None:
    """The frame of a spawned measuring process: one intra-op thread, the allocator pinned (:func:`pin_allocator`),
    a gloo group on 127.0.0.1:``port``, then
    ``body()``, whose result rank 0 puts on ``queue`` as ("ok", result) (an exception: ("error", message) from
    any rank); tears the group down and exits the process."""
    import torch.distributed as dist
    try:
        torch.set_num_threads(1)
        pin_allocator()  # the collectives' fresh outputs reuse heap memory, as in a rank (module docstring)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
        result = body()
        if rank == 0:
            queue.put(("ok", result))
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which raises
        queue.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))
    finally:
        try:  # the result must be in the pipe before os._exit, which kills the queue's feeder thread: without
            queue.close()  # this the parent waited for its timeout (330 s) for a result rank 0 had put (round 16)
            queue.join_thread()
        finally:
            os._exit(0)


def _run_spawned(target, nprocs: int, args: tuple, timeout_s: float, what: str, extra_args: tuple = ()):
    """Start ``nprocs`` spawned processes ``target(rank, nprocs, *args, queue, *extra_args)``; return the first
    result put on the queue. Raises RuntimeError naming ``what`` on a worker error or no result within
    ``timeout_s``."""
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, nprocs, *args, queue, *extra_args)) for rank in range(nprocs)]
    for proc in procs:
        proc.start()
    try:
        status, payload = queue.get(timeout=timeout_s)
    except Exception as exc:
        raise RuntimeError(f"{what} with {nprocs} processes produced no result within {timeout_s:.0f} s; the "
                           "machine may be overloaded: retry, or measure fewer/smaller message sizes") from exc
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    if status != "ok":
        raise RuntimeError(f"{what} with {nprocs} processes failed: {payload}")
    return payload


def measure_collectives(nprocs: int, kinds: Sequence[str] = MEASURABLE_KINDS, sizes_bytes: Sequence[int] = (1 << 20,),
                        repeats: int = COLLECTIVE_REPEATS, inner: int = 1, timeout_s: float = 600.0,
                        large_repeats: int = LARGE_REPEATS, extras: bool = True) -> dict:
    """Median seconds of each collective ``kind`` and size over gloo, ``comm_overlap`` and ``sync_s`` (module
    docstring) in one set of ``nprocs`` spawned processes: ``repeats`` rounds below 64 MiB, ``large_repeats`` at 64 MiB
    and above (:func:`repeats_for`); comm_overlap and sync_s only with ``extras`` (else None).

    Returns:
        ``{"collectives": {kind: {nbytes: seconds}}, "comm_overlap": fraction, "sync_s": seconds,
        "collective_cpu": {kind: {nbytes: CPU seconds per call of one rank (process CPU, median over ranks)}},
        "split_half": {kind: {nbytes: split_half_difference of rank 0's samples in round order}},
        "samples": {kind: {nbytes: rank 0's seconds per call, one per round, in round order}}}``.

    Raises:
        ValueError: a kind outside :data:`MEASURABLE_KINDS`.
        RuntimeError: a worker failed or no result arrived within ``timeout_s``; names the rank.
    """
    unknown = [k for k in kinds if k not in MEASURABLE_KINDS]
    if unknown:
        raise ValueError(f"cannot measure collective kinds {unknown}; measurable: {MEASURABLE_KINDS}")
    return _run_spawned(_collective_worker, nprocs, (_free_port(), tuple(kinds), tuple(sizes_bytes), repeats, inner,
                                                    timeout_s), timeout_s + 30, "gloo calibration",
                        extra_args=(large_repeats, extras))


_OPTIMIZER_STEPS = 9  # timed AdamW steps per process (after 2 warm-up steps)


def _optimizer_step_s(shapes: Sequence[int]) -> tuple[float, float]:
    """(median seconds of one AdamW step over fresh fp32 tensors of ``shapes``, median minor page faults of one
    step), over :data:`_OPTIMIZER_STEPS` timed steps, each counted on its own (``getrusage`` around each step).

    The faults are the median over steps, not the mean, because the two states they tell apart differ in how
    many steps fault: in the faulting state (the step's temporaries on fresh pages) EVERY step faults (8,160 for
    4M elements); a one-off event (a heap trim, which :func:`pin_allocator` now prevents; a NUMA-balancing scan on
    a multi-node machine) faults in one or a few steps. Until round 20 the mean over 9 steps let one trimmed step
    (4,096 faults) read 455 per step (benchmarks/RESULTS.md, round 20 r20b)."""
    import resource
    params = [torch.nn.Parameter(torch.randn(n)) for n in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3)
    for _ in range(2):  # warm-up: the optimizer state's first touch
        opt.step()
    seconds, faults = [], []
    for _ in range(_OPTIMIZER_STEPS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        opt.step()
        seconds.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(seconds), float(statistics.median(faults))


def _optimizer_worker(rank: int, nprocs: int, numel: int, small_tensors: int, queue) -> None:
    """Spawned worker of :func:`measure_optimizer`: one intra-op thread, the allocator pinned, then
    ``(bytes_per_s, tensor_s, minor faults per large step, pinned, pid)`` on ``queue``."""
    try:
        torch.set_num_threads(1)
        pinned = pin_allocator()
        per_tensor = _optimizer_step_s([16] * small_tensors)[0] / small_tensors
        big, faults = _optimizer_step_s([numel])
        queue.put(("ok", (28 * numel / max(big - per_tensor, 1e-9), per_tensor, faults, pinned, os.getpid())))
    except Exception as exc:  # reported to the parent, which raises
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def measure_optimizer_processes(numel: int = 1 << 22, small_tensors: int = 256, processes: int = 1,
                                timeout_s: float = 180.0) -> list[dict]:
    """One AdamW measurement per fresh spawned process, ``processes`` of them one after another (never two at
    once: they would share the cores), each with its allocator pinned (:func:`pin_allocator`).

    Returns:
        Per process ``{"optimizer_bytes_per_s", "optimizer_tensor_s", "minor_faults_per_step", "pinned", "pid"}``
        (minor page faults of a timed step of the large tensor, the median over its steps: 0 pinned, 8,160 in the
        faulting state).

    Raises:
        ValueError: ``processes`` < 1, ``numel`` < 1 or ``small_tensors`` < 1.
        RuntimeError: a process failed or gave no result within ``timeout_s`` (names the measurement).
    """
    if processes < 1 or numel < 1 or small_tensors < 1:
        raise ValueError(f"measure_optimizer(numel={numel}, small_tensors={small_tensors}, processes={processes}): "
                         "each must be >= 1")
    keys = ("optimizer_bytes_per_s", "optimizer_tensor_s", "minor_faults_per_step", "pinned", "pid")
    return [dict(zip(keys, _run_spawned(_optimizer_worker, 1, (numel, small_tensors), timeout_s,
                                        f"AdamW measurement (process {i + 1} of {processes})")))
            for i in range(processes)]


def measure_optimizer(numel: int = 1 << 22, small_tensors: int = 256, processes: int = 1) -> tuple[float, float]:
    """``(optimizer_bytes_per_s, optimizer_tensor_s)`` of torch's default AdamW (module docstring): the fixed
    seconds per tensor from ``small_tensors`` 16-element tensors, the bandwidth from one tensor of ``numel`` fp32
    elements at 28 B of traffic per element; each the median over ``processes`` fresh processes with the allocator
    pinned (:func:`measure_optimizer_processes`). Until round 19 it ran in the caller's process, whose malloc state
    (module docstring) made the rate bimodal, 2.6x apart between processes.

    Raises:
        ValueError, RuntimeError: as :func:`measure_optimizer_processes`.
    """
    got = measure_optimizer_processes(numel, small_tensors, processes)
    return (statistics.median(g["optimizer_bytes_per_s"] for g in got),
            statistics.median(g["optimizer_tensor_s"] for g in got))
