"""Round 21 (issue 13/14): the pipeline price's floor of the ranks' total CPU over the shared cores
(`planner.sharing.cpu_floor_s`, `SimResult.cpu_floor_s`, the search's step), closed forms."""
from __future__ import annotations

import pytest
import torch

from cost_model.calibrate import Profile
from cost_model.hardware import DeviceSpec
from cost_model.topology import CoreSharing, Link
from parallelizer.errors import PipelineError
from parallelizer.planner.sharing import SharedCores, cpu_floor_s, pipeline_cores
from parallelizer.planner.simulate import StageTimes, simulate
from test_sharing import tiny_gpt  # noqa: F401 -- the 4-block GPT fixture of the sharing tests

CPU = DeviceSpec("cpu", {torch.float32: 1e11}, 10**10, 1e10, 1.0, 1.0, 2e-6, kind="cpu")


def test_the_floor_is_the_total_work_over_the_best_throughput_of_the_shared_cores():
    """R ranks on C cores, ideal sharing: sum / min(R, C); a measured curve: sum / max_k k / factor(k)."""
    work = (3.0, 1.0, 2.0, 2.0)
    assert cpu_floor_s(work, SharedCores.ideal(2, 4)) == pytest.approx(8.0 / 2)
    assert cpu_floor_s(work, SharedCores.ideal(8, 4)) == pytest.approx(8.0 / 4)
    assert cpu_floor_s(work, SharedCores((1.0, 1.2, 2.4, 3.0))) == pytest.approx(8.0 / (2 / 1.2))
    with pytest.raises(PipelineError, match="work"):
        cpu_floor_s((1.0, -1.0), SharedCores.ideal(2, 2))


def test_the_simulation_reports_the_floor_with_the_cpu_its_timeline_holds_as_waits():
    """pp=2 x dp=2 on 2 cores, 1F1B, m = 2, F = B = c on the slowed device (the hand count of test_sharing: 4c,
    the ranks in lockstep use the cores fully, so the floor of the simulated work is 4c too). A rank that also
    spends h of CPU in a wait (its dp sync's gloo threads) moves the floor to 4c + h; one device per rank: 0."""
    c, h = 2.0, 3.0
    cores, scale = pipeline_cores(CoreSharing(tuple((k, max(1.0, k / 2)) for k in range(1, 5)), (), 2.0), 2, 2, 1)
    times = StageTimes.uniform(2, c * scale, c * scale, 0.0)
    got = simulate("1f1b", 2, 2, times, cores)
    assert got.makespan_s == pytest.approx(4 * c) and got.cpu_floor_s == pytest.approx(4 * c)
    waits = StageTimes(times.fwd_s, times.bwd_input_s, times.bwd_weight_s, times.p2p_s, host_cpu_s=(h, 0.0))
    assert simulate("1f1b", 2, 2, waits, cores).cpu_floor_s == pytest.approx(4 * c + h)
    assert simulate("1f1b", 2, 2, waits).cpu_floor_s == 0.0
    with pytest.raises(PipelineError, match="host_cpu_s"):
        simulate("1f1b", 2, 2, StageTimes(times.fwd_s, times.bwd_input_s, times.bwd_weight_s, times.p2p_s,
                                          host_cpu_s=(h,)), cores)


def test_the_search_step_is_at_least_the_dp_sync_cpu_of_every_process_over_the_cores(tiny_gpt):
    """4 processes (pp=2 x dp=2) on 2 cores whose dp all-reduces each cost a = 10 s of a rank's CPU (the profile's
    `collective_cpu`): whatever the schedule, the 4 processes' syncs take 2 x a x (the stages' buckets) CPU
    seconds (each stage's on its 2 dp processes), over 2 cores. The search's step (which the estimate adds the optimizer to) is that floor within
    the rest of the step (< 0.1%); without the CPU record the step is the simulated timeline, seconds below."""
    from parallelizer.config import PlanConfig
    from parallelizer.planner import search
    from parallelizer.planner.segments import segment_graph
    from parallelizer.rewriter.grad_sync import bucket_sizes
    a = 10.0
    link = Link("gloo_x4", 0.0, 1e18)
    contention = {2: (1.0, 1.0, 1.0), 4: (2.0, 2.0, 2.0)}

    def step(cpu):
        profile = Profile(CPU, {4: link}, contention=contention, cpu_count=2, collective_cpu=cpu)
        ctx = search._Context(tiny_gpt, segment_graph(tiny_gpt), profile.cluster(4), PlanConfig(), 10**12, 4,
                              False, "dp")
        c = search.Candidate(2, 2, 1, 2, "1f1b")
        res = min(ctx.evaluate(c), key=lambda r: r["step_lb"])
        return ctx.exact(c, res), res
    got, res = step({4: {"all_reduce": (a, 0.0)}})
    buckets = sum(len(bucket_sizes(st["grads"])) for st in res["stages"])  # one stage per pipeline rank
    assert buckets >= 2
    floor = 2 * a * buckets / 2  # a stage's buckets run on each of its 2 dp processes; 2 cores
    assert got["step_s"] == pytest.approx(floor, rel=1e-3)
    plain, _ = step({})
    assert plain["step_s"] < 1.0
    assert got["pipeline"] == pytest.approx(plain["pipeline"])  # the timeline itself is unchanged
