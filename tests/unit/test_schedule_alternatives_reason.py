"""The pipeline search's report of a schedule it never simulated gives the one reason that holds.

Round 23 new-user trial: `parallelizer plan --model llama` (Llama-3-8B shape, h100:8x8, seq 8192) printed
"vs gpipe: ... not simulated: its lowest bound 0.8129 s is above the winner's 1.115 s, or it does not fit memory":
a bound below the winner's step stated as above it. The bound search stops at the first bound above the best
step, so a schedule whose lowest bound is under the winner's was priced and left over memory.
"""
from types import SimpleNamespace

from parallelizer.planner.alternatives import schedule_alternatives
from parallelizer.planner.candidates import Candidate

WINNER_S = 1.115  # the winner's simulated step (s), as in the trial


def _alternatives(gpipe_bound_s: float):
    """schedule_alternatives for a zbv winner and a gpipe whose candidates were never simulated."""
    zbv = Candidate(2, 16, 2, 4, "zbv")
    gpipe = Candidate(2, 32, 1, 1, "gpipe")
    res = {"step_s": WINNER_S, "pipeline": 1.07, "bubble": 0.05, "p2p_bytes": 6.9e8,
           "ranks": [{"memory": 69.8e9}], "stages": []}
    ctx = SimpleNamespace(refused={}, exact=lambda c, r: r)
    bounds = [(gpipe_bound_s, gpipe), (0.9, zbv)]
    return {a.schedule: a for a in schedule_alternatives(ctx, (WINNER_S, zbv, res), {}, bounds)}


def test_a_schedule_bounded_under_the_winner_and_never_simulated_is_reported_over_memory():
    gpipe = _alternatives(0.8129)["gpipe"]
    assert gpipe.step_s is None
    assert "above the winner" not in gpipe.reason, gpipe.reason
    assert "memory" in gpipe.reason and "0.8129" in gpipe.reason and "1.115" in gpipe.reason, gpipe.reason


def test_a_schedule_bounded_above_the_winner_is_reported_by_its_bound_alone():
    gpipe = _alternatives(1.5)["gpipe"]
    assert gpipe.reason == "not simulated: its lowest bound 1.5 s is above the winner's 1.115 s", gpipe.reason


def test_a_runner_up_says_how_many_of_its_schedules_candidates_the_bound_left_unsimulated():
    """GPT-3-13B on a100:8x8 (round 23 trial): "vs 1f1b" showed pp=2 at 15698 ms (+2.6%) as if 1f1b's best, while
    1f1b on pp=4, pruned by its bound (above the winner's 15308 ms), prices 15557 ms when planned alone."""
    win = Candidate(4, 8, 2, 64, "dualpipev")
    simulated = Candidate(2, 16, 2, 64, "1f1b")
    pruned = Candidate(4, 8, 2, 128, "1f1b")
    res = lambda step: {"step_s": step, "pipeline": step, "bubble": 0.0, "p2p_bytes": 1e9,  # noqa: E731
                        "ranks": [{"memory": 60e9}], "stages": [{"recompute": "none", "lean": False}]}
    ctx = SimpleNamespace(refused={}, exact=lambda c, r: r)
    by_schedule = {("1f1b", True): (15.698, simulated, res(15.698))}
    bounds = [(15.0, win), (15.2, simulated), (15.4, pruned)]
    alts = {a.schedule: a for a in schedule_alternatives(ctx, (15.308, win, res(15.308)), by_schedule, bounds)}
    reason = alts["1f1b"].reason
    assert alts["1f1b"].pp == 2 and "1 more, bounded above the winner's 15.31 s, were not" in reason, reason
    assert "bounded above" not in alts["dualpipev"].reason
