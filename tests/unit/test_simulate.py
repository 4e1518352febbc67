"""The action-list simulator (`planner.simulate`) reproduces the closed forms where they exist (GPipe / 1F1B:
Huang et al. 2019, Narayanan et al. 2021 Sec. 2.2; interleaved 1F1B: Narayanan Sec. 2.2.1; ZB-H1: Qi et al.
2024 Sec. 3.1) on torch's own action lists and BitPipe's (D - 2) / (4N + D - 2) (equal F and B) on its list,
prices transfers across ranks only, counts in-flight activations from the order, accepts lists built
elsewhere (two copies of a stage, as BitPipe), and rejects bad lists."""
import dataclasses
import re

import pytest
from torch.distributed.pipelining.schedules import _Action, _ComputationType

from parallelizer.errors import PipelineError
from parallelizer.planner.action_schedule import ActionSchedule, compute_actions
from parallelizer.planner.schedules import bitpipe_bubble_bound_s, inflight_microbatches
from parallelizer.planner.simulate import StageTimes, action_schedule, simulate, simulate_actions

F, I, W, B = (_ComputationType.FORWARD, _ComputationType.BACKWARD_INPUT, _ComputationType.BACKWARD_WEIGHT,
              _ComputationType.FULL_BACKWARD)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 8), (4, 4), (4, 9), (8, 32)])
def test_gpipe_1f1b_makespan_is_m_plus_p_minus_one_stage_times(name, p, m):
    r = simulate(name, p, m, StageTimes.uniform(p, 1.0, 1.5, 0.5))  # F = 1, B = I + W = 2
    assert r.makespan_s == (m + p - 1) * 3.0
    assert r.bubble_s == (p - 1) * 3.0  # bubble ratio (p - 1) / m
    assert r.bubble_fraction[0] == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m", [(2, 8), (4, 4), (4, 16), (8, 64)])
def test_interleaved_bubble_ratio_is_p_minus_one_over_v_m(p, m):
    r = simulate("interleaved_1f1b", p, m, StageTimes.uniform(2 * p, 0.5, 0.25, 0.25))  # chunk: F + B = 1
    ideal = max(r.busy_s)
    assert ideal == 2 * m
    assert r.bubble_s / ideal == pytest.approx((p - 1) / (2 * m), rel=1e-12)


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zbv_and_dualpipev_match_zb_h1_with_equal_times(name, p, m):
    """torch's ZBV list with F = I = W idles (p - 1)(F + I - W) per rank: ZB-H1's bubble on chunk times,
    a ratio (p - 1) / (3 v m); DualPipeV (OVERLAP_F_B run back to back) equals it."""
    r = simulate(name, p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0))
    assert r.bubble_s == (p - 1) * 1.0
    assert r.bubble_s / max(r.busy_s) == pytest.approx((p - 1) / (3 * 2 * m), rel=1e-12)


@pytest.mark.parametrize("p,k", [(2, 1), (2, 3), (4, 1), (4, 2), (4, 5), (6, 3), (8, 1), (8, 4), (16, 2)])
def test_bitpipe_bubble_ratio_is_d_minus_2_over_4n_plus_d_minus_2(p, k):
    """BitPipe (planner/bitpipe.py, the order of the authors' figures) with a chunk's F = B, Chimera's equal-time
    convention behind its (D - 2) / (2N + D - 2) (Li & Hoefler SC'21 Sec. 3): every rank idles (p - 2) F for
    any m = k p, i.e. (D - 2) / (4N + D - 2) of the step (D = p, N = m; each rank runs 4N chunk passes).
    With B = 2F (the figures' drawing): 2 (p - 2) F at m = p, plus (p - 3) F per further unit of p
    (BitPipe-v.svg: 4 of 28 units at p = m = 4; scale-moreb.svg (b): 5 of 53 at p = 4, m = 8)."""
    m = k * p
    equal = simulate("bitpipe", p, m, StageTimes.uniform(2 * p, 1.0, 0.5, 0.5))  # F = B = I + W = 1
    assert max(equal.busy_s) == 4 * m and equal.bubble_s == p - 2
    assert equal.bubble_s / equal.makespan_s == pytest.approx((p - 2) / (4 * m + p - 2), rel=1e-12)
    assert all(f == pytest.approx((p - 2) / (4 * m + p - 2), rel=1e-12) for f in equal.bubble_fraction)
    drawn = simulate("bitpipe", p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0))  # F = 1, B = 2
    assert drawn.bubble_s == (0 if p == 2 else 2 * (p - 2) + (k - 1) * (p - 3))
    if (p, m) in ((4, 4), (4, 8)):
        assert drawn.makespan_s == {4: 28.0, 8: 53.0}[m]


@pytest.mark.parametrize("p,k", [(2, 1), (2, 3), (4, 1), (4, 2), (6, 1), (6, 3), (8, 1), (8, 3)])
def test_bitpipe_never_beats_the_hand_derived_bubble_bound_and_meets_it_at_f_equal_b(p, k):
    """`schedules.bitpipe_bubble_bound_s` (derived in its docstring from the V placement alone: rank p/2 - 1
    cannot start before (p/2 - 1) F and its last backward is followed by (p/2 - 1) B more; every rank computes
    2m (F + B)) bounds the simulated step from below for any F, B, and the authors' order meets it at F = B;
    rank p/2 - 1 starts exactly at (p/2 - 1) F. At m = p the order idles (p - 2) max(F, B)."""
    m, h = k * p, p // 2
    for f, b in ((1.0, 1.0), (1.0, 2.0), (2.0, 1.0), (1.0, 0.5), (1.0, 3.0), (0.75, 0.75)):
        r = simulate("bitpipe", p, m, StageTimes.uniform(2 * p, f, b / 2, b / 2))
        bound = bitpipe_bubble_bound_s(p, m, f, b)
        assert max(r.busy_s) == pytest.approx(2 * m * (f + b), rel=1e-12)
        assert r.makespan_s >= 2 * m * (f + b) + bound - 1e-9
        assert r.bubble_s >= bound - 1e-9
        assert r.timeline()[h - 1][0][1] == pytest.approx((h - 1) * f, abs=1e-12)
        if f == b:
            assert r.bubble_s == pytest.approx(bound, rel=1e-12, abs=1e-12)
            assert r.bubble_s == pytest.approx((p - 2) * f, abs=1e-12)
        if k == 1:
            assert r.bubble_s == pytest.approx((p - 2) * max(f, b), abs=1e-12)
    with pytest.raises(ValueError, match="even p"):
        bitpipe_bubble_bound_s(3, 6, 1.0, 1.0)


def test_inflight_counts_equal_the_closed_forms():
    for p, m in ((2, 4), (4, 8), (4, 16), (8, 16)):  # BitPipe: m a multiple of p
        r = simulate("bitpipe", p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0))
        assert r.inflight_microbatches == tuple(inflight_microbatches("bitpipe", p, m, k) for k in range(p))
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zbv", 2), ("dualpipev", 2)):
        for p, m in ((1, 2), (2, 4), (3, 6), (4, 8), (4, 16), (8, 16)):
            r = simulate(name, p, m, StageTimes.uniform(p * v, 1.0, 1.0, 1.0))
            closed = tuple(inflight_microbatches(name, p, m, k) for k in range(p))
            assert r.inflight_microbatches == closed, (name, p, m)


def test_transfers_cost_across_ranks_only():
    p, m = 4, 8
    free = simulate("zbv", p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0))
    # only the V's turn (stage p-1 -> p, both on rank p-1) is charged: no change
    turn = [0.0] * (2 * p - 1)
    turn[p - 1] = 5.0
    same = simulate("zbv", p, m, StageTimes((1.0,) * 2 * p, (1.0,) * 2 * p, (1.0,) * 2 * p, tuple(turn)))
    assert same.makespan_s == free.makespan_s
    # GPipe with a transfer c on every boundary: the forward and backward chains each pay (p - 1) c
    c = 0.25
    r = simulate("gpipe", p, m, StageTimes.uniform(p, 1.0, 1.0, 1.0, p2p=c))
    assert r.makespan_s == (m + p - 1) * 3.0 + 2 * (p - 1) * c
    # 1F1B's steady state waits for the round trip: more than GPipe's 2 (p - 1) c once m > p
    assert simulate("1f1b", p, m, StageTimes.uniform(p, 1.0, 1.0, 1.0, p2p=c)).makespan_s > r.makespan_s


def test_grad_sync_follows_each_ranks_last_action():
    p, m = 4, 8
    base = simulate("1f1b", p, m, StageTimes.uniform(p, 1.0, 1.0, 1.0))
    ends = [max(e for _, _, e in acts) for acts in base.timeline().values()]
    assert ends == [base.makespan_s] + [base.makespan_s - k * 2.0 for k in range(1, p)]  # rank 0 ends last
    t = StageTimes((1.0,) * p, (1.0,) * p, (1.0,) * p, (0.0,) * (p - 1), grad_sync_s=(1.0, 1.0, 1.0, 7.0))
    assert simulate("1f1b", p, m, t).makespan_s == max(base.makespan_s + 1.0, ends[3] + 7.0)


def test_stage_sync_overlaps_the_stages_last_backward():
    """The runtime buckets a stage's dp all-reduce and starts it during the stage's last backward
    (`rewriter.grad_sync.deferred_sync`): n equal buckets of x / n seconds ready at s + (i + 1) d, d = B / n,
    over that backward [s, e], one at a time, end at max(s + d + x, e + x / n) (the recurrence's closed
    form for evenly spaced buckets), and only the overlap fraction o of the delay can hide."""
    p, m = 4, 8
    base = simulate("1f1b", p, m, StageTimes.uniform(p, 1.0, 1.0, 1.0))  # B = I + W = 2 on every stage
    for x, n, o in ((3.0, 4, 1.0), (3.0, 4, 0.5), (0.5, 4, 1.0), (3.0, 1, 1.0), (10.0, 100, 1.0)):
        t = StageTimes((1.0,) * p, (1.0,) * p, (1.0,) * p, (0.0,) * (p - 1), stage_sync_s=((x / n,) * n,) * p,
                       sync_overlap=o)
        after_end = max(x - 2.0 + 2.0 / n, x / n)  # rank 0's last action ends last: its delay decides
        expected = o * after_end + (1 - o) * x
        assert simulate("1f1b", p, m, t).makespan_s == pytest.approx(base.makespan_s + expected, rel=1e-12)
    # one bucket: the whole sync after the stage's last backward, as a wait after the rank's last action
    one = StageTimes((1.0,) * p, (1.0,) * p, (1.0,) * p, (0.0,) * (p - 1), stage_sync_s=((1.0,),) * 3 + ((7.0,),))
    wait = StageTimes((1.0,) * p, (1.0,) * p, (1.0,) * p, (0.0,) * (p - 1), grad_sync_s=(1.0, 1.0, 1.0, 7.0))
    assert simulate("1f1b", p, m, one).makespan_s == simulate("1f1b", p, m, wait).makespan_s


def test_stage_sync_buckets_are_ready_when_backward_has_produced_their_share():
    """A first bucket of 1/4 of the bytes is ready a quarter into the last backward [s, e] (B = 2), the
    rest at e: 1F1B, p = 2, syncs 1.0 then 0.2 seconds end at max(s + 0.5 + 1.0, e) + 0.2 = e + 0.2."""
    p, m = 2, 4
    base = simulate("1f1b", p, m, StageTimes.uniform(p, 1.0, 1.0, 1.0))
    t = StageTimes((1.0,) * p, (1.0,) * p, (1.0,) * p, (0.0,), stage_sync_s=((1.0, 0.2),) * p,
                   stage_sync_ready=((0.25, 1.0),) * p)
    assert simulate("1f1b", p, m, t).makespan_s == pytest.approx(base.makespan_s + 0.2, rel=1e-12)
    t = dataclasses.replace(t, stage_sync_s=((2.0, 0.2),) * p)  # s + 0.5 + 2.0 = e + 0.5, then + 0.2
    assert simulate("1f1b", p, m, t).makespan_s == pytest.approx(base.makespan_s + 0.7, rel=1e-12)


def test_stage_syncs_of_a_rank_run_in_the_order_their_stages_finish():
    """Interleaved 1F1B: rank r holds stages r and r + p; each stage's one-bucket sync is ready at the end of
    its last backward on the timeline, and the rank's syncs run one at a time from there."""
    p, m, x = 2, 4, 1.5
    times = dict(fwd_s=(1.0,) * 4, bwd_input_s=(1.0,) * 4, bwd_weight_s=(0.5,) * 4, p2p_s=(0.0,) * 3)
    base = simulate("interleaved_1f1b", p, m, StageTimes(**times))
    got = simulate("interleaved_1f1b", p, m, StageTimes(**times, stage_sync_s=((x,),) * 4))
    finish = []
    for r, acts in base.timeline().items():
        last_b = {}
        for name, _, end in acts:
            stage, kind = re.match(r"(\d+)([A-Z]+)\d+$", name).groups()
            if kind != "F":
                last_b[int(stage)] = end
        t = 0.0
        for ready in sorted(last_b.values()):
            t = max(t, ready) + x
        assert len(last_b) == 2
        finish.append(max(t, max(e for _, _, e in acts)))
    assert got.makespan_s == pytest.approx(max(finish), rel=1e-12)
    assert got.compute_end_s == base.compute_end_s


def test_stage_sync_checks_its_inputs():
    t = StageTimes.uniform(2, 1.0, 1.0, 1.0)
    two = ((1.0,), (1.0, 1.0))
    for bad in (dict(stage_sync_s=((1.0,),)), dict(stage_sync_s=two, stage_sync_ready=((1.0,), (0.5,))),
                dict(stage_sync_s=two, stage_sync_ready=((1.0,), (0.7, 0.5))),
                dict(stage_sync_s=two, stage_sync_ready=((1.0,), (0.0, 1.0))),
                dict(stage_sync_s=((1.0,), (-1.0,))), dict(stage_sync_s=two, sync_overlap=1.5)):
        with pytest.raises(PipelineError, match="stage_sync_s"):
            simulate("1f1b", 2, 4, dataclasses.replace(t, **bad))


def test_torch_lists_are_used_and_validated():
    s = action_schedule("zbv", 2, 4)
    assert s.stage_to_rank == {0: 0, 1: 1, 2: 1, 3: 0}  # the V
    assert [repr(a) for a in s.actions[0][:3]] == ["0F0", "0F1", "0F2"]
    assert {a.computation_type.value for r in s.actions for a in s.actions[r]} == {"F", "I", "W"}
    d = action_schedule("dualpipev", 2, 4)  # OVERLAP_F_B expanded into its F and B
    assert {a.computation_type.value for r in d.actions for a in d.actions[r]} == {"F", "B", "I", "W"}
    with pytest.raises(PipelineError, match="unknown pipeline schedule"):
        action_schedule("pipedream", 2, 4)
    with pytest.raises(PipelineError, match="dualpipev"):
        action_schedule("dualpipev", 4, 4)  # torch: at least as many microbatches as stages


def _two_copies(order0, order1) -> ActionSchedule:
    """2 ranks, S = 2 model stages, 2 copies: copy 0 runs stage 0 on rank 0 -> stage 1 on rank 1 (microbatch
    0), copy 1 runs stage 0 on rank 1 -> stage 1 on rank 0 (microbatch 1), BitPipe's two directions."""
    acts = {0: tuple(_Action(x, t, i) for x, t, i in order0), 1: tuple(_Action(x, t, i) for x, t, i in order1)}
    return ActionSchedule("two_copies", acts, {0: 0, 1: 1, 2: 1, 3: 0}, num_stages=2, num_microbatches=2, copies=2)


def test_external_list_with_two_copies():
    sched = _two_copies([(0, F, 0), (3, F, 1), (3, B, 1), (0, B, 0)],
                        [(2, F, 1), (1, F, 0), (1, B, 0), (2, B, 1)])
    r = simulate_actions(sched, StageTimes((1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (0.5,),
                                           copy_sync_s=(3.0, 0.25)))
    # rank 0: 0F0 [0,1], 3F1 [1.5,2.5] (after 2F1 [0,1] + 0.5), 3B1 [2.5,4.5], 0B0 [5,7] (after 1B0 [1.5..] + .5)
    tl = r.timeline()
    assert tl[0] == [("0F0", 0.0, 1.0), ("3F1", 1.5, 2.5), ("3B1", 2.5, 4.5), ("0B0", 5.0, 7.0)]
    assert tl[1] == [("2F1", 0.0, 1.0), ("1F0", 1.5, 2.5), ("1B0", 2.5, 4.5), ("2B1", 5.0, 7.0)]
    assert r.compute_end_s == 7.0 and r.makespan_s == 7.0 + 3.0  # stage 0's copies sync after both end
    assert r.peak_inflight_bytes == (2.0, 2.0)


def test_bad_lists_are_rejected():
    with pytest.raises(PipelineError, match="deadlocks"):  # rank 0 waits for 3F1 before running 0F0
        simulate_actions(_two_copies([(0, B, 0), (0, F, 0), (3, F, 1), (3, B, 1)],
                                     [(2, F, 1), (1, F, 0), (1, B, 0), (2, B, 1)]),
                         StageTimes.uniform(2, 1.0, 1.0, 1.0))
    with pytest.raises(PipelineError, match="2F1 appears 2 times"):
        _two_copies([(0, F, 0), (3, F, 1), (3, B, 1), (0, B, 0)],
                    [(2, F, 1), (2, F, 1), (1, F, 0), (1, B, 0), (2, B, 1)]).validate()
    with pytest.raises(PipelineError, match="stage 3 is on rank 0"):
        _two_copies([(0, F, 0), (0, B, 0)], [(3, F, 1), (2, F, 1), (1, F, 0), (1, B, 0), (2, B, 1)]).validate()
    with pytest.raises(PipelineError, match="need 2 model stages"):
        simulate("1f1b", 2, 2, StageTimes.uniform(3, 1.0, 1.0, 1.0))


def test_compute_actions_drops_communication_and_expands_overlap():
    pair = _Action(0, _ComputationType.OVERLAP_F_B, None, (_Action(0, F, 1), _Action(1, B, 0)))
    got = compute_actions([None, _Action(0, _ComputationType.SEND_F, 0), pair,
                           _Action(0, _ComputationType.REDUCE_GRAD)])
    assert [repr(a) for a in got] == ["0F1", "1B0"]


@pytest.mark.parametrize("name, slow, fast", [("gpipe", 8.0, 10.002), ("1f1b", 5.0, 10.004)])
def test_a_slow_link_carries_one_transfer_at_a_time(name, slow, fast):
    """p = 2, m = 4, compute ~0, each transfer 1 s. gpipe: the 4 activations cross the link one after the other
    (arriving at 1, 2, 3, 4 s), then the 4 gradients back (5, 6, 7, 8 s): 2 m = 8 s. 1f1b: two forwards in
    flight; after the first arrival (1 s) every second brings one activation forward and one gradient back,
    the last gradient at m + 1 = 5 s. Without link contention both were 2-4 s (every transfer 1 s after its
    producer). Compute-bound times (F = 1, B = 1, transfers 1 ms) keep the closed form (m + p - 1)(F + B)
    plus the transfers on the critical path (2 hops for gpipe, 4 for 1f1b), unchanged by the link model."""
    eps = 1e-6
    got = simulate(name, 2, 4, StageTimes.uniform(2, eps, eps, eps, p2p=1.0)).makespan_s
    assert got == pytest.approx(slow, abs=1e-4)
    compute_bound = simulate(name, 2, 4, StageTimes.uniform(2, 1.0, 0.5, 0.5, p2p=1e-3)).makespan_s
    assert compute_bound == pytest.approx(fast, abs=1e-9)


# ---- Schedules vs published closed forms (benchmarks/RESULTS.md "Schedules vs published closed forms") ----

def _deepseek_dualpipev(p: int, m: int) -> dict[int, list[str]]:
    """DeepSeek's DualPipeV order, transcribed from `DualPipeV.step` (github.com/deepseek-ai/DualPipe,
    dualpipe/dualpipev.py, steps 1-8; commit 3da1bbe): phase 0 = stage r, phase 1 = stage 2p - 1 - r;
    `_backward_chunk(enable_zb=True)` runs I and queues W (WeightGradStore, FIFO), `_weight_chunk` pops one W;
    `_forward_backward_chunk(a, b)` = F of phase a then full B of phase b."""
    lists = {}
    for r in range(p):
        st, fc, bc, wq, out = (r, 2 * p - 1 - r), [0, 0], [0, 0], [], []

        def f(ph):
            out.append(f"{st[ph]}F{fc[ph]}")
            fc[ph] += 1

        def b(ph, zb=False):
            out.append(f"{st[ph]}{'I' if zb else 'B'}{bc[ph]}")
            if zb:
                wq.append(f"{st[ph]}W{bc[ph]}")
            bc[ph] += 1

        for _ in range(2 * (p - r - 1)):
            f(0)
        for _ in range(r + 1):
            f(0), f(1)
        for _ in range(p - r - 1):
            b(1, True), out.append(wq.pop(0)), f(1)
        for _ in range(m - 2 * p + r + 1):
            f(0), b(1), f(1), b(0)
        for _ in range(p - r - 1):
            b(1), f(1), b(0)
        zb = False
        for i in range(r + 1):
            zb = zb or (i == (r + 1) // 2 and r % 2 == 1)
            b(1, zb)
            zb = zb or (i == (r + 1) // 2 and r % 2 == 0)
            b(0, zb)
        for _ in range(p - r - 1):
            out.append(wq.pop(0)), b(0, True)
        out += wq
        lists[r] = out
    return lists


def _list_schedule(lists: dict[int, list[str]], S: int, dur: dict[str, float], atomic_pairs: bool) -> float:
    """Independent event scheduler (not planner.simulate): each rank runs its list in order, an action starts
    when its rank is free and its inputs are done (no transfer time). atomic_pairs: an F followed by a full B
    (DualPipe's `_forward_backward_chunk`) is one block that starts only when BOTH inputs are there, as
    DeepSeek's step waits all receives before an overlapped F&B; otherwise each waits only its own input
    (torch's runtime without a custom overlap function). Returns the makespan."""
    import re
    parse = {r: [(int(x), k, int(i)) for x, k, i in (re.fullmatch(r"(\d+)([FIBW])(\d+)", a).groups() for a in acts)]
             for r, acts in lists.items()}
    blocks = {}
    for r, acts in parse.items():
        bl, n = [], 0
        while n < len(acts):
            take = 2 if atomic_pairs and acts[n][1] == "F" and n + 1 < len(acts) and acts[n + 1][1] == "B" else 1
            bl.append(acts[n:n + take])
            n += take
        blocks[r] = bl

    def deps(x, k, i):
        if k == "F":
            return [(x - 1, "F", i)] if x > 0 else []
        if k == "W":
            return [(x, "I", i)]
        return [(x, "F", i)] + ([(x + 1, "IB", i)] if x < S - 1 else [])

    done, pos, free = {}, dict.fromkeys(blocks, 0), dict.fromkeys(blocks, 0.0)
    moved = True
    while moved:
        moved = False
        for r, bl in blocks.items():
            if pos[r] == len(bl):
                continue
            inside = set(bl[pos[r]])
            need = [d for a in bl[pos[r]] for d in deps(*a) if d not in inside]
            got = [done.get((d[0], "I", d[2]), done.get((d[0], "B", d[2]))) if d[1] == "IB" else done.get(d)
                   for d in need]
            if None in got:
                continue
            t = max([free[r]] + got)
            for a in bl[pos[r]]:
                t += dur[a[1]]
                done[a] = t
            free[r], pos[r], moved = t, pos[r] + 1, True
    assert all(pos[r] == len(bl) for r, bl in blocks.items()), "deadlock"
    return max(free.values())


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 10), (8, 16), (8, 20)])
def test_dualpipev_is_deepseeks_list_with_pp_plus_one_activations(p, m):
    """torch's ScheduleDualPipeV list is DeepSeek's DualPipeV.step order action for action (OVERLAP_F_B = F then
    B); its peak in-flight activations are PP + 1 stage-microbatches on every rank (DeepSeek-V3 report Table 2 /
    DualPipe README, PP = 2p stages), 1x parameters (2 chunks of 1/(2p) per device = README's "2x" of a PP-stage
    1F1B device, on PP/2 devices)."""
    ours = action_schedule("dualpipev", p, m)
    assert {r: [repr(a) for a in ours.actions[r]] for r in range(p)} == _deepseek_dualpipev(p, m)
    r = simulate("dualpipev", p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0))
    assert r.peak_inflight_bytes == (2 * p + 1.0,) * p


@pytest.mark.parametrize("f,i,w", [(1, 1, 1), (1, 1, 0.5), (1, 2, 1), (2, 1, 1), (1, 0.5, 1.5)])
def test_dualpipev_bubble_vs_deepseeks_closed_form(f, i, w):
    """DeepSeek's (PP/2 - 1)(F&B + B - 3W) (B = a full backward I + W; F&B = F + B without an overlap kernel)
    is what DeepSeek's runtime idles, where an overlapped pair waits for both inputs: the independent scheduler
    with atomic pairs gives it for F <= I and W <= I (the README figure: 6 idle units at p = 4, m = 10 with
    F = I = W = 1), more otherwise. torch's runtime (our DualPipeV) runs the pair's F as soon as ITS input is
    there: planner.simulate = the independent scheduler without atomic pairs, below the closed form whenever
    the closed form holds (half of it at F = I = W)."""
    dur = {"F": f, "I": i, "W": w, "B": i + w}
    closed = lambda p: (p - 1) * ((f + i + w) + (i + w) - 3 * w)
    for p, m in ((2, 4), (4, 10), (8, 16)):
        ideal = 2 * m * (f + i + w)
        lists = _deepseek_dualpipev(p, m)
        atomic = _list_schedule(lists, 2 * p, dur, atomic_pairs=True) - ideal
        seq = _list_schedule(lists, 2 * p, dur, atomic_pairs=False) - ideal
        sim = simulate("dualpipev", p, m, StageTimes.uniform(2 * p, f, i, w))
        assert sim.makespan_s - ideal == pytest.approx(seq, abs=1e-12) and sim.bubble_s == pytest.approx(seq)
        if f <= i and w <= i:
            assert atomic == pytest.approx(closed(p)) and seq < closed(p)
        else:
            assert atomic > closed(p)
        if (f, i, w) == (1, 1, 1):
            assert atomic == 2 * (p - 1) and seq == p - 1


def test_zbv_and_dualpipev_leave_zb_h1s_form_with_unequal_times():
    """(p - 1)(F + I - W) (ZB-H1, Qi et al. 2024 Sec. 3.1; DeepSeek's ZB1P (PP - 1)(F + B - 2W) with a full B)
    is torch's ZBV bubble at F = I = W only; measured, p = 4, m = 8: F, I, W = 2, 1, 1 -> 8 (form 6);
    1, 1, 0.5 -> 3 (form 4.5); 1, 0.5, 1.5 -> 4 (form 0). DualPipeV: 6, 4.5, 3."""
    got = {t: (simulate("zbv", 4, 8, StageTimes.uniform(8, *t)).bubble_s,
               simulate("dualpipev", 4, 8, StageTimes.uniform(8, *t)).bubble_s)
           for t in ((2, 1, 1), (1, 1, 0.5), (1, 0.5, 1.5))}
    assert got == {(2, 1, 1): (8.0, 6.0), (1, 1, 0.5): (3.0, 4.5), (1, 0.5, 1.5): (4.0, 3.0)}


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16), (8, 64), (16, 32)])
def test_interleaved_first_rank_holds_korthikantis_activations(p, m):
    """Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4.2.3: with the interleaved schedule the first stage
    holds L (1 + (p - 1) / (p v)) layers' activations (L layers, v chunks per rank; m >= the warm-up). One layer
    per chunk (L = 2p, act_bytes 1): the simulated peak of rank 0 in layer-microbatches equals it, also with
    unequal F, I, W (the order, not the times, decides it)."""
    v, L = 2, 2 * p
    for t in ((1.0, 1.0, 1.0), (1.0, 2.0, 0.5)):
        r = simulate("interleaved_1f1b", p, m, StageTimes.uniform(2 * p, *t))
        assert r.peak_inflight_bytes[0] == L * (1 + (p - 1) / (p * v))
        assert r.bubble_s == pytest.approx((p - 1) * sum(t))  # Narayanan (p - 1)(t_f + t_b) / v on rank times


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16), (8, 32)])
def test_zbv_is_zero_bubble_in_the_zb_papers_measure(p, m):
    """The ZB authors' "ZBV bubble 0" (sail-sg/zero-bubble-pipeline-parallelism README table; their scheduler's
    `stage_bubble`, zerobubble/scheduler/zbv.py) counts each rank's idle AFTER its first action: the start-up
    ramp is hidden across steps by their optimizer post-validation. torch's ZBV list at F = I = W idles 0 in that
    measure on every rank; the step (makespan) still carries the ramp (p - 1) F, which no schedule avoids within
    one step (rank p - 1's first forward waits for p - 1 forwards). The authors' own ZB-V list, simulated here,
    gives the same (p - 1) F makespan bubble at F = I = W (benchmarks/published/schedules_closed_forms.py).
    DualPipeV's (p - 1) F is idle after the start (its pairs' order), 1F1B's (p - 1)(F + B) likewise."""
    def after_start(r):
        return max(acts[-1][2] - acts[0][1] - r.busy_s[k] for k, acts in r.timeline().items())
    zbv = simulate("zbv", p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0))
    assert after_start(zbv) == 0.0 and zbv.bubble_s == p - 1.0
    assert after_start(simulate("dualpipev", p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0))) == p - 1.0
    assert after_start(simulate("1f1b", p, m, StageTimes.uniform(p, 2.0, 2.0, 2.0))) == 6.0 * (p - 1)


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_peak_holds_when_w_keeps_the_weight_gradient_inputs(name):
    """The simulator frees a microbatch's activations at I (module docstring); the ZB paper's accounting (Qi et
    al. 2024 Table 1: F +M_B, B +M_W - M_B, W -M_W, M_W = 32 b s h of M_B's 34 b s h + 5 a s^2 b) keeps M_W
    until W. On torch's ZBV and DualPipeV lists the peak is the same either way (reached before a rank's first
    I), so the reported peaks (p and PP + 1) are what the paper's accounting gives."""
    for p, m in ((2, 4), (4, 8), (4, 16), (8, 16)):
        sched = action_schedule(name, p, m)
        for r in range(p):
            cur = peak = 0.0
            for a in sched.actions[r]:
                cur += {"F": 1.0, "I": 0.0, "W": -1.0, "B": -1.0}[a.computation_type.value]
                peak = max(peak, cur)
            got = simulate(name, p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0)).peak_inflight_bytes[r]
            assert peak == got == 2 * p + (1 if name == "dualpipev" else 0)
