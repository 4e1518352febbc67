"""Ranks sharing cores (`planner.sharing`, processor sharing in `planner.simulate`): closed forms on small
lists, the default pass reproduced when there are at least as many cores as ranks, factors from a profile;
the pipeline search on a profile's cluster (`Cluster.sharing`, `pipeline_cores`): closed forms of uniform
GPipe / 1F1B on 4 processes and 2 cores, and the profile -> cluster -> search path."""
import pytest
import torch
from torch.distributed.pipelining.schedules import _Action, _ComputationType

from cost_model.calibrate import Profile
from cost_model.hardware import DeviceSpec
from cost_model.topology import CoreSharing, Link
from parallelizer.errors import PipelineError
from parallelizer.planner.action_schedule import ActionSchedule
from parallelizer.planner.sharing import SharedCores, pipeline_cores
from parallelizer.planner.simulate import StageTimes, simulate, simulate_actions

F, B = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
CPU = DeviceSpec("cpu", {torch.float32: 1e11}, 10**10, 1e10, 1.0, 1.0, 2e-6, kind="cpu",
                 optimizer_bytes_per_s=4e9, optimizer_tensor_s=40e-6)


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


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("interleaved_1f1b", 2), ("zbv", 2), ("bitpipe", 2)])
def test_stage_syncs_under_sharing_match_the_default_pass_with_enough_cores(name, v):
    """The dp syncs overlapping each stage's last backward (`StageTimes.stage_sync_s`) are read off the
    sharing pass's timeline: with a core per rank it is the default pass's, so the ends agree; on 2 cores
    the compute slows and the syncs, waits that use no core, delay the end by no more than they do alone."""
    p, m = 4, 8
    S = p * v
    t = StageTimes(tuple(1.0 + 0.1 * k for k in range(S)), (0.7,) * S, (0.4,) * S, (0.05,) * (S - 1),
                   grad_sync_s=(0.1,) * p, stage_sync_s=tuple(((0.5 + 0.2 * k) / 3,) * 3 for k in range(S)),
                   sync_overlap=0.6)
    plain = simulate(name, p, m, t)
    assert plain.makespan_s > simulate(name, p, m, StageTimes(t.fwd_s, t.bwd_input_s, t.bwd_weight_s, t.p2p_s,
                                                               grad_sync_s=t.grad_sync_s)).makespan_s
    shared = simulate(name, p, m, t, SharedCores.ideal(cores=4, ranks=4))
    assert shared.makespan_s == pytest.approx(plain.makespan_s, rel=1e-12)
    two = simulate(name, p, m, t, SharedCores.ideal(cores=2, ranks=4))
    assert two.compute_end_s < two.makespan_s <= two.compute_end_s + 0.1 + sum(map(sum, t.stage_sync_s)) + 1e-9


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


# --- the pipeline search on a cluster whose processes share the cores (`pipeline_cores`, `Cluster.sharing`) ---

def _ideal_two_cores(n: int = 4) -> CoreSharing:
    """n processes on 2 cores with perfect sharing, the device already slowed by factor(n) = n / 2."""
    return CoreSharing(tuple((k, max(1.0, k / 2)) for k in range(1, n + 1)), (), max(1.0, n / 2))


def test_pipeline_cores_maps_pipeline_ranks_to_processes():
    cores, scale = pipeline_cores(_ideal_two_cores(), pp=4, dp=1, tp=1)
    assert cores.factors == (1.0, 1.0, 1.5, 2.0) and scale == 0.5 and cores.optimizer is None
    # pp=2 x dp=2: one computing pipeline rank = 2 processes (1 core each), two = 4 processes (factor 2)
    cores, scale = pipeline_cores(_ideal_two_cores(), pp=2, dp=2, tp=1)
    assert cores.factors == (1.0, 2.0) and scale == 0.5
    # pp=1: the one rank always runs with all 4 processes: the device's price as it is
    cores, scale = pipeline_cores(_ideal_two_cores(), pp=1, dp=2, tp=2)
    assert cores.factors == (1.0,) and scale == 1.0
    # measured points (matmul 2: x1.2, 4: x2.4; applied 2.4), the optimizer's own column
    share = CoreSharing(((2, 1.2), (4, 2.4)), ((2, 1.5), (4, 3.0)), 2.4)
    cores, scale = pipeline_cores(share, pp=2, dp=2, tp=1)
    assert cores.factors == pytest.approx((1.0, 2.0)) and cores.optimizer == pytest.approx((1.0, 2.0))
    assert scale == pytest.approx(0.5)
    with pytest.raises(ValueError, match="process count"):
        CoreSharing(((0, 1.0),))
    with pytest.raises(ValueError, match="applied_compute"):
        CoreSharing(((2, 1.0),), (), 0.0)


@pytest.mark.parametrize("f,b", [(3.0, 5.0), (2.0, 2.0)])
def test_uniform_gpipe_on_four_processes_and_two_cores_by_hand(f, b):
    """GPipe, 4 stages, 4 microbatches, equal stages, no communication, F and B priced f and b on the slowed
    device (all 4 processes computing: x2). Equal actions keep the ranks in lockstep: the forward wave runs
    1, 2, 3, 4, 3, 2, 1 ranks at once (factors 1, 1, 1.5, 2, 1.5, 1, 1: 9 solo steps of f / 2), the backward
    wave likewise: 4.5 (f + b); one core each would be 3.5 (f + b), every process always slowed 7 (f + b)."""
    cores, scale = pipeline_cores(_ideal_two_cores(), pp=4, dp=1, tp=1)
    times = StageTimes.uniform(4, f * scale, b * scale, 0.0)
    assert simulate("gpipe", 4, 4, times, cores).makespan_s == pytest.approx(4.5 * (f + b), rel=1e-12)
    assert simulate("gpipe", 4, 4, times).makespan_s == pytest.approx(3.5 * (f + b), rel=1e-12)
    assert simulate("gpipe", 4, 4, StageTimes.uniform(4, f, b, 0.0)).makespan_s == pytest.approx(7 * (f + b))


def test_uniform_1f1b_on_four_processes_and_two_cores_by_hand():
    """1F1B, 4 stages, 4 microbatches, F = B = c on the slowed device, no communication: in unit steps the
    ranks computing at once are 1, 2, 3, 4 (warm-up), 1, 2, 3, 4, 3, 3, 2, 2, 1, 1 (14 steps, Narayanan et
    al. 2021's 2 (m + p - 1)); factors max(1, k / 2) sum to 18 steps of c / 2 = 9c (7c on a core each,
    14c with every process always slowed)."""
    c = 2.0
    cores, scale = pipeline_cores(_ideal_two_cores(), pp=4, dp=1, tp=1)
    times = StageTimes.uniform(4, c * scale, c * scale, 0.0)
    got = simulate("1f1b", 4, 4, times, cores)
    assert got.makespan_s == pytest.approx(9 * c, rel=1e-12)
    assert simulate("1f1b", 4, 4, times).makespan_s == pytest.approx(7 * c, rel=1e-12)
    # pp=2 x dp=2 (2 stages of 2 processes), m = 2, F = B = c: rank 0 runs F0 F1 B0 B1, rank 1 F0 B0 F1 B1;
    # the 6 unit steps run 1, 2, 1, 2, 1, 1 pipeline ranks, factors 1, 2, 1, 2, 1, 1: 8 steps of c / 2 = 4c
    # (3c on a core each, 6c with every process always slowed)
    cores, scale = pipeline_cores(_ideal_two_cores(), pp=2, dp=2, tp=1)
    times = StageTimes.uniform(2, c * scale, c * scale, 0.0)
    assert simulate("1f1b", 2, 2, times, cores).makespan_s == pytest.approx(4 * c, rel=1e-12)
    assert simulate("1f1b", 2, 2, times).makespan_s == pytest.approx(3 * c, rel=1e-12)


@pytest.fixture(scope="module")
def tiny_gpt():
    import parallelizer
    from parallelizer import zoo
    m, inp = zoo.gpt(n_layer=4, n_embd=64, n_head=2, block_size=32, vocab_size=128, batch=1, with_targets=True,
                     device="meta")
    return parallelizer.trace(m, inp)


def _profile(contention=((2, (1.0, 1.0, 1.0)), (4, (2.0, 2.0, 2.0)))) -> Profile:
    """4 processes on 2 cores: x2 with 4 at once, x1 with 2; links of zero latency and 1 EB/s (sends ~0 s)."""
    link = Link("gloo_x4", 0.0, 1e18)
    return Profile(CPU, {4: link}, contention=dict(contention), cpu_count=2)


def test_profile_cluster_carries_the_sharing_and_gpu_presets_none():
    from cost_model.topology import dgx_h100, get_cluster
    cluster = _profile().cluster(4)
    # round 23: 4 processes on the profile's cores (2) outnumber them (`collective_wait_s`)
    assert cluster.sharing == CoreSharing(((2, 1.0), (4, 2.0)), ((2, 1.0), (4, 2.0)), 2.0, ranks_over_cores=True)
    assert cluster.device.peak_flops_per_s[torch.float32] == pytest.approx(CPU.peak_flops_per_s[torch.float32] / 2)
    assert _profile(contention=()).cluster(4).sharing is None  # nothing measured: no curve to share by
    unmeasured = _profile(contention=((2, (1.2, 1.0)),)).cluster(4).sharing
    assert unmeasured == CoreSharing(((2, 1.2),), (), 1.0, ranks_over_cores=True)  # 4 not measured: the device is not slowed
    assert dgx_h100(2).sharing is None and get_cluster("internet:8x1").sharing is None


def test_search_simulates_the_profile_cluster_with_shared_cores(tiny_gpt):
    """profile -> cluster -> search: pp=4 GPipe over 4 processes on 2 cores is the sharing pass of the
    search's own stage prices at half (scale 1 / 2, factors 1, 1, 1.5, 2), below the same stages with every
    process always slowed (the cluster without its sharing); the stage prices and memory are unchanged, and
    branch and bound still finds the exhaustive grid's optimum."""
    import dataclasses

    import parallelizer
    cluster = _profile().cluster(4)
    kw = dict(global_batch=4, pp=4, tp=1, num_microbatches=4, schedules=("gpipe",))
    shared = parallelizer.plan_pipeline(tiny_gpt, cluster, **kw)
    slowed = parallelizer.plan_pipeline(tiny_gpt, dataclasses.replace(cluster, sharing=None), **kw)
    assert [(s.fwd_s, s.bwd_s, s.wgrad_s) for s in shared.stages] == [(s.fwd_s, s.bwd_s, s.wgrad_s)
                                                                     for s in slowed.stages]
    st = shared.stages
    half = StageTimes(tuple(s.fwd_s / 2 for s in st), tuple(s.bwd_s / 2 for s in st),
                      tuple(s.wgrad_s / 2 for s in st), (0.0,) * 3)
    by_hand = simulate("gpipe", 4, 4, half, SharedCores((1.0, 1.0, 1.5, 2.0))).makespan_s
    assert shared.step_breakdown_s["pipeline"] == pytest.approx(by_hand, rel=1e-6)
    plain = simulate("gpipe", 4, 4, StageTimes(tuple(s.fwd_s for s in st), tuple(s.bwd_s for s in st),
                                               tuple(s.wgrad_s for s in st), (0.0,) * 3)).makespan_s
    assert slowed.step_breakdown_s["pipeline"] == pytest.approx(plain, rel=1e-6)
    assert shared.step_time_s < 0.8 * slowed.step_time_s


def test_search_bounds_stay_below_the_shared_simulation(tiny_gpt):
    """Branch and bound stays exact on a sharing cluster: every candidate's LB and every partition's bound are
    <= its simulated step (compute priced at solo speed can only slow down when ranks share the cores)."""
    from parallelizer.config import PlanConfig
    from parallelizer.planner import search
    from parallelizer.planner.segments import segment_graph
    ctx = search._Context(tiny_gpt, segment_graph(tiny_gpt), _profile().cluster(4), PlanConfig(), 10**12, 8, True,
                          "dp")
    cands = search._enumerate(ctx, None, None, None, search.SCHEDULES)[0]
    checked = 0
    for c in cands:
        for res in ctx.evaluate(c):
            step = ctx.exact(c, res)["step_s"]
            assert ctx.lower_bound_s(c) <= res["step_lb"] * (1 + 1e-9) and res["step_lb"] <= step * (1 + 1e-9), c
            checked += c.pp > 1
    assert checked >= 10
