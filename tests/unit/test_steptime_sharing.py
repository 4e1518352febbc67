"""Processor sharing of collectives when ranks outnumber the cores (issue 13, round 18 r18d): closed forms only,
no timing. On k ranks sharing C < k cores a collective is priced k / C x the CPU one rank spends in it
(`cost_model.communication.step_collective_s`), with no sync wait, by the ILP and the step estimate alike."""
import dataclasses
import json
import math

import pytest
import torch

from cost_model import Cluster, MeshTopology, collective_time_s, load_profile
from cost_model.calibrate import Profile, _profile_to_json, fit_collective_cpu
from cost_model.communication import processor_shared, step_collective_s
from cost_model.hardware import DeviceSpec
from cost_model.topology import CoreSharing, Link

CPU = DeviceSpec("cpu", {torch.float32: 1e11}, 10**10, 1e10, 1.0, 1.0, 2e-6, kind="cpu",
                 optimizer_bytes_per_s=4e9, optimizer_tensor_s=40e-6, collective_sync_s=3e-3)
LINK = Link("gloo_x4", 1e-4, 1e9)
# (group size, kind, CPU seconds per call, CPU seconds per byte) of one rank
CPU_FITS = ((2, "all_reduce", 5e-4, 6e-10), (2, "all_gather", 4e-4, 5e-10), (2, "reduce_scatter", 5e-4, 7e-10),
            (4, "all_reduce", 1.2e-3, 8e-10), (4, "all_gather", 8e-4, 6e-10), (4, "reduce_scatter", 1.3e-3, 7e-10))


def _cluster(world: int, cores: int | None, fits=CPU_FITS) -> Cluster:
    sharing = CoreSharing(((world, 2.0),), cores=cores, collective_cpu=fits)
    return Cluster(CPU, 1, world, LINK, LINK, sharing=sharing)


def _cpu(kind, nbytes, group):
    return next(a + b * nbytes for g, k, a, b in CPU_FITS if g == group and k == kind)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 48 << 20])
def test_a_collective_on_more_ranks_than_cores_costs_its_cpu_times_ranks_over_cores(kind, nbytes):
    # 4 ranks on 2 cores: the whole world (group 4) and one axis of a 2 x 2 mesh (group 2), no sync wait
    world = MeshTopology(_cluster(4, 2), (4,), ("dp",))
    assert processor_shared(world)
    assert step_collective_s(kind, nbytes, world, "dp") == pytest.approx(4 / 2 * _cpu(kind, nbytes, 4))
    square = MeshTopology(_cluster(4, 2), (2, 2), ("dp", "tp"))
    assert step_collective_s(kind, nbytes, square, "tp") == pytest.approx(4 / 2 * _cpu(kind, nbytes, 2))
    # a profile of before round 18 (no CPU measured): the wall-clock fit, without the sync wait
    old = MeshTopology(_cluster(4, 2, fits=()), (4,), ("dp",))
    assert step_collective_s(kind, nbytes, old, "dp") == pytest.approx(collective_time_s(kind, nbytes, old, "dp"))
    # ranks with cores of their own (4 cores; unknown cores; every GPU preset): the fit + the sync wait, as before
    for topo in (MeshTopology(_cluster(4, 4), (4,), ("dp",)), MeshTopology(_cluster(4, None), (4,), ("dp",)),
                 MeshTopology(Cluster(CPU, 1, 4, LINK, LINK), (4,), ("dp",))):
        assert not processor_shared(topo)
        assert step_collective_s(kind, nbytes, topo, "dp") == pytest.approx(
            collective_time_s(kind, nbytes, topo, "dp") + 3e-3)


def test_the_ilp_prices_a_redistribution_with_the_same_processor_shared_collectives():
    from parallelizer.config import PlanConfig
    from parallelizer.core.layout import Layout, Replicate, Shard
    from parallelizer.core.mesh import MeshSpec
    from parallelizer.planner.costs import Pricer

    mesh = MeshSpec(("dp",), (4,))
    pricer = Pricer(MeshTopology(_cluster(4, 2), (4,), ("dp",)), mesh, PlanConfig())
    src, dst = Layout((Shard(0),)), Layout((Replicate(),))
    shape = (64, 1024)
    steps = pricer.steps(src, dst, shape, 4, (), True)
    assert [s.fwd_collective for s in steps] == ["all_gather"]
    # forward all-gather of the 256 KiB output (its gradient is sliced locally): 2 x one rank's CPU, no sync
    want = 2 * _cpu("all_gather", 64 * 1024 * 4, 4)
    assert steps[0].nbytes == 64 * 1024 * 4 and steps[0].bwd_collective is None
    assert sum(pricer.step_time_s(steps[0])) == pytest.approx(want)
    assert pricer.edge_time_s(src, dst, shape, 4, (), True) == pytest.approx(want)  # the ILP's edge entry


def test_fit_collective_cpu_recovers_a_line_and_one_size_is_a_cost_per_call():
    a, b = 7e-4, 9e-10
    sizes = (4096, 65536, 1 << 20, 16 << 20)
    assert fit_collective_cpu({n: a + b * n for n in sizes}) == pytest.approx((a, b))
    assert fit_collective_cpu({4096: 5e-4}) == (5e-4, 0.0)
    # never negative: CPU falling with size gives no negative slope
    assert fit_collective_cpu({4096: 1e-3, 1 << 20: 5e-4})[1] == 0.0
    with pytest.raises(ValueError, match="fit_collective_cpu"):
        fit_collective_cpu({})


def test_profile_collective_cpu_round_trips_and_reaches_the_clusters_sharing(tmp_path):
    cpu = {2: {"all_reduce": (5e-4, 6e-10)}, 4: {"all_reduce": (1.2e-3, 8e-10), "all_gather": (8e-4, 6e-10)}}
    profile = Profile(dataclasses.replace(CPU, collective_sync_s=0.0), {2: LINK, 4: LINK}, contention={2: (1.0, 1.0), 4: (2.2, 3.0)}, cpu_count=2,
                      collective_cpu=cpu)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(profile, {}), sort_keys=True))
    loaded = load_profile(path)
    assert loaded == profile
    sharing = loaded.cluster(4).sharing
    assert sharing.cores == 2 and sharing.oversubscribed(4) and not sharing.oversubscribed(2)
    assert sharing.collective_cpu_s("all_reduce", 1 << 20, 4) == pytest.approx(1.2e-3 + 8e-10 * (1 << 20))
    assert sharing.collective_cpu_s("all_reduce", 1 << 20, 2) == pytest.approx(5e-4 + 6e-10 * (1 << 20))
    assert sharing.collective_cpu_s("all_gather", 4096, 2) == pytest.approx(8e-4 + 6e-10 * 4096)  # nearest measured
    assert sharing.collective_cpu_s("all_to_all", 4096, 4) is None  # not measured: the wall fit prices it
    data = json.loads(path.read_text())
    del data["collective_cpu"]  # a profile written before round 18
    path.write_text(json.dumps(data))
    assert load_profile(path).collective_cpu == {} and load_profile(path).cluster(4).sharing.collective_cpu == ()
    with pytest.raises(ValueError, match="collective_cpu"):
        CoreSharing(((4, 2.0),), cores=2, collective_cpu=((1, "all_reduce", 1e-3, 0.0),))


def test_a_ddp_step_on_shared_cores_prices_every_bucket_by_its_cpu_and_exposes_it_in_full():
    import parallelizer
    from parallelizer import zoo
    from parallelizer.planner.steptime import estimate_step_time

    traced = parallelizer.trace(*zoo.mlp(in_features=16, dim=32, hidden=64, depth=1, batch=8))
    shared, own = _cluster(4, 2), _cluster(4, 4)
    plan = parallelizer.plan(traced, {"dp": 4}, cluster=own, axis_roles={"dp": "ddp"})
    est = estimate_step_time(traced, plan, cluster=shared)
    numel = sum(p.numel for p in traced.parameters.values() if not p.is_buffer)
    assert est.buckets == 1  # all gradients fit the first 1 MiB bucket
    assert est.grad_sync_s == pytest.approx(2 * _cpu("all_reduce", 4 * numel, 4))
    assert est.grad_sync_exposed_s == est.grad_sync_s  # its CPU occupies the shared cores, overlapped or not
    # the same plan on cores of their own: the fit + sync, partly hidden under backward (comm_overlap 0 here)
    mine = estimate_step_time(traced, plan, cluster=own)
    assert mine.grad_sync_s == pytest.approx(collective_time_s("all_reduce", 4 * numel, MeshTopology(
        own, (4,), ("dp",)), "dp") + 3e-3)
    assert math.isclose(est.forward_compute_s, mine.forward_compute_s)
