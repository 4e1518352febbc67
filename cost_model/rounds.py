"""Statistics of a measurement repeated in rounds and passes (calibration, round 19-20): the median of pooled rounds,
and the split-half / pass-half differences that predict, from inside one calibration, how far a second one will
land (`cost_model.calibrate`, `trial/r17f_calibrate_twice.sh`). Pure functions of the samples; the measuring
itself is `cost_model.measure`, which re-exports these names.
"""
from __future__ import annotations

import statistics
from typing import Collection, Mapping, Sequence

__all__ = ["deviating_passes", "exit_spread_s", "pass_half_difference", "pool_passes", "pool_rounds", "split_half_difference",
           "PASS_REFERENCE_TOLERANCE"]

# Round 21: a pass whose reference rate (cost_model.passes.reference_flops_per_s) is more than this fraction off the
# median pass's is measured in another machine state (hypervisor steal, throttling, outside load): issue 13 asks two
# calibrations to agree within 10%, and a pass 10% slower moves every quantity it measured by about that much.
PASS_REFERENCE_TOLERANCE = 0.10
# Halves below this (seconds, or seconds per byte) around a median of 0 are one quantity clamped at 0, not a spread.
NEGLIGIBLE = 1e-9


def split_half_difference(samples: Sequence[float]) -> float:
    """The spread of a median-of-rounds estimate predicted from inside one run: ``|median(odd rounds) -
    median(even rounds)| / median(all)`` of ``samples`` in round order (round 1 first). Each half is an estimate
    from half the rounds, so two calibrations of the same state differ by about this much / sqrt(2) (the
    difference of two full-run medians has half the variance of the difference of two half-run medians); a
    between-calibration difference far above it is a change of state between the runs (process, machine), not
    sampling noise. 0.0 with fewer than 2 samples.

    Raises:
        ValueError: a sample is negative or not finite, or the median is 0 with differing halves.
    """
    xs = [float(x) for x in samples]
    if any(not (x >= 0 and x < float("inf")) for x in xs):
        raise ValueError(f"split_half_difference: samples must be finite and >= 0, got {xs}")
    if len(xs) < 2:
        return 0.0
    odd, even = statistics.median(xs[0::2]), statistics.median(xs[1::2])
    whole = statistics.median(xs)
    if odd == even or (whole == 0 and max(odd, even) < NEGLIGIBLE):  # a fit clamped at 0 (1.5e-12 seen)
        return 0.0
    if whole == 0:
        raise ValueError(f"split_half_difference: median 0 with halves {odd} and {even}")
    return abs(odd - even) / whole


def pool_passes(passes: Sequence[Mapping]) -> dict:
    """One result of :func:`measure_collectives` from several passes of it, in time order (the same process count;
    round 20): the samples of every pass pooled (concatenated in time order), each (kind, size) the median of the
    pool, ``split_half`` the split-half difference of the pool in round order, ``pass_half``
    (:func:`pass_half_difference`) the same statistic between the odd and the even passes, ``collective_cpu`` the
    median over passes of each pass's CPU per call, ``comm_overlap``, ``sync_s`` and ``sync_exit_spread_s`` (recorded,
    not priced) from the pass that measured them (the last one that did).

    Why passes: two idle calibrations minutes apart moved a whole process count's collectives together (round 19,
    /tmp/r19/cal: every x4 collective +12% .. +34%, their process CPU per call +11% .. +26%, while most x2 ones moved
    -5% .. -49%), more than each run's own rounds predicted (split-half / sqrt 2: 6%): a machine state lasting about
    as long as one block of measurements. Spread over passes separated by the calibration's other measurements,
    each quantity's median pools several such states instead of one.

    Raises:
        ValueError: no passes, or passes that measured different (kind, size) pairs.
    """
    if not passes:
        raise ValueError("pool_passes: need >= 1 pass")
    pairs = [{(k, n) for k, by in p["samples"].items() for n in by} for p in passes]
    if any(got != pairs[0] for got in pairs[1:]):
        raise ValueError(f"pool_passes: the passes measured different (kind, size) pairs: {pairs}")
    kinds = list(passes[0]["samples"])
    out: dict = {"collectives": {k: {} for k in kinds}, "split_half": {k: {} for k in kinds},
                 "pass_half": {k: {} for k in kinds}, "samples": {k: {} for k in kinds},
                 "collective_cpu": {k: {} for k in kinds}, "passes": len(passes)}
    for kind, nbytes in sorted(pairs[0]):
        per_pass = [list(p["samples"][kind][nbytes]) for p in passes]
        pooled = [x for got in per_pass for x in got]
        out["samples"][kind][nbytes] = pooled
        out["collectives"][kind][nbytes] = statistics.median(pooled)
        out["split_half"][kind][nbytes] = split_half_difference(pooled)
        out["pass_half"][kind][nbytes] = pass_half_difference(per_pass)
        cpus = [p["collective_cpu"].get(kind, {}).get(nbytes) for p in passes]
        cpus = [c for c in cpus if c is not None]
        if cpus:
            out["collective_cpu"][kind][nbytes] = statistics.median(cpus)
    extras = [p for p in passes if p.get("comm_overlap") is not None]
    out["comm_overlap"] = extras[-1]["comm_overlap"] if extras else None
    out["sync_s"] = extras[-1]["sync_s"] if extras else None
    out["sync_exit_spread_s"] = extras[-1].get("sync_exit_spread_s") if extras else None
    return out


def pass_half_difference(per_pass: Sequence[Sequence[float]]) -> float:
    """``|median(samples of passes 1, 3, ...) - median(samples of passes 2, 4, ...)| / median(all)``: the split-half
    difference (:func:`split_half_difference`) with passes in place of rounds, so it sees a state of the machine
    that lasts a pass (tens of seconds) where the round-level one cannot. 0.0 with fewer than 2 passes.

    Raises:
        ValueError: as :func:`split_half_difference`; or a pass without samples.
    """
    if any(len(got) == 0 for got in per_pass):
        raise ValueError(f"pass_half_difference: every pass needs >= 1 sample, got {[len(g) for g in per_pass]}")
    if len(per_pass) < 2:
        return 0.0
    odd = [x for got in per_pass[0::2] for x in got]
    even = [x for got in per_pass[1::2] for x in got]
    xs = [*odd, *even]
    split_half_difference(xs)  # the same validation of the samples
    a, b, whole = statistics.median(odd), statistics.median(even), statistics.median(xs)
    return 0.0 if a == b else abs(a - b) / whole


def deviating_passes(references: Sequence[float], tolerance: float = PASS_REFERENCE_TOLERANCE) -> tuple[int, ...]:
    """Indices (0-based) of the passes whose reference rate is more than ``tolerance`` off the median of all passes'
    (``|r_i / median(r) - 1| > tolerance``), provided the others are a strict majority; ``()`` when fewer than 3
    passes or when no majority agrees (then no pass is the odd one out: the machine state moved throughout, which
    :func:`cost_model.passes.pool_all` warns about instead of dropping).

    Raises:
        ValueError: a reference that is not finite and > 0, or a negative tolerance.
    """
    refs = [float(r) for r in references]
    if any(not (0 < r < float("inf")) for r in refs) or not tolerance >= 0:
        raise ValueError(f"deviating_passes: references must be finite and > 0 and tolerance >= 0, got {refs}, "
                         f"{tolerance}")
    if len(refs) < 3:
        return ()
    middle = statistics.median(refs)
    off = tuple(i for i, r in enumerate(refs) if abs(r / middle - 1) > tolerance)
    return off if len(refs) - len(off) > len(refs) / 2 else ()


def pool_rounds(per_pass: Sequence[Mapping[str, Sequence[float]]], drop: Collection[int] = ()) -> dict:
    """Per key, the rounds of every pass not in ``drop`` pooled in time order (round 21: the device quantities,
    the contention factors): ``{"median": {key: median of the pool}, "split_half": {key: split-half of the pool},
    "pass_half": {key: pass-half over the kept passes that measured the key, None if fewer than 2 did (no
    prediction: 0 would read as perfect agreement)}, "samples": {key: pool},
    "kept": {key: pass indices pooled}}``. A key that only dropped passes measured keeps those passes' rounds (there is
    nothing else to price it by): ``kept`` names them, and :func:`cost_model.passes.pool_all` warns.

    Raises:
        ValueError: as :func:`split_half_difference` (a negative or non-finite round).
    """
    keys = list(dict.fromkeys(k for got in per_pass for k in got))
    out: dict = {"median": {}, "split_half": {}, "pass_half": {}, "samples": {}, "kept": {}}
    for key in keys:
        measured = [i for i, got in enumerate(per_pass) if len(got.get(key, ())) > 0]
        kept = [i for i in measured if i not in drop] or measured
        chunks = [[float(x) for x in per_pass[i][key]] for i in kept]
        pooled = [x for c in chunks for x in c]
        out["samples"][key], out["kept"][key] = pooled, kept
        out["median"][key] = statistics.median(pooled)
        out["split_half"][key] = split_half_difference(pooled)
        out["pass_half"][key] = pass_half_difference(chunks) if len(chunks) > 1 else None
    return out


def exit_spread_s(exits_s: Sequence[Sequence[float]]) -> float:
    """``median_c(max_r exits_s[r][c] - min_r exits_s[r][c])``: how far apart the ranks leave the same collective,
    seconds (recorded by calibration as ``measurements.sync_exit_spread_s``, not priced).

    Why (round 23, r23c; measured by ``cost_model.measure._measure_sync``): with more ranks than cores the planner
    charges the calibrated wait only to collectives of a sub-group (:func:`cost_model.communication.collective_wait_s`), reading it as the last rank waiting for a core
    the others' next compute holds AFTER the all-rank collective. Then the ranks' exits lie about the wait apart (the
    first two leave at once, the last one a wait later); if instead every rank left late together, the wait is inside
    the collective and belongs to every collective. Inferred from step data only so far; this records the test.

    Raises:
        ValueError: no calls, or ranks with different numbers of calls.
    """
    calls = {len(e) for e in exits_s}
    if len(calls) != 1 or calls == {0}:
        raise ValueError(f"exit_spread_s: every rank needs the same number (>= 1) of exit stamps, got "
                         f"{sorted(len(e) for e in exits_s)}")
    return statistics.median(max(x[c] for x in exits_s) - min(x[c] for x in exits_s) for c in range(calls.pop()))
