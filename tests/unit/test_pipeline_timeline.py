"""The simulated schedule timeline agrees with the closed forms (issue: pipeline)."""
import pytest

from parallelizer.planner.timeline import makespan_s, timeline


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (4, 4), (4, 8), (8, 3)])
def test_makespan_is_m_plus_p_minus_one_stage_times(schedule, p, m):
    ops = timeline(schedule, [1.0] * p, [2.0] * p, m)
    assert len(ops) == 2 * p * m
    assert makespan_s(ops) == pytest.approx((m + p - 1) * 3.0)


def test_1f1b_keeps_at_most_p_minus_stage_microbatches_in_flight():
    p, m = 4, 8
    ops = timeline("1f1b", [1.0] * p, [2.0] * p, m)
    for s in range(p):
        mine = [o for o in ops if o.stage == s]
        inflight = peak = 0
        for o in mine:
            inflight += 1 if o.kind == "F" else -1
            peak = max(peak, inflight)
        assert peak == min(p - s, m)
    gpipe = [o for o in timeline("gpipe", [1.0] * p, [2.0] * p, m) if o.stage == 0]
    assert [o.kind for o in gpipe[:m]] == ["F"] * m  # GPipe keeps all m in flight


def test_slowest_stage_sets_the_pace():
    ops = timeline("1f1b", [1.0, 3.0], [1.0, 3.0], 10)
    assert makespan_s(ops) == pytest.approx(10 * 6.0 + 2.0)  # m x bottleneck + the other stage once


def test_unknown_schedule_is_rejected():
    with pytest.raises(ValueError, match="'gpipe' and '1f1b'"):
        timeline("interleaved_1f1b", [1.0], [1.0], 2)
