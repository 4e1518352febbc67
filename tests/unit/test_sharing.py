"""Ranks sharing cores (`planner.sharing`, processor sharing in `planner.simulate`): closed forms on small
lists, the default pass reproduced when there are at least as many cores as ranks, factors from a profile."""
import pytest
from torch.distributed.pipelining.schedules import _Action, _ComputationType

from parallelizer.errors import PipelineError
from parallelizer.planner.action_schedule import ActionSchedule
from parallelizer.planner.sharing import SharedCores
from parallelizer.planner.simulate import StageTimes, simulate, simulate_actions

F, B = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD


def _independent(durations: dict[int, float]) -> tuple[ActionSchedule, StageTimes]:
    """One copy, S = 2 stages on 2 ranks, 1 microbatch: rank 0 runs 0F0 then 0B0, rank 1 1F0 then 1B0;
    times chosen so that the ranks' work overlaps as the tests need."""
    acts = {0: (_Action(0, F, 0), _Action(0, B, 0)), 1: (_Action(1, F, 0), _Action(1, B, 0))}
    sched = ActionSchedule("pair", acts, {0: 0, 1: 1}, num_stages=2, num_microbatches=1)
    return sched, StageTimes((durations[0], durations[1]), (0.0, 0.0), (0.0, 0.0), (0.0,))


def test_two_ranks_busy_t_on_one_core_both_finish_at_2t():
    """Both ranks run their optimizer step (T solo seconds each) at once on one core: each at half speed,
    both end at 2T; on two cores at T."""
    T = 3.0
    sched, times = _independent({0: 0.0, 1: 0.0})
    times = StageTimes(times.fwd_s, times.bwd_input_s, times.bwd_weight_s, times.p2p_s, optimizer_s=(T, T))
    one = simulate_actions(sched, times, SharedCores.ideal(cores=1, ranks=2))
    assert one.makespan_s == pytest.approx(2 * T, rel=1e-12)
    two = simulate_actions(sched, times, SharedCores.ideal(cores=2, ranks=2))
    assert two.makespan_s == pytest.approx(T, rel=1e-12)


def test_an_idle_rank_frees_the_core():
    """GPipe on 2 ranks, 1 microbatch, 1 core: the chain F0, F1, B1, B0 never overlaps, so sharing costs
    nothing; optimizer steps of 1 s (rank 0) and 3 s (rank 1) after it share the core with what still runs
    (processor sharing by hand below)."""
    t = StageTimes((1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (0.0,))  # F = 1, B = 2
    plain = simulate("gpipe", 2, 1, t)
    shared = simulate("gpipe", 2, 1, t, SharedCores.ideal(cores=1, ranks=2))
    assert plain.makespan_s == shared.makespan_s == 6.0
    opt = StageTimes(t.fwd_s, t.bwd_input_s, t.bwd_weight_s, t.p2p_s, optimizer_s=(1.0, 3.0))
    # at 4 rank 0 starts B0 (2 s) and rank 1 its step (3 s): both at half speed until B0 ends at 8 (rank 1
    # has 1 s left); then rank 1's last 1 s and rank 0's 1 s step, both at half speed, end together at 10
    got = simulate("gpipe", 2, 1, opt, SharedCores.ideal(cores=1, ranks=2))
    assert got.makespan_s == pytest.approx(10.0, rel=1e-12)
    assert got.timeline()[0][-1] == ("0B0", 4.0, pytest.approx(8.0, rel=1e-12))
    assert simulate("gpipe", 2, 1, opt).makespan_s == pytest.approx(max(6.0 + 1.0, 4.0 + 3.0))


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zbv", 2),
                                    ("dualpipev", 2), ("bitpipe", 2)])
def test_as_many_cores_as_ranks_gives_the_default_pass(name, v):
    p, m = 4, 8
    S = p * v
    t = StageTimes(tuple(1.0 + 0.1 * k for k in range(S)), (0.7,) * S, (0.4,) * S, (0.05,) * (S - 1),
                   grad_sync_s=(0.3,) * p, optimizer_s=(0.2, 0.1, 0.4, 0.3))
    plain = simulate(name, p, m, t)
    shared = simulate(name, p, m, t, SharedCores.ideal(cores=4, ranks=4))
    assert shared.makespan_s == pytest.approx(plain.makespan_s, rel=1e-12)
    assert shared.ends == pytest.approx(plain.ends, rel=1e-12)
    # more sharing never helps: 2 cores, then 1 core
    two = simulate(name, p, m, t, SharedCores.ideal(cores=2, ranks=4)).makespan_s
    one = simulate(name, p, m, t, SharedCores.ideal(cores=1, ranks=4)).makespan_s
    assert plain.makespan_s < two < one
    # one core does at most one solo second of work per second: at least all actions + optimizer steps
    assert one >= m * (sum(t.fwd_s) + S * (0.7 + 0.4)) + sum(t.optimizer_s) - 1e-9


def test_measured_factors_interpolate_and_extrapolate():
    c = SharedCores.measured({2: 1.2, 4: 2.4}, ranks=6, optimizer_slowdown={4: 3.0})
    assert c.factors == pytest.approx((1.0, 1.2, 1.8, 2.4, 3.0, 3.6))
    assert c.factor(4, optimizer=True) == pytest.approx(3.0)
    assert c.factor(2, optimizer=True) == pytest.approx(1.0 + 2.0 / 3.0)
    assert SharedCores.measured({2: 0.9}, ranks=2).factors == (1.0, 1.0)  # a "speed-up" is noise
    with pytest.raises(PipelineError, match="factor"):
        SharedCores((1.0, 0.5))
    with pytest.raises(PipelineError, match="one per rank"):
        simulate("gpipe", 2, 2, StageTimes((1.0, 1.0), (1.0, 1.0), (0.0, 0.0), (0.0,), optimizer_s=(1.0,)))
