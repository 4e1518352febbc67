"""First touch of activation memory beyond the allocator's kept heap (round 23, issue 14): closed forms of
`planner.simulate`'s `StageTimes.pool_bytes` term and the calibration's per-byte measurement."""
import dataclasses

import pytest

from cost_model.hardware import PipelineActionCost
from cost_model.pipeline_actions import CPU_PIPELINE_ACTION, first_touch_per_byte_s
from parallelizer.errors import PipelineError
from parallelizer.planner.simulate import StageTimes, simulate

P, M, F, B, ACT, C = 4, 8, 1.0, 2.0, 1000.0, 1e-4  # seconds, seconds, bytes per stage-microbatch, s per byte


def _times(pool, c=C, act=ACT):
    base = StageTimes.uniform(P, F, B / 2, B / 2)  # B = I + W
    return dataclasses.replace(base, act_bytes=(act,) * P, pool_bytes=pool,
                               action_overhead=PipelineActionCost(first_touch_per_byte_s=c))


def test_gpipe_with_an_empty_heap_pays_every_forwards_activations_once():
    # every F of GPipe raises its rank's in-flight bytes by ACT above everything before: F' = F + ACT c, so
    # the makespan is (m + p - 1)(F + ACT c + B)
    got = simulate("gpipe", P, M, _times((0.0,) * P)).makespan_s
    assert got == pytest.approx((M + P - 1) * (F + ACT * C + B), rel=1e-12)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_a_schedule_stepped_again_on_its_own_peak_pays_nothing(name):
    peak = simulate(name, P, M, dataclasses.replace(StageTimes.uniform(P, F, B / 2, B / 2),
                                                   act_bytes=(ACT,) * P)).peak_inflight_bytes
    assert simulate(name, P, M, _times(peak)).makespan_s == pytest.approx((M + P - 1) * (F + B), rel=1e-12)


@pytest.mark.parametrize("kept", [0, 3, 8, 11])
def test_a_pool_of_k_microbatches_leaves_the_first_k_forwards_free(kept):
    # GPipe holds all m forwards: beyond a pool of k microbatches each rank touches (m - k) ACT fresh bytes
    res = simulate("gpipe", P, M, _times((kept * ACT,) * P))
    for busy in res.busy_s:
        assert busy == pytest.approx(M * (F + B) + max(0, M - kept) * ACT * C, rel=1e-12)


def test_1f1b_touches_only_its_warm_up_depth_beyond_an_empty_heap():
    # 1F1B's rank k holds at most p - k microbatches: (p - k) ACT bytes touched once, not m ACT
    res = simulate("1f1b", P, M, _times((0.0,) * P))
    for k, busy in enumerate(res.busy_s):
        assert busy == pytest.approx(M * (F + B) + (P - k) * ACT * C, rel=1e-12)


def test_without_a_pool_or_a_per_byte_cost_the_closed_forms_hold():
    plain = (M + P - 1) * (F + B)
    assert simulate("gpipe", P, M, _times(None)).makespan_s == pytest.approx(plain, rel=1e-12)
    assert simulate("gpipe", P, M, _times((0.0,) * P, c=0.0)).makespan_s == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize("pool, act", [((0.0,) * (P - 1), (ACT,) * P), ((-1.0,) * P, (ACT,) * P),
                                       ((0.0,) * P, None)])
def test_a_pool_per_rank_that_cannot_be_priced_is_refused(pool, act):
    times = dataclasses.replace(_times(pool), act_bytes=act)
    with pytest.raises(PipelineError, match="pool_bytes"):
        simulate("gpipe", P, M, times)


def test_the_calibrated_first_touch_cost_is_a_few_tenths_of_a_nanosecond_per_byte():
    # a page fault plus zeroing 4 KiB costs ~0.5-5 us on x86 hosts: 0.1-1.2 ns per byte; the measurement is CPU time
    got = min(first_touch_per_byte_s(8 << 20) for _ in range(3))
    assert 0.02e-9 < got < 5e-9
    assert 0.1e-9 < CPU_PIPELINE_ACTION.first_touch_per_byte_s < 1.2e-9
    with pytest.raises(ValueError, match="at least one page"):
        first_touch_per_byte_s(100)


def test_the_calibrations_first_touch_samples_become_the_field_and_an_older_profile_gets_the_documented_figure():
    from cost_model.calibrate import _pipeline_action_from_json, _pipeline_action_to_json
    from cost_model.pipeline_actions import action_cost_from_samples
    cost = action_cost_from_samples({"first touch byte": [3e-10, 5e-10, 4e-10]}, {})
    assert cost.first_touch_per_byte_s == pytest.approx(4e-10) and cost.forward_s == 0.0
    assert _pipeline_action_from_json(_pipeline_action_to_json(cost)) == cost  # written and read back
    older = {k: v for k, v in _pipeline_action_to_json(cost).items() if k != "first_touch_per_byte_s"}
    assert _pipeline_action_from_json(older).first_touch_per_byte_s == CPU_PIPELINE_ACTION.first_touch_per_byte_s
