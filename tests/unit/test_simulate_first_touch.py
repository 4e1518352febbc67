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


# Round 27 (r27c): the live level counts the weight gradients each stage's first backward allocates anew
# (zero_grad(set_to_none=True) frees them after every step); the touch is charged to the action that raises it.
G = 300.0  # weight-gradient bytes per model stage


def _with_grads(name, pool):
    return dataclasses.replace(_times(pool), weight_grad_bytes=(G,) * P)


def _touched(name, times):
    from parallelizer.planner.first_touch import first_touch_bytes
    res = simulate(name, P, M, times)
    return res, first_touch_bytes(res.compiled, times)


def test_gpipe_on_a_heap_that_keeps_its_activations_pays_its_gradients_on_its_first_backward():
    # GPipe's first B runs with all m microbatches live: a pool of m ACT leaves exactly G per rank, on that B
    res, got = _touched("gpipe", _with_grads("gpipe", (M * ACT,) * P))
    c = res.compiled
    for r, idx in enumerate(c.by_rank):
        charged = [n for n in idx if got[n] > 0]
        first_b = next(n for n in idx if c.kind[n] == 3)
        assert charged == [first_b] and got[first_b] == pytest.approx(G)
        assert res.busy_s[r] == pytest.approx(M * (F + B) + G * C, rel=1e-12)


def test_1f1b_on_a_heap_that_keeps_its_live_peak_pays_nothing():
    # rank k's live peak is its warm-up depth (p - k) ACT plus its gradients G: a pool of that is its steady state
    pool = tuple((P - k) * ACT + G for k in range(P))
    assert simulate("1f1b", P, M, _with_grads("1f1b", pool)).makespan_s == pytest.approx((M + P - 1) * (F + B),
                                                                                        rel=1e-12)


def test_an_empty_heap_touches_the_live_peak_activations_and_gradients():
    # GPipe with pool 0: m ACT over its forwards, then G on its first backward; 1F1B: (p - k) ACT + G
    for name, live in (("gpipe", lambda k: M * ACT + G), ("1f1b", lambda k: (P - k) * ACT + G)):
        res, got = _touched(name, _with_grads(name, (0.0,) * P))
        for k, idx in enumerate(res.compiled.by_rank):
            assert got[idx].sum() == pytest.approx(live(k))


def test_a_split_backward_allocates_its_gradients_in_its_first_weight_action():
    # zbv's W actions accumulate .grad (torch's stage_backward_weight), its I actions only input gradients: with no
    # activation bytes and an empty heap, each rank touches exactly its two stage copies' gradients 2 G, on the
    # first W of each copy, and no I is charged
    base = dataclasses.replace(StageTimes.uniform(2 * P, F, B / 2, B / 2), act_bytes=(0.0,) * (2 * P),
                               pool_bytes=(0.0,) * P, weight_grad_bytes=(G,) * (2 * P),
                               action_overhead=PipelineActionCost(first_touch_per_byte_s=C))
    res, got = _touched("zbv", base)
    c = res.compiled
    for idx in c.by_rank:
        firsts = {}
        for n in idx:
            if c.kind[n] == 2:
                firsts.setdefault(c.actions[n].stage_index, n)
        assert sorted(n for n in idx if got[n] > 0) == sorted(firsts.values())
        assert got[idx].sum() == pytest.approx(2 * G)


def test_gradient_bytes_that_cannot_be_priced_are_refused():
    from parallelizer.planner.first_touch import first_touch_bytes
    times = dataclasses.replace(_times((0.0,) * P), weight_grad_bytes=(G,) * (P - 1))
    with pytest.raises(PipelineError, match="weight_grad_bytes"):
        first_touch_bytes(simulate("gpipe", P, M, _times(None)).compiled, times)
