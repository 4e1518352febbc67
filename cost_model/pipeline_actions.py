"""The fixed host cost of each pipeline action (issue 14): :class:`cost_model.hardware.PipelineActionCost`.

What is measured (:func:`measure_pipeline_actions`): torch.distributed.pipelining's runtime on 2 spawned gloo
processes (one intra-op thread each), stages of one ``nn.Linear(8, 8)`` on one row (near-zero compute),
``ScheduleInterleaved1F1B`` (F, full B, SEND / RECV actions) and ``ScheduleZBVZeroBubble`` (F, I, W) over 4
stages, 8 microbatches. Per action its **per-thread CPU time** (``time.thread_time``: what the rank's own
thread spends, which holds under outside load and leaves out the time a blocking wait sleeps): F =
``forward_one_chunk``, B / I = ``backward_one_chunk`` (full or input only), W = ``backward_weight_one_chunk``,
send / recv = the stage's ``get_*_send_ops`` / ``get_*_recv_ops`` + posting them + the waits on the returned
works (their sum per action); step = a whole ``schedule.step`` less the actions' time recorded in it (set-up, microbatch
split, loss bookkeeping), per rank; comm = the process's CPU less that thread's over a step, per P2P op posted
(gloo's own threads: ``PipelineActionCost.comm_thread_s``, round 18). A compute action's cost is its median less the median of the same op run
alone in the same process (the stage's Linear forward; its backward; input-only and weight-only gradients),
which the cost model prices as compute. Medians over both ranks, the actions and ``steps`` steps after 2
warm-up steps. The two schedules' steps and the bare ops are interleaved step by step (round 17): measured one
schedule after the other, a burst of outside load shifted every sample of one schedule's kinds, and three
back-to-back measurements at load 3-6 read I 118 / 106 / 199 us and B 199 / 172 / 111 us (I and B swapped).

A ``PipelineStage`` subclass times its methods; one private function is wrapped in the spawned workers,
``torch.distributed.pipelining.schedules._batch_p2p`` (posts one SEND / RECV action's ops; the works it
returns are wrapped to time ``wait``): checked on torch 2.13.0.

:data:`CPU_PIPELINE_ACTION` is what a profile without the field gets: measured on this 2-core machine
(round 16, 2026-12-03 11:36, load 5.5, ``trial/r16f_action_overhead.py``, 30 steps) through the package's
own runtime (its stage modules of one Linear(8, 8) per block under torch's gpipe / 1f1b / interleaved_1f1b /
zbv, 2 ranks, 8 microbatches; per kind the median over the schedules and ranks of the action's median CPU
less the stage program's alone): F 85 us (38-111), B 80 us (50-121), I 120 us (77-167), W 120 us (119-121),
send 35 us (24-56), recv 33 us (24-45), set-up 2.2 ms per step (1.1-3.1: the step's CPU less its actions').
Its ``comm_thread_s`` (round 18, the default of profiles written before): 288 us per P2P op, the median of 40
steps of this module's measurement (2026-12-03 17:46, load ~28; range 40-889 us): per step, the process's CPU
(``time.process_time``) less the stepping thread's (``time.thread_time``), over the P2P ops the step posted
(each send and each receive, ``len(ops)`` of every ``_batch_p2p``). It agrees with round 17's profile of gloo's
threads (10-31 ms per step over ~48 ops a rank: 210-650 us).

Round 19, two costs that grow with size (``PipelineActionCost`` documents them):
- ``comm_thread_per_byte_s``: each round, rank 0 sends 8 messages of 64 B and 8 of 4 MiB to rank 1 and back
  (each posted and waited in turn); per round and rank, (process CPU - thread CPU per op at 4 MiB - the same at
  64 B) / (4 MiB - 64 B); the median over rounds and ranks. Until round 26 the large size was 1 MiB: the lead's
  quiet full-size profile (2026-12-04 22:22) read 0.40 ns per byte, which priced BitPipe's twin exchange (4 x 13 MB
  per rank and step, both ends) at 41-45 ms of gloo CPU per rank where the whole step's gloo CPU measured 31-49 ms
  (r26e, per-action run under load); re-measured (r26e, ``/tmp/r26e/gloo_bytes.py``, 2 ranks, load ~11): 0.19-0.24
  ns per byte at 4 and 13 MiB, 0.20 / 1.62 ns at 1 MiB (one rank's 1 MiB ops cost more than its 4 MiB ones). Default (profiles written before) 0.23 ns per byte:
  ``/tmp/r19c/gloo_bytes.py`` on this machine (2026-12-03 21:46, load ~22, 2 ranks, 16 ops a size, 7 rounds):
  gloo's threads 252 / 253 us per op at 1 MiB (send / recv), 876 / 1012 us at 4 MiB, 0-17 us at 64 B - 4 KiB,
  i.e. 0.21-0.24 ns per byte on each end.
- ``split_backward_per_node_s``: per process, chains of ``_SPLIT_DEPTHS`` Linear(8, 8) layers, the thread CPU
  of torch's ``stage_backward_input`` + ``stage_backward_weight`` less a full ``autograd.backward``, per autograd
  node (4 per Linear: addmm, t, 2 AccumulateGrad): (extra(8) - extra(1)) / (32 - 4); since round 24 each of the
  four timings per round is a sample of >= 20 ms of back-to-back backward passes (``_split_per_node``: one pass
  per sample before, which made the figure swing 2.3x between two idle calibrations). Default 24 us per node:
  ``/tmp/r19c/iw_lin.py`` (2026-12-03 21:59, load ~40, 35 runs each): extra 196 / 518 / 1642 us for 1 / 4 / 16
  layers ((1642 - 196) / 60 nodes); on a GPT-2 block of width 64, sequence 32 (``/tmp/r19c/iw_split.py``) the
  split cost 3302 us against 1301 us for a full backward.
- ``split_backward_per_byte_s`` (round 26): per process, chains of ``_SPLIT_DEPTHS`` Linear(512, 512) layers on 128
  rows timed as above; the extra per layer less its 4 nodes at the round's per-node figure, over the layer's weight
  and bias bytes (``_split_per_byte``). Default 0.1 ns per byte: ``_split_per_byte`` six times on this machine
  (2026-12-04 23:43, r26e, load 13-15; thread CPU): 0.056-0.186 ns, median ~0.1 (1 or 128 rows).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import defaultdict

import torch

from cost_model.hardware import PipelineActionCost
from cost_model.measure import MIN_SAMPLE_S, _free_port, _run_spawned, gloo_worker

__all__ = ["CPU_PIPELINE_ACTION", "first_touch_per_byte_s", "measure_pipeline_actions", "measure_pipeline_action_samples", "measure_own_runner",
           "action_cost_from_samples",
           "register_own_runner_benchmark", "copy_exchange_pack_s", "EXCHANGE_PASSES"]

# The benchmark of the package's own pipeline runner (BitPipe: `parallelizer.runtime.bitpipe`), registered by
# `parallelizer.runtime.bitpipe_cost` (this leaf package cannot import the runtime): a callable returning its
# PipelineActionCost (without own_runner). None: not registered, nothing measured.
_OWN_RUNNER_BENCHMARK: list = [None]


def register_own_runner_benchmark(measure) -> None:
    """Register ``measure() -> PipelineActionCost``, the per-action costs of the package's own runner, which
    :func:`measure_pipeline_actions` records as ``own_runner`` (``None`` unregisters)."""
    _OWN_RUNNER_BENCHMARK[0] = measure

# Memory passes over a stage copy's gradient bytes that `parallelizer.runtime.bitpipe` makes on the host to exchange
# it with its twin: torch.cat into one flat buffer (read + write: 2), mine + theirs (2 reads + 1 write: 3), one
# clone per parameter out of the sum (read + write: 2).
EXCHANGE_PASSES = 7


def copy_exchange_pack_s(grad_bytes: float, device) -> float:
    """Host seconds (solo) one rank spends packing a stage copy's gradients (`grad_bytes`) for the exchange with
    its twin and summing / unpacking the twin's (BitPipe, round 18): EXCHANGE_PASSES x grad_bytes at the device's
    memory bandwidth (`DeviceSpec.hbm_bytes_per_s`); memory-bound copies, no FLOPs. Measured (r18e, GPT hidden
    512, 8 blocks, pp=4, 4 ranks at load ~28, per-thread CPU): `_start_exchange` + `_finish_exchange` 48-58 ms
    per rank per step for 12.6-13.7 M parameters (50-55 MB of fp32 gradients): 7 x 52 MB / 25.4 GB/s = 14 ms solo,
    x 3.76 (the profile's 4-process memory contention) = 54 ms. Round 19: plus the communication threads' CPU for
    the bytes on the wire, the rank's send of its copy's gradients and its receive of the twin's:
    2 x grad_bytes x `PipelineActionCost.comm_thread_per_byte_s` of the device (0 on the GPU presets). Round 20:
    plus the same threads' per-op CPU of those two P2P ops (the runner's isend of its copy and irecv of the
    twin's, `_start_exchange`), 2 x `PipelineActionCost.comm_thread_s`, which the simulator charges every other
    P2P op; none when the copy has no gradient to exchange (grad_bytes = 0: the runner posts nothing).

    Raises:
        ValueError: negative bytes.
    """
    if not grad_bytes >= 0:
        raise ValueError(f"copy_exchange_pack_s: grad_bytes={grad_bytes!r} must be >= 0")
    if grad_bytes == 0:
        return 0.0
    per = device.pipeline_action
    return (EXCHANGE_PASSES * float(grad_bytes) / device.hbm_bytes_per_s
            + 2 * float(grad_bytes) * per.comm_thread_per_byte_s + 2 * per.comm_thread_s)


CPU_PIPELINE_ACTION = PipelineActionCost(forward_s=85e-6, backward_input_s=120e-6, backward_weight_s=120e-6,
                                         backward_s=80e-6, send_s=35e-6, recv_s=33e-6, step_s=2.2e-3,
                                         comm_thread_s=288e-6, comm_thread_per_byte_s=0.23e-9,
                                         split_backward_per_node_s=24e-6, first_touch_per_byte_s=0.45e-9,
                                         split_backward_per_byte_s=0.1e-9)
_WIDTH, _STAGES, _MICROBATCHES = 8, 4, 8
_KEYS = ("F", "I", "W", "B", "send", "recv", "step", "comm", "comm byte", "split node",  # the seconds fields
         "first touch byte", "split byte")
_FIRST_TOUCH_BYTES = 16 << 20  # one fresh anonymous mapping per round (first_touch_per_byte_s)
_SAMPLED = {"send": "send action", "recv": "recv action", "step": "step loop",  # sample key of a cost field
            "comm": "comm op"}
_SIZES_BYTES = (64, 4 << 20)  # the two message sizes of the per-byte sweep (round 19; 4 MiB since round 26)
_SPLIT_DEPTHS = (1, 8)  # Linear(8, 8) chains whose split backward is timed against a full one (round 19)
_SPLIT_REPEATS = 3  # samples of each kind per depth and round (their median)
_SPLIT_MAX_CALLS = 4096  # backward passes per sample at most (a full backward of one Linear(8, 8): ~30 us)
_SPLIT_ROWS = 128  # ... and their rows (tokens of a microbatch: the bench's full size)
_SPLIT_WIDE = 512  # the width of the Linear chains whose split backward prices its weight-gradient bytes (round 26)


def action_cost_from_samples(samples: dict[str, list[float]], bare: dict[str, list[float]]) -> PipelineActionCost:
    """The cost per kind: median of `samples[kind]` less the median of `bare[kind]` (compute actions; 0 when
    absent), clamped at >= 0; send, recv and step as measured. A kind without samples costs 0.

    Raises:
        ValueError: a sample that is negative or not finite.
    """
    if any(not (v >= 0 and v < float("inf")) for vs in (*samples.values(), *bare.values()) for v in vs):
        raise ValueError("pipeline action samples must be finite seconds >= 0")

    def cost(kind: str) -> float:
        got = samples.get(_SAMPLED.get(kind, kind))
        if not got:
            return 0.0
        base = statistics.median(bare[kind]) if bare.get(kind) else 0.0
        return min(0.5, max(0.0, statistics.median(got) - base))
    return PipelineActionCost(*(cost(k) for k in _KEYS))


class _Clock:
    def __init__(self) -> None:
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.on = False
        self.inside = 0.0  # CPU seconds recorded during the current step
        self.posted: dict[str, int] = defaultdict(int)  # send / recv actions (batches posted) in the step
        self.ops = 0  # P2P ops (each send, each receive) posted in the step

    def timed(self, kind: str, fn, *args, **kwargs):
        if not self.on:
            return fn(*args, **kwargs)
        self.on = False  # nested timed calls count in the outer one
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.thread_time() - start
            self.cpu[kind].append(spent)
            self.inside += spent
            self.on = True


def _worker(rank: int, nprocs: int, port: int, steps: int, timeout_s: float, queue) -> None:
    """Spawned worker (module docstring); rank 0 puts ``{"samples": {kind: [s]}, "bare": {kind: [s]}}``."""
    def body():
        import torch.distributed as dist
        from torch.distributed import pipelining
        samples, bare = _run_schedules(rank, nprocs, steps, _Clock(), dist, pipelining, timeout_s)
        gathered = [None] * nprocs
        dist.all_gather_object(gathered, (samples, bare))
        keys = {k for s, _ in gathered for k in s}
        return {"samples": {k: [v for s, _ in gathered for v in s.get(k, ())] for k in keys},
                "bare": {k: [v for _, b in gathered for v in b.get(k, ())] for k in ("F", "I", "W", "B")}}
    gloo_worker(rank, nprocs, port, timeout_s, queue, body)


def _run_schedules(rank, nprocs, steps, clock, dist, pipelining, timeout_s: float = 60.0):
    from torch.distributed.pipelining import schedules
    real_batch = schedules._batch_p2p  # private (torch 2.13.0): posts one SEND / RECV action's ops

    class _Work:  # times wait() of a posted P2P op, as send or recv
        def __init__(self, work, kind):
            self.work, self.kind = work, kind

        def wait(self, *a, **k):
            return clock.timed(self.kind, self.work.wait, *a, **k)

    def batch(ops, *a, **k):
        kind = "send" if all(op.op is dist.isend for op in ops) else "recv"
        clock.posted[kind] += clock.on
        clock.ops += len(ops) if clock.on else 0
        return [_Work(w, kind) for w in clock.timed(kind, real_batch, ops, *a, **k)]
    schedules._batch_p2p = batch

    class Stage(pipelining.PipelineStage):
        def forward_one_chunk(self, *a, **k):
            return clock.timed("F", super().forward_one_chunk, *a, **k)

        def backward_one_chunk(self, *a, **k):
            return clock.timed("B" if k.get("full_backward", True) else "I", super().backward_one_chunk, *a, **k)

        def backward_weight_one_chunk(self, *a, **k):
            return clock.timed("W", super().backward_weight_one_chunk, *a, **k)

        def get_fwd_send_ops(self, *a, **k):
            return clock.timed("send", super().get_fwd_send_ops, *a, **k)

        def get_bwd_send_ops(self, *a, **k):
            return clock.timed("send", super().get_bwd_send_ops, *a, **k)

        def get_fwd_recv_ops(self, *a, **k):
            return clock.timed("recv", super().get_fwd_recv_ops, *a, **k)

        def get_bwd_recv_ops(self, *a, **k):
            return clock.timed("recv", super().get_bwd_recv_ops, *a, **k)

    x = torch.randn(_MICROBATCHES, _WIDTH)
    target = torch.randn(_MICROBATCHES, _WIDTH)
    loss_fn = torch.nn.functional.mse_loss
    runs = []  # (style, schedule, holds the first stage, holds the last, modules)
    for cls, style in ((pipelining.ScheduleInterleaved1F1B, "loop"), (pipelining.ScheduleZBVZeroBubble, "v")):
        held = [k for k in range(_STAGES)
                if (k % nprocs if style == "loop" else (k if k < nprocs else 2 * nprocs - 1 - k)) == rank]
        torch.manual_seed(0)
        mods = [torch.nn.Linear(_WIDTH, _WIDTH) for _ in range(_STAGES)]
        stages = [Stage(mods[k], k, _STAGES, torch.device("cpu"), group=None) for k in held]
        runs.append((style, cls(stages, _MICROBATCHES, loss_fn=loss_fn, scale_grads=False), 0 in held,
                     _STAGES - 1 in held, mods))
    bare: dict[str, list[float]] = defaultdict(list)
    for i in range(steps + 2):  # the schedules' steps and the bare ops interleaved: a burst of outside load
        for style, sched, first, last, mods in runs:  # shifts one round of every kind, not all samples of one
            clock.on, clock.inside, clock.posted, clock.ops = i >= 2, 0.0, defaultdict(int), 0
            io = {k: len(clock.cpu[k]) for k in ("send", "recv")}
            start, proc = time.thread_time(), time.process_time()
            sched.step(*((x,) if first else ()), target=target if last else None)
            main_cpu, proc = time.thread_time() - start, time.process_time() - proc
            clock.on = False
            if i >= 2 and clock.ops:  # the process's other threads (gloo's) per P2P op posted in the step
                clock.cpu["comm op"].append(max(0.0, proc - main_cpu) / clock.ops)
            if i >= 2:  # build, post and wait of one send / recv action are 3 timed calls: per action, their sum
                clock.cpu[f"step {style}"].append(main_cpu - clock.inside)
                for k, n in io.items():
                    clock.cpu[f"{k} action"].append(sum(clock.cpu[k][n:]) / max(1, clock.posted[k]))
            for m in mods:
                m.zero_grad(set_to_none=True)
        for k, v in _bare_ops(_MICROBATCHES).items():
            if i >= 2:
                bare[k] += v
        per_byte = _per_byte_round(rank, dist, timeout_s)  # both ranks, every round (module docstring)
        touch = first_touch_per_byte_s()
        if i >= 2:
            clock.cpu["comm byte"].append(per_byte)
            clock.cpu["split node"].append(_split_per_node())  # timed rounds only: ~0.2 s each (>= 4 x 20 ms)
            clock.cpu["split byte"].append(_split_per_byte(clock.cpu["split node"][-1]))  # round 26: ~0.2 s more
            clock.cpu["first touch byte"].append(touch)
    schedules._batch_p2p = real_batch
    return dict(clock.cpu), dict(bare)


def _per_byte_round(rank: int, dist, timeout_s: float, n: int = 8) -> float:
    """CPU seconds per byte of the process's other threads (gloo's) on one end of a P2P op: ranks 0 and 1 send
    each other n messages of each `_SIZES_BYTES` size in turn (each waited, at most `timeout_s`); (process CPU less
    thread CPU per op at the large size less at the small) / the size difference, >= 0."""
    from datetime import timedelta
    per_op = []
    for size in _SIZES_BYTES:
        buf = torch.zeros(size // 4)
        start, proc = time.thread_time(), time.process_time()
        for _ in range(n):
            for sender in (0, 1):
                (dist.isend if rank == sender else dist.irecv)(buf, 1 - rank).wait(timedelta(seconds=timeout_s))
        per_op.append(((time.process_time() - proc) - (time.thread_time() - start)) / (2 * n))
    return max(0.0, (per_op[1] - per_op[0]) / (_SIZES_BYTES[1] - _SIZES_BYTES[0]))


def _split_per_node(repeats: int = _SPLIT_REPEATS, min_sample_s: float = MIN_SAMPLE_S,
                    max_calls: int = _SPLIT_MAX_CALLS) -> float:
    """Per-thread CPU seconds per autograd node that torch's split backward spends beyond a full backward (module
    docstring): Linear(8, 8) chains of `_SPLIT_DEPTHS` layers, 4 nodes each; extra(depth) (`_split_extra`) the
    split's median less the full's; the result (extra(8) - extra(1)) / (4 (8 - 1)), >= 0.

    Why (round 24, r24c): until then a sample was ONE backward of a few tens of microseconds (median of 3 per
    round), so a scheduler time slice or a cache refill decided it: two idle back-to-back calibrations read
    31.5 vs 13.4 us (r23d) and 25.0 vs 14.8 us (2026-12-04 17:31-17:39, pass-half 53% / 22%), which moved zbv's
    quick-size price 220 -> 154 ms. The calibration pools one value per round over its passes (median, split-half
    and pass-half: `cost_model.rounds.pool_rounds`)."""
    extra = [_split_extra(_WIDTH, depth, repeats, min_sample_s, max_calls) for depth in _SPLIT_DEPTHS]
    return max(0.0, (extra[1] - extra[0]) / (4 * (_SPLIT_DEPTHS[1] - _SPLIT_DEPTHS[0])))


def _split_per_byte(per_node_s: float, repeats: int = _SPLIT_REPEATS, min_sample_s: float = MIN_SAMPLE_S,
                    max_calls: int = _SPLIT_MAX_CALLS) -> float:
    """Per-thread CPU seconds per byte of weight gradients that torch's split backward spends beyond a full backward
    besides its per-node walks (`PipelineActionCost.split_backward_per_byte_s`, round 26): chains of `_SPLIT_DEPTHS`
    Linear(`_SPLIT_WIDE`, `_SPLIT_WIDE`) layers timed as `_split_per_node`'s; the extra per layer (extra(8) -
    extra(1)) / 7 less its 4 nodes at `per_node_s`, over a layer's weight and bias bytes (fp32), >= 0.

    Why (r26e, 4 gloo ranks at the schedules bench's full size, per-action thread CPU under load): zbv's I + W
    actions cost its ranks 60-70 ms per step more than the same stages' full backwards under interleaved_1f1b, where
    the per-node price charged 15 ms; single-process, a GPT-2 block's split costs 0.9 ms over its full backward at
    width 64 and 2.2 ms at width 512 (the same nodes), and a Linear chain's per-layer extra grows with its width
    (64 / 78 / 148 / 278 us at widths 8 / 64 / 256 / 512, gradients accumulated): `stage_backward_weight` adds the
    fresh gradients from `torch.autograd.grad` into `.grad` in Python, where a full backward accumulates in the
    engine."""
    extra = [_split_extra(_SPLIT_WIDE, depth, repeats, min_sample_s, max_calls, _SPLIT_ROWS) for depth in _SPLIT_DEPTHS]
    per_layer = (extra[1] - extra[0]) / (_SPLIT_DEPTHS[1] - _SPLIT_DEPTHS[0]) - 4 * per_node_s
    return max(0.0, per_layer / (4 * (_SPLIT_WIDE * _SPLIT_WIDE + _SPLIT_WIDE)))


def _split_extra(width: int, depth: int, repeats: int, min_sample_s: float, max_calls: int, rows: int = 1) -> float:
    """Thread CPU seconds one split backward (`stage_backward_input` + `stage_backward_weight`) of a chain of `depth`
    Linear(width, width) layers on `rows` rows costs beyond a full one (`autograd.backward`): `repeats` samples of each,
    alternated, each `calls` backward passes back to back over as many graphs built before the clock starts (the
    gradients accumulate over them, as over a step's microbatches), per call; the median of the split's less the
    median of the full's. `calls` makes a sample last at least `min_sample_s` at the speed of 2 warm-up calls, as
    the collectives' samples (`cost_model.measure.sample_calls`), at most `max_calls`."""
    # private (torch 2.13.0): the two halves the runtime's I and W actions call
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    mod = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
    params = list(mod.parameters())

    def sample(split: bool, calls: int) -> float:
        graphs = []
        for _ in range(calls):  # built outside the clock: a backward consumes its graph
            x = torch.randn(rows, width, requires_grad=True)
            y = mod(x)
            graphs.append((x, y, torch.ones_like(y)))
        start = time.thread_time()
        for x, y, g in graphs:
            if split:
                _, groups = stage_backward_input([y], [g], [x], iter(params))
                stage_backward_weight(iter(params), groups)
            else:
                torch.autograd.backward(y, g)
        spent = time.thread_time() - start
        for q in params:
            q.grad = None
        return spent / calls
    calls = {split: max(1, min(max_calls, math.ceil(min_sample_s / max(sample(split, 2), 1e-9))))
             for split in (True, False)}  # from 2 warm-up calls of each
    samples = [(sample(True, calls[True]), sample(False, calls[False])) for _ in range(repeats)]  # alternated
    return statistics.median(s for s, _ in samples) - statistics.median(f for _, f in samples)


def first_touch_per_byte_s(nbytes: int = _FIRST_TOUCH_BYTES) -> float:
    """Thread CPU seconds per byte of writing ``nbytes`` of fresh anonymous memory for the first time and releasing
    it, beyond writing the same memory again (`PipelineActionCost.first_touch_per_byte_s`): one private anonymous
    mapping (`mmap`, 4 KiB pages: transparent huge pages are `madvise`-only by default, and nothing here asks for
    them), filled twice and unmapped; (first fill + unmap - second fill) / nbytes, >= 0. What a pipeline rank pays
    for activation memory beyond the heap its allocator kept from the previous step (round 22: gpipe faulted 7-14
    thousand pages per rank and step at full size, 1f1b none). Measured on this machine (r23d,
    `/tmp/r23d/first_touch.py`, 64 MiB, 10 rounds, three runs at load 24): 0.443 / 0.453 / 0.465 ns per byte, i.e.
    1.8-1.9 us per page (`CPU_PIPELINE_ACTION`'s figure).

    Raises:
        ValueError: nbytes < one page.
    """
    import mmap
    if nbytes < mmap.PAGESIZE:
        raise ValueError(f"first_touch_per_byte_s: nbytes={nbytes} must be at least one page ({mmap.PAGESIZE} B)")
    start = time.thread_time()
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    data = torch.frombuffer(region, dtype=torch.uint8)
    data.fill_(1)
    first = time.thread_time()
    data.fill_(2)
    again = time.thread_time()
    del data
    region.close()
    released = time.thread_time()
    return max(0.0, ((first - start) + (released - again) - (again - first)) / nbytes)


def _bare_ops(repeats: int) -> dict[str, list[float]]:
    """Per-thread CPU seconds of the stage's op alone: forward, full backward, input-only, weight-only
    (``repeats`` samples of each after 2 warm-up ones)."""
    lin = torch.nn.Linear(_WIDTH, _WIDTH)
    out: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats + 2):
        x = torch.randn(1, _WIDTH, requires_grad=True)
        start = time.thread_time()
        y = lin(x)
        out["F"].append(time.thread_time() - start)
        g = torch.ones_like(y)
        start = time.thread_time()
        torch.autograd.backward(y, g, retain_graph=True)
        out["B"].append(time.thread_time() - start)
        start = time.thread_time()
        torch.autograd.grad(y, x, g, retain_graph=True)
        out["I"].append(time.thread_time() - start)
        start = time.thread_time()
        torch.autograd.grad(y, list(lin.parameters()), g)
        out["W"].append(time.thread_time() - start)
    return {k: v[2:] for k, v in out.items()}


def measure_pipeline_action_samples(steps: int = 10, timeout_s: float = 300.0) -> dict:
    """The raw samples of :func:`measure_pipeline_actions` (round 21: :mod:`cost_model.passes` pools several passes of
    them): ``{"samples": {kind: [seconds]}, "bare": {kind: [seconds]}}`` of both ranks, ``steps`` steps after 2
    warm-up steps, in fresh processes; :func:`action_cost_from_samples` turns them into the costs.

    Raises:
        RuntimeError: a worker failed or no result arrived within ``timeout_s``; names the rank.
    """
    return _run_spawned(_worker, 2, (_free_port(), steps, timeout_s), timeout_s + 30, "pipeline action calibration")


def measure_own_runner() -> PipelineActionCost | None:
    """The package's own runner's costs from its registered benchmark (:func:`register_own_runner_benchmark`), or
    None when none is registered (BitPipe is then priced at torch's costs)."""
    bench = _OWN_RUNNER_BENCHMARK[0]
    return None if bench is None else bench()


def measure_pipeline_actions(steps: int = 10, timeout_s: float = 300.0, own_runner: bool = False) -> PipelineActionCost:
    """Measure :class:`PipelineActionCost` on this machine (module docstring), ~10-20 s on 2 cores; with
    ``own_runner`` and a registered benchmark (:func:`register_own_runner_benchmark`) also the package's own
    runner's costs, as ``own_runner`` (~20-40 s more).

    Raises:
        RuntimeError: a worker failed or no result arrived within ``timeout_s``; names the rank.
    """
    got = measure_pipeline_action_samples(steps, timeout_s)
    cost = action_cost_from_samples(got["samples"], got["bare"])
    own = measure_own_runner() if own_runner else None
    return cost if own is None else dataclasses.replace(cost, own_runner=own)
