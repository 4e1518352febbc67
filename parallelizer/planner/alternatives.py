"""The pipeline search's report of the schedules it did not pick (`planner.search`): per schedule its best
candidate, simulated, with a one-line reason relative to the winner (step, bubble, peak memory, p2p bytes), or
why it was never priced or was refused. `PipelinePlan.alternatives`, printed by `show`."""
from __future__ import annotations

import dataclasses

from .pipeline import ScheduleAlternative
from .schedules import bubble_fraction

_GB = 1e9


def note(by_schedule: dict, cand, res: dict, exact: bool) -> None:
    """Keep per (schedule, exact) the lowest-priced candidate: its simulated step (exact) or its bound."""
    key, step = (cand.schedule, exact), res["step_s"] if exact else res["step_lb"]
    if key not in by_schedule or (step, cand) < by_schedule[key][:2]:
        by_schedule[key] = (step, cand, res)


def schedule_alternatives(ctx, best: tuple, by_schedule: dict, bounds: list) -> tuple[ScheduleAlternative, ...]:
    """The winner, then for every other searched schedule its runner-up: step, bubble, peak memory, p2p
    bytes and a one-line reason. A runner-up is the schedule's best simulated candidate, or its lowest-bound
    priced one when that bound is lower (simulated here, so every reported step is exact); a schedule never
    priced (each bound above the winner's step, or over memory) is reported with its best bound. A runner-up's
    reason counts the schedule's candidates its bound pruned (round 23 new-user trial, GPT-3-13B on a100:8x8: "vs
    1f1b" showed pp=2 at 15698 ms, +2.6%, while 1f1b on pp=4, pruned, prices 15557 ms when planned alone). `ctx`: the
    search's context (`candidates._Context`: its `exact` simulation and the schedules it `refused`)."""
    out = [alternative(best[1], best[2], None)]
    names = dict.fromkeys(c.schedule for _, c in bounds)
    for name in names:
        if name == best[1].schedule:
            continue
        found = by_schedule.get((name, True))
        bound = by_schedule.get((name, False))
        if bound is not None and (found is None or bound[0] < found[0]):
            res = ctx.exact(bound[1], bound[2])
            if "step_s" in res and (found is None or (res["step_s"], bound[1]) < found[:2]):
                found = (res["step_s"], bound[1], res)
        if found is not None:
            alt = alternative(found[1], found[2], best)
            unseen = sum(1 for lb, c in bounds if c.schedule == name and lb > best[0])
            if unseen:  # pruned by their bounds: each is slower than the winner, maybe not than this runner-up
                alt = dataclasses.replace(alt, reason=(
                    f"the best of its candidates simulated: {unseen} more, bounded above the winner's "
                    f"{best[0]:.4g} s, were not (one may be faster than this); ") + alt.reason)
            out.append(alt)
            continue
        lb, cand = min((lb, c) for lb, c in bounds if c.schedule == name)
        out.append(ScheduleAlternative(name, cand.pp, cand.dp, cand.tp, cand.num_microbatches, None, None, None, None,
                                       unsimulated_reason(lb, best[0])))
    c = best[1]
    out += [ScheduleAlternative(name, c.pp, c.dp, c.tp, c.num_microbatches, None, None, None, None, f"refused: {why}")
            for name, why in ctx.refused.items()]  # left out for the model's semantics, not its price
    return tuple(out)


def unsimulated_reason(lb_s: float, winner_s: float) -> str:
    """Why a schedule with no simulated candidate lost, from its lowest step bound `lb_s` and the winner's
    simulated step `winner_s` (seconds). The bound search (`search._bound_search`) visits candidates in
    increasing bound order and stops at the first bound above the best step, so a candidate whose bound is at
    or under the winner's was priced: it left the search over memory (at pricing or at simulation). One reason,
    the one that holds (round 23 new-user trial: Llama-3-8B's gpipe read 'its lowest bound 0.8129 s is above the
    winner's 1.115 s, or it does not fit memory', a bound below the winner stated as above it)."""
    if lb_s > winner_s:
        return f"not simulated: its lowest bound {lb_s:.4g} s is above the winner's {winner_s:.4g} s"
    return (f"over memory: its candidates bounded under the winner's {winner_s:.4g} s (from {lb_s:.4g} s) do not fit "
            "the memory budget, and the rest are bounded above it")


def alternative(cand, res: dict, best: tuple | None) -> ScheduleAlternative:
    """One `ScheduleAlternative` from a simulated result; reason relative to `best` (None: the winner)."""
    peak = max(r["memory"] for r in res["ranks"])
    bubble = bubble_fraction(res["pipeline"], res["bubble"])
    if best is None:
        reason = "chosen: lowest simulated step time that fits"
    else:
        b, slow = best[2], res["step_s"] / best[0] - 1
        reason = (f"{slow:+.1%} step vs {best[1].schedule}; bubble {bubble:.1%} vs "
                  f"{bubble_fraction(b['pipeline'], b['bubble']):.1%}; peak memory {peak / _GB:.1f} vs "
                  f"{max(r['memory'] for r in b['ranks']) / _GB:.1f} GB; p2p {res['p2p_bytes'] / _GB:.2f} vs "
                  f"{b['p2p_bytes'] / _GB:.2f} GB per step; {_work(res)} vs {_work(b)}")
    return ScheduleAlternative(cand.schedule, cand.pp, cand.dp, cand.tp, cand.num_microbatches, res["step_s"],
                               bubble, int(peak), int(res["p2p_bytes"]), reason)


def _work(res: dict) -> str:
    """What the busiest rank computes besides its bubble, and which stages pay for memory with time (round 17
    new-user trial: zbv at 0.4% bubble lost to dualpipev at 8.3% with no reason shown; its stages recomputed)."""
    stages = res["stages"]
    rc = sum(st["recompute"] != "none" for st in stages)
    lean = sum(bool(st["lean"]) for st in stages)
    text = f"busy {(res['pipeline'] - res['bubble']) * 1e3:.1f} ms, recomputing {rc} of {len(stages)} stages"
    return text + (f", {lean} memory-lean" if lean else "")

