"""The calibration's passes (round 21, issue 13): every quantity's rounds spread over the whole calibration.

Why. Two idle calibrations minutes apart differ by more than each run's own rounds predict, because the machine's
state (a VM: hypervisor steal, clock, outside load) lasts about one block of measurements (tens of seconds) and moves
every quantity of that block together. Round 20 spread the collectives over passes (:func:`cost_model.rounds.
pool_passes`); the quantities still measured in one block were then the largest movers of the lead's idle pair
(benchmarks/RESULTS.md, round 20 lead, 2026-12-04 03:27-03:33): pipeline actions forward -29%, backward -27%,
send / recv -22%, gloo's per-byte thread CPU -50%, against a split-half prediction of 6-7%.

What a pass is (:func:`run_passes`): the collectives of every process count (``ceil(repeats / passes)`` rounds, fresh
processes), then the device's share of its rounds (:func:`cost_model.device_rounds.measure_device_rounds`), the
pipeline actions' share of their steps (fresh processes, :func:`cost_model.pipeline_actions.
measure_pipeline_action_samples`) and the contention's share of its windows (fresh processes,
:func:`cost_model.contention.measure_contention`); shares as even as possible (:func:`share`: 5 device rounds over 3
passes are 2, 2, 1). The last pass alone measures comm_overlap and sync (as in round 20), the middle one the own
runner's benchmark (~20-40 s, it traces a model: once, to keep ``--quick`` cheap). Each quantity is then the median of
its pooled rounds (:func:`pool_all`; the contention factor the median over passes of each pass's factor).

The per-pass reference. Before every block of a pass the calibrating process times one fp32 512 x 512 matmul
(:func:`cost_model.device_rounds.reference_flops_per_s`, ~30 ms); the pass's reference is the median of its readings.
A pass whose reference is more than :data:`cost_model.rounds.PASS_REFERENCE_TOLERANCE` (10%) off the median pass's,
while the other passes are a strict majority (:func:`cost_model.rounds.deviating_passes`), ran in another machine
state: its samples are left out of every quantity's pool (weight 0), ``measurements["passes_dropped"]`` names it and a
warning says so (never silently). Dropping, not re-measuring: a fresh pass costs a third of the calibration and the
state that slowed it may last; with 3 passes one pass shifted by a factor s moves a pooled median of 3 x 7 rounds by
up to the 75th percentile of the other 14 rounds' spread, and dropping it removes that (tests/unit/
test_calibration_passes.py). When no majority agrees (the state moved throughout) nothing is dropped and a warning says
to calibrate on an idle machine. Each pass also records the hypervisor's steal share of all CPU time over the pass
(``/proc/stat``'s first line, 8th field; :func:`steal_fraction`): recorded for the reader, not used to decide.
"""
from __future__ import annotations

import statistics
import warnings
from typing import Callable, Sequence

from cost_model.device_rounds import measure_device_rounds, reference_flops_per_s
from cost_model.host_cost import HostPrograms
from cost_model.contention import measure_contention
from cost_model.measure import measure_collectives
from cost_model.pipeline_actions import action_cost_from_samples, measure_own_runner, measure_pipeline_action_samples
from cost_model.rounds import PASS_REFERENCE_TOLERANCE, deviating_passes, pool_passes, pool_rounds

__all__ = ["share", "steal_fraction", "run_passes", "pool_all"]

_CONTENTION_KERNELS = ("matmul", "memory", "optimizer")


def share(total: int, passes: int) -> list[int]:
    """``total`` rounds over ``passes`` passes as evenly as possible, the earlier passes taking the remainder:
    ``share(5, 3) == [2, 2, 1]``, ``share(1, 3) == [1, 0, 0]``.

    Raises:
        ValueError: ``total`` < 0 or ``passes`` < 1.
    """
    if total < 0 or passes < 1:
        raise ValueError(f"share(total={total}, passes={passes}): need total >= 0 and passes >= 1")
    return [total // passes + (i < total % passes) for i in range(passes)]


def _cpu_jiffies(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total) jiffies of the machine since boot from ``path``'s first line (proc(5): user nice system idle
    iowait irq softirq steal ...); None where it cannot be read (not Linux)."""
    try:
        with open(path) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The hypervisor's share of all CPU time between two ``(steal, total)`` jiffy readings; None without both."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def run_passes(nprocs: Sequence[int], kinds: Sequence[str], sizes_bytes: Sequence[int], *, passes: int,
               rounds_per_pass: int, large_per_pass: int, device_rounds: int, matmul_sizes: Sequence[int],
               memory_numel: int, pipeline_steps: int, pipeline_actions: bool, own_runner: bool,
               contention_rounds: int, contention: bool,
               step: Callable[[str], None] = lambda label: None) -> list[dict]:
    """Measure ``passes`` passes (module docstring), in time order. Call inside
    :func:`cost_model.device_rounds.calibration_threads`.

    Returns:
        Per pass ``{"references": [FLOP/s before each block], "steal": fraction or None, "collectives": {n: result of
        measure_collectives}, "device": {key: [rounds]} (empty where the pass has no device round), "pipeline":
        {"samples", "bare"} or None, "own_runner": PipelineActionCost or None, "contention": {k: factors} or None}``.

    Raises:
        RuntimeError: a measuring process failed (the measuring functions name it).
    """
    device_share, step_share = share(device_rounds, passes), share(pipeline_steps, passes)
    contention_share = share(contention_rounds, passes)
    host = HostPrograms.build() if device_rounds else None  # exported once, measured in every pass's device rounds
    records = []
    for p in range(passes):
        label = f"pass {p + 1}/{passes}"
        rec: dict = {"references": [], "collectives": {}, "device": {}, "pipeline": None, "own_runner": None,
                     "contention": None}
        before = _cpu_jiffies()

        def block(what: str) -> None:
            step(f"{what} ({label})")
            rec["references"].append(reference_flops_per_s())
        for n in nprocs:
            block(f"gloo x{n}")
            rec["collectives"][n] = measure_collectives(n, kinds, sizes_bytes, rounds_per_pass,
                                                        large_repeats=large_per_pass, extras=p == passes - 1)
        if device_share[p]:
            block("device")
            rec["device"] = measure_device_rounds(matmul_sizes, memory_numel, device_share[p], host)
        if pipeline_actions and step_share[p]:
            block("pipeline actions")
            rec["pipeline"] = measure_pipeline_action_samples(step_share[p])
            if own_runner and p == passes // 2:
                rec["own_runner"] = measure_own_runner()
        if contention and contention_share[p]:
            block("contention")
            rec["contention"] = measure_contention(tuple(nprocs), rounds=contention_share[p])
        rec["steal"] = steal_fraction(before, _cpu_jiffies())
        records.append(rec)
    return records


def pool_all(records: Sequence[dict], nprocs: Sequence[int], tolerance: float = PASS_REFERENCE_TOLERANCE) -> dict:
    """Pool :func:`run_passes`' records (module docstring): leave out the passes whose reference deviates
    (:func:`cost_model.rounds.deviating_passes`, with a warning), then per quantity the median of the kept rounds.

    Returns:
        ``{"references": per pass median FLOP/s, "steal": per pass, "dropped": 0-based indices, "collectives": {n:
        pool_passes result}, "device": pool_rounds result, "pipeline": (PipelineActionCost, pass_half by kind,
        split_half by kind) or None, "own_runner": cost or None, "contention": {k: factors}, "contention_pass_half": {key: h}}``.

    Raises:
        ValueError: no records, or a pass without reference readings.
    """
    if not records or any(not r["references"] for r in records):
        raise ValueError(f"pool_all: need >= 1 pass, each with >= 1 reference reading; got {len(records)} passes")
    refs = [statistics.median(r["references"]) for r in records]
    dropped = deviating_passes(refs, tolerance)
    middle = statistics.median(refs)
    for i in dropped:
        warnings.warn(f"calibration pass {i + 1} of {len(records)} ran in another machine state: its reference matmul "
                      f"ran at {refs[i] / 1e9:.1f} GFLOP/s, {refs[i] / middle - 1:+.0%} off the passes' median "
                      f"{middle / 1e9:.1f} (tolerance {tolerance:.0%}; hypervisor steal over the pass "
                      f"{_percent(records[i]['steal'])}); its samples are left out of every quantity's median "
                      "(measurements['passes_dropped']). Remedy: if this recurs, calibrate on an idle machine",
                      stacklevel=2)
    off = [i for i, r in enumerate(refs) if abs(r / middle - 1) > tolerance]
    if off and not dropped:
        warnings.warn(f"calibration passes {[i + 1 for i in off]} of {len(records)} ran {tolerance:.0%} or more off the "
                      f"median reference matmul ({[round(r / 1e9, 1) for r in refs]} GFLOP/s) and no majority of passes "
                      "agrees, so none is left out: the machine's speed moved throughout this calibration. Remedy: "
                      "calibrate again on an idle machine (nothing else running)", stacklevel=2)
    kept = [i for i in range(len(records)) if i not in dropped]
    out: dict = {"references": refs, "steal": [r["steal"] for r in records], "dropped": dropped, "collectives": {}}
    for n in nprocs:
        got = pool_passes([records[i]["collectives"][n] for i in kept])
        extras = [r["collectives"][n] for r in records if r["collectives"][n].get("comm_overlap") is not None]
        if extras and got["comm_overlap"] is None:  # only a dropped pass measured them: nothing else prices them
            warnings.warn(f"x{n} comm_overlap and sync come from a dropped pass (the only one that measures them)",
                          stacklevel=2)
            got["comm_overlap"], got["sync_s"] = extras[-1]["comm_overlap"], extras[-1]["sync_s"]
            got["sync_exit_spread_s"] = extras[-1].get("sync_exit_spread_s")
        out["collectives"][n] = got
    out["device"] = pool_rounds([r["device"] for r in records], dropped)
    pipes = [r["pipeline"] or {"samples": {}, "bare": {}} for r in records]
    out["pipeline"] = None
    if any(r["pipeline"] for r in records):
        samples = pool_rounds([p["samples"] for p in pipes], dropped)
        bare = pool_rounds([p["bare"] for p in pipes], dropped)["samples"]
        out["pipeline"] = (action_cost_from_samples(samples["samples"], bare), samples["pass_half"],
                           samples["split_half"])
    owns = [(i, r["own_runner"]) for i, r in enumerate(records) if r["own_runner"] is not None]
    out["own_runner"] = owns[0][1] if owns else None
    if owns and owns[0][0] in dropped:
        warnings.warn(f"the own runner's pipeline costs come from dropped pass {owns[0][0] + 1} (the only one that "
                      "measures them)", stacklevel=2)
    per_pass = [{f"x{k} {what}": [f] for k, fs in (r["contention"] or {}).items() for what, f in
                 zip(_CONTENTION_KERNELS, fs)} for r in records]
    pooled = pool_rounds(per_pass, dropped)
    first = next((r["contention"] for r in records if r["contention"]), None) or {}
    out["contention"] = {k: tuple(pooled["median"][f"x{k} {what}"] for what in _CONTENTION_KERNELS[:len(fs)])
                         for k, fs in first.items()}
    out["contention_pass_half"] = pooled["pass_half"]
    return out


def _percent(fraction: float | None) -> str:
    return "not readable" if fraction is None else f"{fraction:.1%}"
