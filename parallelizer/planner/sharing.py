"""Ranks that share one machine's cores: the processor-sharing timing pass of `planner.simulate`.

On a GPU cluster every pipeline rank has its own device, so an action costs the same whatever the other
ranks do (`planner.simulate`'s default pass). On one CPU machine R gloo ranks share C cores: while k ranks
compute at once, each runs `SharedCores.factor(k)` times slower than alone, and a rank that waits (for a
transfer, or at the end of its list) leaves the cores to the others. That is processor sharing (Kleinrock
1967, "Time-shared systems: a theoretical model"; Harchol-Balter 2013, "Performance Modeling and Design of
Computer Systems", Ch. 22): each running job progresses at rate 1 / factor(k) solo-seconds per second, and
the rate changes whenever a job starts or ends.

`SharedCores.measured` builds the factors from a calibration profile's contention measurements
(`cost_model.calibrate.Profile.contention`: the slowdown of each of k processes computing at once, for the
calibrated k), `SharedCores.ideal` from a core count alone (factor(k) = max(1, k / C)). With
factor(k) = 1 for every k <= R (at least as many cores as ranks) the pass gives the default pass's times.

Jobs: a rank's compute actions in its list order (solo seconds `dur`), then, optionally, its optimizer step
(solo seconds, its own slowdown curve `SharedCores.optimizer`), which starts after the rank's last action and
its gradient sync (a wait, not compute). Transfers and syncs are waits that use no core: a gloo rank
blocked in `recv` sleeps (measured here: 5 ms of CPU time over a 3 s wait). What a transfer does cost the
cores is charged to the actions as CPU work (round 18): gloo's own threads' CPU per P2P op
(`PipelineActionCost.comm_thread_s`, ~0.3 ms per op measured) and BitPipe's packing of its twin exchange
(`StageTimes.copy_pack_s`); since round 19 also their CPU per byte of each transfer and of BitPipe's exchange
(`PipelineActionCost.comm_thread_per_byte_s`, ~0.2 ns per byte at each end measured) and torch's split backward's
walks of the stage's autograd graph (`split_backward_per_node_s`, ~24 us per node); since round 20 per P2P op
(one per tensor of a transfer, `StageTimes.p2p_ops`). What BitPipe's runner still spends beyond these (round 20,
full size, 4 ranks: gloo's threads 362 ms per step against 181 priced, its exchange's copies on the main thread
175 against 73; benchmarks/RESULTS.md) is not priced.

Cost: one event per job start or end, O(p) work each: O((N + p) p) for N actions, fine for the few-rank
machines it models (the planner's GPU presets never take this path).

The pipeline search (`planner.search`) takes this path when its cluster carries a
`cost_model.topology.CoreSharing` (a calibration profile's cluster, `Profile.cluster`): `pipeline_cores`
turns its measured points into the factors of the simulated pipeline ranks, each of which stands for
dp x tp processes computing in lockstep.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cost_model.topology import CoreSharing

from ..errors import PipelineError

_EPS = 1e-12  # relative: a job whose remaining solo seconds fall below EPS x its length is done


@dataclass(frozen=True)
class SharedCores:
    """Per-rank slowdown of k ranks computing at once on one machine (module docstring).

    Attributes:
        factors: factors[k - 1] for k = 1..R concurrent ranks; >= 1, factors[0] == 1 (dimensionless).
        optimizer: the same for optimizer steps (default: `factors`).

    Raises (construction):
        PipelineError: empty, factors[0] != 1, or a factor < 1 or not finite.
    """

    factors: tuple[float, ...]
    optimizer: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name, f in (("factors", self.factors), ("optimizer", self.optimizer)):
            if f is None:
                continue
            if not f or f[0] != 1.0 or any(not np.isfinite(x) or x < 1.0 for x in f):
                raise PipelineError(f"SharedCores.{name}={f}: need factor(1) == 1 and finite factors >= 1 "
                                    "(slowdown of k concurrent ranks, k = 1..R)")

    @staticmethod
    def ideal(cores: int, ranks: int) -> "SharedCores":
        """R = `ranks` ranks on `cores` cores with perfect sharing: factor(k) = max(1, k / cores).

        Raises:
            PipelineError: cores or ranks < 1.
        """
        if cores < 1 or ranks < 1:
            raise PipelineError(f"SharedCores.ideal(cores={cores}, ranks={ranks}): need both >= 1")
        return SharedCores(tuple(max(1.0, k / cores) for k in range(1, ranks + 1)))

    @staticmethod
    def measured(slowdown: Mapping[int, float], ranks: int,
                 optimizer_slowdown: Mapping[int, float] | None = None) -> "SharedCores":
        """Factors for k = 1..`ranks` from measured slowdowns {k: factor} (`Profile.contention`, e.g. its
        matmul column): piecewise linear in k through (1, 1) and the measured points; above the largest
        measured count K, factor(K) * k / K (the cores are already shared: the load grows with k). Each factor
        is clamped at >= 1 (a measured "speed-up" is noise).

        Raises:
            PipelineError: ranks < 1, or a measured count < 1 / factor not finite.
        """
        def curve(points: Mapping[int, float]) -> tuple[float, ...]:
            if any(k < 1 or not np.isfinite(v) for k, v in points.items()):
                raise PipelineError(f"SharedCores.measured: slowdowns {dict(points)}: need counts >= 1, finite")
            pts = {1: 1.0, **{int(k): float(v) for k, v in points.items() if k != 1}}
            ks = sorted(pts)
            out = []
            for k in range(1, ranks + 1):
                f = (float(np.interp(k, ks, [pts[j] for j in ks])) if k <= ks[-1]
                     else pts[ks[-1]] * k / ks[-1])
                out.append(max(1.0, f))
            out[0] = 1.0
            return tuple(out)
        if ranks < 1:
            raise PipelineError(f"SharedCores.measured: ranks={ranks}; need >= 1")
        return SharedCores(curve(slowdown), None if optimizer_slowdown is None else curve(optimizer_slowdown))

    def factor(self, k: int, optimizer: bool = False) -> float:
        """Slowdown of each of k concurrent ranks (k > R: extrapolated k / R x factor(R))."""
        f = self.optimizer if optimizer and self.optimizer is not None else self.factors
        return f[k - 1] if k <= len(f) else f[-1] * k / len(f)


def cpu_floor_s(work_s: np.ndarray, cores: SharedCores) -> float:
    """A lower bound on the step of ranks that share the cores, from their total CPU work (round 21): processor
    sharing of k computing ranks progresses at most k / factor(k) solo-seconds per second, so no schedule runs
    the ranks' work in less than ::

        floor_s = sum(work_s) / max_{k = 1..R} (k / factor(k))          # R = len(work_s) ranks

    (ideal sharing of C cores by ranks of one process each, factor(k) = max(1, k / C): sum / min(R, C), the
    ranks' total CPU over the cores). `work_s`: per rank, solo seconds of ALL its CPU work: its actions, its
    optimizer step, and what a timeline holds as waits although it takes a core (gloo's threads during a dp
    sync; `StageTimes.host_cpu_s`). The processor-sharing pass keeps the bound for the work it simulates; the
    work it holds as waits is what the bound adds (`planner.simulate`, `SimResult.cpu_floor_s`).

    Raises:
        PipelineError: a negative or non-finite work.
    """
    work = np.asarray(work_s, dtype=float)
    if (~np.isfinite(work)).any() or (work < 0).any():
        raise PipelineError(f"cpu_floor_s: per-rank work {work.tolist()} s: need finite seconds >= 0")
    rate = max(k / cores.factor(k) for k in range(1, len(work) + 1)) if len(work) else 1.0
    return float(work.sum()) / rate


def pipeline_cores(sharing: CoreSharing, pp: int, dp: int, tp: int) -> tuple[SharedCores, float]:
    """The machine as `simulate(..., cores=)` sees pp pipeline ranks of a pp x dp x tp mesh whose processes
    share its cores, and the factor that turns the cluster device's prices into the simulation's durations.

    While k pipeline ranks compute at once, k x dp x tp processes do (a stage's dp x tp processes run the same
    schedule in lockstep), each slowed by the measured real factor F(k dp tp) (`SharedCores.measured` over
    the cluster's pp dp tp processes from `sharing.compute_slowdown` / `optimizer_slowdown`). The cluster's
    device prices every action at F(n), n = pp dp tp (`sharing.applied_compute`), so an action priced c
    takes c / F(n) seconds alone and c F(k dp tp) / F(n) among k computing pipeline ranks. With durations
    c x scale, scale = F(dp tp) / F(n), the factors are F(k dp tp) / F(dp tp) (1 for k = 1, as
    `SharedCores` needs; processor sharing only sees rates, so the split is exact); each is clamped at >= 1
    (a measured curve that dips is noise).

    Returns:
        (cores: `SharedCores` for k = 1..pp, scale: dimensionless, > 0). With pp = 1 the one rank always runs
        with all n processes: scale = F(n) / applied_compute (1 when the device was slowed by the same curve).
    Raises:
        PipelineError: pp, dp or tp < 1 (`SharedCores.measured`).
    """
    if min(pp, dp, tp) < 1:
        raise PipelineError(f"pipeline_cores(pp={pp}, dp={dp}, tp={tp}): need each >= 1")
    width = dp * tp
    opt = dict(sharing.optimizer_slowdown) or None
    real = SharedCores.measured(dict(sharing.compute_slowdown), pp * width, opt)

    def curve(optimizer: bool) -> tuple[float, ...]:
        base = real.factor(width, optimizer)
        return (1.0,) + tuple(max(1.0, real.factor(k * width, optimizer) / base) for k in range(2, pp + 1))
    cores = SharedCores(curve(False), curve(True) if opt else None)
    return cores, real.factor(width) / sharing.applied_compute


def shared_pass(by_rank, pred: np.ndarray, dur: np.ndarray, delay: np.ndarray, tail_wait: np.ndarray,
                tail_s: np.ndarray | None, cores: SharedCores, start_s: float = 0.0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Processor-sharing event simulation (module docstring) of a compiled schedule.

    Args:
        by_rank: per rank, its action nodes in run order (arrays of node ids 0..N-1).
        pred: (N, 3) node ids an action waits for (N = none); the second one's end plus `delay[n]`.
        dur: (N,) solo seconds per action; delay: (N,) transfer seconds on pred[:, 1].
        tail_wait: (p,) seconds each rank waits after its last action (its gradient sync) before its tail.
        tail_s: (p,) solo seconds of each rank's optimizer step, or None (no tail).
        start_s: when the first actions may start (the step's set-up, `planner.simulate`'s step_s).
    Returns:
        (starts (N,), ends (N,), finish (p,)): seconds; finish = each rank's last action end + tail_wait
        (+ its optimizer step).
    Raises:
        PipelineError: the jobs cannot all run (a dependency cycle; `_compile` rejects those first).
    """
    N, p = len(dur), len(by_rank)
    end = np.full(N + 1, np.inf)
    end[N] = start_s
    start = np.zeros(N)
    finish = np.zeros(p)
    lists = [list(map(int, r)) for r in by_rank]
    pos = [0] * p
    running: dict[int, list] = {}   # rank -> [node (-1: tail), remaining solo s, length, is optimizer]
    ready: dict[int, float] = {}    # rank -> time its next job may start (dependencies done)
    done = [False] * p
    now = 0.0

    def refresh(r: int) -> None:
        if r in running or r in ready or done[r]:
            return
        if pos[r] < len(lists[r]):
            n = lists[r][pos[r]]
            a, b, c = pred[n]
            if end[a] < np.inf and end[b] < np.inf and end[c] < np.inf:
                ready[r] = max(end[a], end[b] + delay[n], end[c])
        else:
            last = end[lists[r][-1]] if lists[r] else 0.0
            ready[r] = last + tail_wait[r]

    while True:
        for r in range(p):
            refresh(r)
        for r in [r for r, t in ready.items() if t <= now]:
            del ready[r]
            if pos[r] < len(lists[r]):
                n = lists[r][pos[r]]
                start[n] = now
                running[r] = [n, float(dur[n]), float(dur[n]), False]
            elif tail_s is not None and tail_s[r] > 0:
                running[r] = [-1, float(tail_s[r]), float(tail_s[r]), True]
            else:
                finish[r], done[r] = now, True
        if not running:
            if all(done):
                break
            if not ready:
                stuck = [r for r in range(p) if not done[r]]
                raise PipelineError(f"shared-core simulation: ranks {stuck} wait forever (a dependency cycle)")
            now = min(ready.values())
            continue
        k = len(running)
        rate = {r: 1.0 / cores.factor(k, job[3]) for r, job in running.items()}
        t_next = min(now + job[1] / rate[r] for r, job in running.items())
        if ready:
            t_next = min(t_next, min(ready.values()))
        dt = t_next - now
        now = t_next
        for r, job in list(running.items()):
            job[1] -= rate[r] * dt
            if job[1] <= _EPS * max(job[2], 1e-30):
                del running[r]
                if job[0] >= 0:
                    end[job[0]] = now
                    pos[r] += 1
                else:
                    finish[r], done[r] = now, True
    return start, end[:N], finish
