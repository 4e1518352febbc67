"""Event timeline of a pipeline schedule, for drawing (Gantt charts) and for checking the closed forms.

`timeline(schedule, fwd_s, bwd_s, m)` simulates one step of GPipe or 1F1B with one stage per rank:
each rank runs its operations in the schedule's order, an operation starts when the rank is free and its
dependency has finished (forward of microbatch i on stage s needs stage s-1's forward of i; backward needs
stage s+1's backward of i, or the last stage's own forward), and point-to-point transfers are free.
Orders (Huang et al. 2019, GPipe; Narayanan et al. 2021, 1F1B): GPipe runs all m forwards, then all
backwards; 1F1B runs min(p - s - 1, m) warm-up forwards on stage s, then alternates one forward and one
backward, then drains the backwards. With equal stage times F, B the makespan is (m + p - 1)(F + B) for
both (tested), and the bubble is (p - 1)(F + B).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: on pipeline rank `stage`, kind "F" or "B" of `microbatch`, from start_s to end_s."""

    stage: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float


def _order(schedule: str, p: int, m: int, s: int) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule == "1f1b":
        warm = min(p - s - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        return order + [("B", i) for i in range(m - warm, m)]
    raise ValueError(f"timeline simulates 'gpipe' and '1f1b', not {schedule!r}")


def timeline(schedule: str, fwd_s: list[float], bwd_s: list[float], m: int) -> list[Op]:
    """Operations of one step, per stage in time order.

    Args:
        schedule: "gpipe" or "1f1b".
        fwd_s, bwd_s: per-stage seconds of one microbatch's forward and backward (len = pipeline depth p).
        m: microbatches (>= 1).
    Raises:
        ValueError: another schedule, m < 1, or fwd_s and bwd_s of different lengths.
    """
    p = len(fwd_s)
    if m < 1 or p < 1 or len(bwd_s) != p:
        raise ValueError(f"timeline needs m >= 1 and equal-length stage times, got m={m}, {len(fwd_s)} forward "
                         f"and {len(bwd_s)} backward times")
    orders = [_order(schedule, p, m, s) for s in range(p)]
    done: dict[tuple[int, str, int], float] = {}
    free = [0.0] * p
    position = [0] * p
    ops: list[Op] = []
    while len(ops) < 2 * p * m:
        progressed = False
        for s in range(p):
            if position[s] == len(orders[s]):
                continue
            kind, i = orders[s][position[s]]
            dep = (s - 1, "F", i) if kind == "F" else ((s + 1, "B", i) if s < p - 1 else (s, "F", i))
            if kind == "F" and s == 0:
                ready = 0.0
            elif dep in done:
                ready = done[dep]
            else:
                continue
            start = max(free[s], ready)
            end = start + (fwd_s[s] if kind == "F" else bwd_s[s])
            done[(s, kind, i)], free[s] = end, end
            ops.append(Op(s, kind, i, start, end))
            position[s] += 1
            progressed = True
        if not progressed:  # cannot happen for these orders; guards against an infinite loop
            raise RuntimeError(f"schedule {schedule} deadlocked at positions {position}")
    return sorted(ops, key=lambda o: (o.stage, o.start_s))


def makespan_s(ops: list[Op]) -> float:
    """End of the last operation (seconds)."""
    return max(o.end_s for o in ops)
