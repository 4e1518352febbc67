"""The process CPU of a collective recorded by calibration (issue 13, round 18 r18d), and the one price of a
collective (`cost_model.communication.step_collective_s`): closed forms only, no timing."""
import dataclasses
import json

import pytest
import torch

from cost_model import Cluster, MeshTopology, collective_time_s, load_profile
from cost_model.calibrate import Profile, _profile_to_json, fit_collective_cpu
from cost_model.communication import step_collective_s
from cost_model.hardware import DeviceSpec
from cost_model.topology import Link

CPU = DeviceSpec("cpu", {torch.float32: 1e11}, 10**10, 1e10, 1.0, 1.0, 2e-6, kind="cpu",
                 optimizer_bytes_per_s=4e9, optimizer_tensor_s=40e-6)
LINK = Link("gloo_x4", 1e-4, 1e9)


def test_fit_collective_cpu_recovers_a_line_and_one_size_is_a_cost_per_call():
    a, b = 7e-4, 9e-10
    sizes = (4096, 65536, 1 << 20, 16 << 20)
    assert fit_collective_cpu({n: a + b * n for n in sizes}) == pytest.approx((a, b))
    assert fit_collective_cpu({4096: 5e-4}) == (5e-4, 0.0)
    # never negative: CPU falling with size gives no negative slope
    assert fit_collective_cpu({4096: 1e-3, 1 << 20: 5e-4})[1] == 0.0
    with pytest.raises(ValueError, match="fit_collective_cpu"):
        fit_collective_cpu({})


def test_profile_collective_cpu_round_trips_and_an_older_profile_has_none(tmp_path):
    cpu = {2: {"all_reduce": (5e-4, 6e-10)}, 4: {"all_reduce": (1.2e-3, 8e-10), "all_gather": (8e-4, 6e-10)}}
    profile = Profile(CPU, {2: LINK, 4: LINK}, contention={4: (2.2, 3.0)}, cpu_count=2, collective_cpu=cpu)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(profile, {}), sort_keys=True))
    assert load_profile(path) == profile
    data = json.loads(path.read_text())
    del data["collective_cpu"]  # a profile written before round 18
    path.write_text(json.dumps(data))
    assert load_profile(path).collective_cpu == {}


@pytest.mark.parametrize("world,cores", [(4, 2), (2, 2)])
def test_a_collective_is_priced_once_as_its_fit_plus_the_sync_wait(world, cores):
    device = dataclasses.replace(CPU, collective_sync_s=3e-3)
    topo = MeshTopology(Cluster(device, 1, world, LINK, LINK), (world,), ("dp",))
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for nbytes in (4096, 1 << 20):
            assert step_collective_s(kind, nbytes, topo, "dp") == pytest.approx(
                collective_time_s(kind, nbytes, topo, "dp") + 3e-3)


def _oversubscribed(cores: int) -> Profile:
    """4 gloo ranks calibrated on `cores` cores, sync wait 4 ms on 4 ranks (round 22's idle profile: 4.7 ms)."""
    return Profile(CPU, {2: LINK, 4: LINK}, contention={2: (1.0, 1.5), 4: (2.35, 3.5)}, cpu_count=cores,
                   collective_sync={4: 4e-3})


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_on_more_ranks_than_cores_only_a_sub_group_collective_waits_for_the_slowest_rank(kind):
    """Round 23 (r23c): with 4 ranks on 2 cores the calibrated wait of an all-rank collective is the others' compute,
    priced by the contention slowdown: a collective of every rank pays its fit alone; one of a sub-group (a tp pair
    of dp=2 x tp=2) keeps the full wait; on as many cores as ranks every collective keeps it."""
    from cost_model.communication import collective_wait_s
    cluster = _oversubscribed(cores=2).cluster(4)
    assert cluster.sharing.ranks_over_cores
    whole = MeshTopology(cluster, (4,), ("dp",))
    grid = MeshTopology(cluster, (2, 2), ("dp", "tp"))
    for nbytes in (4096, 1 << 20):
        assert step_collective_s(kind, nbytes, whole, "dp") == collective_time_s(kind, nbytes, whole, "dp")
        assert step_collective_s(kind, nbytes, grid, "tp") == pytest.approx(
            collective_time_s(kind, nbytes, grid, "tp") + 4e-3)
        assert step_collective_s(kind, nbytes, grid, ("dp", "tp")) == collective_time_s(kind, nbytes, grid, ("dp", "tp"))
    assert collective_wait_s(grid, "dp", compute_before_s=0.0) == 0.0  # right after another collective: none
    own = _oversubscribed(cores=4).cluster(4)
    assert not own.sharing.ranks_over_cores
    topo = MeshTopology(own, (4,), ("dp",))
    assert step_collective_s(kind, 4096, topo, "dp") == pytest.approx(collective_time_s(kind, 4096, topo, "dp") + 4e-3)


def test_a_gradient_bucket_of_every_rank_on_more_ranks_than_cores_waits_for_none():
    """The bucketed gradient sync (`steptime._buckets`) follows the same rule: dp=4 on 2 cores, one 4 KiB bucket is
    its all-reduce's fit; on the dp axis of dp=2 x tp=2 it adds the calibrated wait."""
    from parallelizer.planner.steptime import _buckets
    cluster = _oversubscribed(cores=2).cluster(4)
    work = [(0.01, [("dp", (1024,), 4)])]
    for shape, names, wait in (((4,), ("dp",), 0.0), ((2, 2), ("dp", "tp"), 4e-3)):
        topo = MeshTopology(cluster, shape, names)
        ready, comm, codec = _buckets(work, topo, 1 << 20, 1 << 20, "none", 4, cluster.device)
        assert ready == [0.01] and codec == 0.0
        assert comm == [pytest.approx(collective_time_s("all_reduce", 4096, topo, ("dp",)) + wait)]


def test_core_sharing_says_whether_ranks_outnumber_cores_as_a_bool():
    from cost_model.topology import CoreSharing
    with pytest.raises(ValueError, match="ranks_over_cores=1: must be a bool"):
        CoreSharing(((4, 2.0),), ranks_over_cores=1)
