"""cost_model.calibrate: a short real calibration round-trips through JSON."""

import dataclasses
import json
import statistics
import warnings

import pytest
import torch

from cost_model import Cluster, MeshTopology, collective_time_s, load_profile
from cost_model.calibrate import _MIN_INV_BANDWIDTH, Profile, _profile_to_json, calibrate, compare_profiles, fit_link
from cost_model.communication import flat_collective_time_s
from cost_model.step_efficiency import price_reference_s, step_efficiency
from cost_model.hardware import GPU_PIPELINE_ACTION, H100_SXM, PipelineActionCost
from cost_model.contention import _keep_busy, contention_factor
from cost_model.pipeline_actions import CPU_PIPELINE_ACTION, action_cost_from_samples
from cost_model.topology import Link


def test_fit_link_recovers_alpha_beta():
    truth = Link("t", latency_s=50e-6, bandwidth_bytes_per_s=2e9)
    samples = [(kind, 4, nbytes, flat_collective_time_s(kind, nbytes, 4, truth))
               for kind in ("all_reduce", "all_gather") for nbytes in (1 << 12, 1 << 16, 1 << 20, 1 << 24)]
    fitted = fit_link(samples)
    assert fitted.latency_s == pytest.approx(50e-6, rel=1e-6)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(480)  # a hang guard, not a speed target: ~21 s here idle, several times that on a loaded machine
def test_calibration_smoke_round_trip(tmp_path):
    # sizes of 64 KiB and more: the bandwidth term of the fit is measurable above the latency noise of a loaded
    # machine (with a 4 KiB message the fit once gave a negative inverse bandwidth)
    # one collective pass (fresh processes per pass): the passes' order and pooling have their own tests
    # (test_calibration_stability.py: test_calibrate_spreads_its_collective_passes_between_the_other_measurements,
    # test_pool_passes_takes_the_median_of_the_pooled_rounds_and_the_pass_half_difference); here the real
    # measurements round-trip
    path = tmp_path / "cpu.profile.json"
    profile = calibrate(nprocs=(2,), out_path=path, progress=False, message_sizes_bytes=(1 << 16, 1 << 20, 1 << 22),
                        matmul_sizes=(128, 256), memory_numel=1 << 20, repeats=3, contention=False, device_rounds=1,
                        collective_passes=1, pipeline_steps=1)  # 1 timed pipeline round (after the 2 warm-up rounds
    # `pipeline_actions._run_schedules` always runs): its values, one sample of each kind per rank, round-trip. Round 27
    # (r27b): 4 timed rounds cost 12.6 s of the 2 measuring processes' CPU, 1 round 7.6 s; pooling several rounds is
    # tested offline (test_calibration_passes.py, test_pipeline_action_cost_is_the_median_less_the_bare_op_and_scales_
    # with_the_cores below), each round's split-backward samples in test_split_backward_samples.py
    text = path.read_text()
    assert list(json.loads(text)) == sorted(json.loads(text))  # stable key order
    loaded = load_profile(path)
    assert loaded == profile
    # every kind the plans use is measured and fitted piecewise (one segment per pair of sizes): none reused
    assert set(loaded.links[2].size_fits) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert all(len(segs) == 2 for segs in loaded.links[2].size_fits.values())
    assert json.loads(text)["measurements"]["per_kind_reused"] == {}
    # round 19: each collective's split-half difference is recorded, and their median with the device's
    halves = json.loads(text)["measurements"]["collective_split_half"]["2"]
    assert set(halves) == set(loaded.links[2].size_fits) and all(len(v) == 3 for v in halves.values())
    assert 0 <= json.loads(text)["measurements"]["split_half_median"] < 10
    assert 0 <= loaded.comm_overlap[2] <= 1 and loaded.contention == {}
    # seconds a blocking collective waits for the slowest rank: bounded by the calibration's own wall time (a
    # bound by construction; round 20: a fixed 0.1 s was a speed target that a loaded machine can miss)
    wall_s = json.loads(text)["measurements"]["seconds"]
    assert 0 <= loaded.collective_sync[2] < wall_s
    assert loaded.cluster(2).device.collective_sync_s == loaded.collective_sync[2]
    assert 0 <= json.loads(text)["measurements"]["sync_exit_spread_s"]["2"] < wall_s  # round 23: recorded beside it
    assert loaded.device.name == "cpu" and loaded.device.peak_flops_per_s[torch.float32] > 1e8
    assert loaded.device.optimizer_bytes_per_s > 0
    # torch's pipelining runtime costs host CPU per action beyond the stage's op (2 ranks, 4 Linear(8, 8) stages)
    action = loaded.device.pipeline_action
    assert 0 < action.forward_s < wall_s and 0 < action.send_s < wall_s and 0 < action.recv_s < wall_s
    assert loaded.device.pipeline_action == profile.device.pipeline_action
    # the step efficiency is the reference step's priced / measured seconds, used for matmuls and memory alike
    m = json.loads(text)["measurements"]
    assert loaded.device.matmul_efficiency == loaded.device.memory_efficiency == m["step_efficiency"]
    # round 21: the reference step's host seconds per node (cost_model.host_cost) are priced apart, not by the factor
    assert m["op_host_s"] == loaded.device.op_host_s and m["op_host_bwd_s"] == loaded.device.op_host_bwd_s
    assert m["step_efficiency"] == pytest.approx(min(1.0, m["reference_priced_s"]
                                                     / (m["reference_step_s"] - m["reference_host_s"])))
    cluster = loaded.cluster(2)
    assert (cluster.num_nodes, cluster.devices_per_node) == (1, 2)
    topo = MeshTopology(cluster, (2,), ("dp",))
    # the size fit reproduces the measured median (made non-decreasing in size: min over larger sizes) at the upper
    # end of its segment; a flat segment (the 64 KiB and 1 MiB medians equal on a loaded machine) keeps the minimum
    # slope `_MIN_INV_BANDWIDTH` from its lower point, at most 1e-15 s/B x 1 MiB above it (the test failed once by
    # 4.9e-10 s of 4.8e-4 under rel=1e-6 alone)
    measured = json.loads(text)["measurements"]["collectives"]["2"]["all_gather"]
    expected = min(measured[str(1 << 20)], measured[str(1 << 22)])
    assert collective_time_s("all_gather", 1 << 20, topo, "dp") == pytest.approx(
        expected, rel=1e-6, abs=_MIN_INV_BANDWIDTH * (1 << 20))
    with pytest.raises(ValueError, match="calibrated: \\[2\\]"):
        loaded.cluster(4)


def _gloo_like_samples(n: int, truth: Link) -> list:
    return [(kind, n, nbytes, flat_collective_time_s(kind, nbytes, n, truth))
            for kind in ("all_reduce", "all_gather") for nbytes in (1 << 12, 1 << 16, 1 << 20, 1 << 24)]


def test_fit_link_per_kind_recovers_each_kinds_alpha_beta():
    # all_gather slower than the ring ratio to all_reduce says (as on gloo): one joint link cannot fit both.
    truth = Link("t", 50e-6, 2e9, per_kind={"all_gather": (80e-6, 0.7e9)})
    samples = _gloo_like_samples(4, truth)
    joint = fit_link(samples)
    assert joint.per_kind == {}
    fitted = fit_link(samples, name="gloo_x4", per_kind=True)
    assert (fitted.latency_s, fitted.bandwidth_bytes_per_s) == (joint.latency_s, joint.bandwidth_bytes_per_s)
    assert set(fitted.per_kind) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert fitted.per_kind["all_reduce"] == pytest.approx((50e-6, 2e9), rel=1e-6)
    assert fitted.per_kind["all_gather"] == pytest.approx((80e-6, 0.7e9), rel=1e-6)
    assert fitted.per_kind["reduce_scatter"] == fitted.per_kind["all_gather"]  # reused, not measured
    # The overrides reproduce every sample exactly; the joint fit does not.
    topo = MeshTopology(Cluster(H100_SXM, 1, 4, fitted, fitted), (4,), ("dp",))
    for kind, _, nbytes, seconds in samples:
        assert collective_time_s(kind, nbytes, topo, "dp") == pytest.approx(seconds, rel=1e-6)
    worst_joint = max(abs(flat_collective_time_s(k, b, 4, joint) - s) / s for k, _, b, s in samples)
    assert worst_joint > 0.1


def test_fit_link_per_kind_needs_two_sizes_per_kind():
    truth = Link("t", 50e-6, 2e9)
    samples = _gloo_like_samples(2, truth)[:-3]  # all_gather keeps one size
    with pytest.raises(ValueError, match="kind 'all_gather'.*>= 2 message sizes"):
        fit_link(samples, per_kind=True)


def _write_profile(path, links: dict, version: int = 2) -> None:
    path.write_text(json.dumps({
        "format_version": version, "torch_version": torch.__version__, "num_threads": 1,
        "device": {"name": "cpu", "peak_flops_per_s": {"float32": 1e11}, "hbm_bytes": 10**10,
                   "hbm_bytes_per_s": 1e10, "matmul_efficiency": 1.0, "memory_efficiency": 1.0,
                   "launch_overhead_s": 3e-6},
        "links": links, "measurements": {}}))


def _device(tmp_path):
    path = tmp_path / "device_only.json"
    _write_profile(path, {}, version=2)
    return load_profile(path).device


def test_profile_json_round_trips_per_kind_overrides(tmp_path):
    link = Link("gloo_x2", 90e-6, 1.8e9, per_kind={"all_reduce": (85e-6, 2.1e9), "all_gather": (60e-6, 0.9e9),
                                                   "reduce_scatter": (60e-6, 0.9e9)})
    profile = Profile(device=_device(tmp_path), links={2: link})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(profile, {}), sort_keys=True))
    data = json.loads(path.read_text())
    assert data["format_version"] == 3
    assert data["links"]["2"]["per_kind"]["all_gather"] == {"latency_s": 60e-6, "bandwidth_bytes_per_s": 0.9e9}
    loaded = load_profile(path)
    assert loaded == profile and hash(loaded.links[2]) == hash(link)
    assert loaded.links[2].per_kind["all_gather"] == (60e-6, 0.9e9)


def test_old_format_profile_without_per_kind_loads(tmp_path):
    path = tmp_path / "v1.json"
    _write_profile(path, {"2": {"name": "gloo_x2", "latency_s": 89.1e-6, "bandwidth_bytes_per_s": 1.78e9}}, version=1)
    profile = load_profile(path)
    link = profile.links[2]
    assert link == Link("gloo_x2", 89.1e-6, 1.78e9) and link.per_kind == {}
    topo = MeshTopology(profile.cluster(2), (2,), ("dp",))
    assert collective_time_s("all_gather", 1 << 20, topo, "dp") == pytest.approx(89.1e-6 + 0.5 * (1 << 20) / 1.78e9)


def test_unknown_profile_version_or_bad_override_says_recalibrate(tmp_path):
    path = tmp_path / "v9.json"
    _write_profile(path, {}, version=9)
    with pytest.raises(ValueError, match="not a version-1/2/3 profile.*re-run"):
        load_profile(path)
    _write_profile(path, {"2": {"name": "x", "latency_s": 1e-5, "bandwidth_bytes_per_s": 1e9,
                                "per_kind": {"all_gather": {"latency_s": 1e-5}}}})
    with pytest.raises(ValueError, match="re-run"):
        load_profile(path)


def test_calibrate_cli_says_reduce_scatter_reuses_all_gathers_fit(tmp_path, monkeypatch, capsys):
    """Issue 12 item 15: the printed summary named reduce-scatter figures equal to all-gather's as if measured."""
    import importlib

    calibration = importlib.import_module("cost_model.calibrate")  # the package re-exports calibrate()
    link = Link("gloo_x2", 90e-6, 1.8e9, per_kind={"all_reduce": (85e-6, 2.1e9), "all_gather": (60e-6, 0.9e9),
                                                   "reduce_scatter": (60e-6, 0.9e9)})
    profile = Profile(device=_device(tmp_path), links={2: link})
    monkeypatch.setattr(calibration, "calibrate", lambda **kwargs: profile)
    monkeypatch.setattr(calibration, "CALIBRATED_KINDS", ("all_reduce", "all_gather"))  # as before issue 13
    calibration.main(["-o", str(tmp_path / "p.json"), "--nprocs", "2"])
    printed = capsys.readouterr().out
    assert "all_gather alpha=60.0 us beta=0.90 GB/s" in printed
    assert "reduce_scatter = all_gather's fit (reused, not measured)" in printed
    assert "reduce_scatter alpha" not in printed


def test_measure_device_takes_medians_over_interleaved_rounds(monkeypatch):
    from cost_model import device_rounds as cal  # split from cost_model.calibrate in round 21 (re-exported there)
    calls = []
    rates = iter([1.0, 9.0, 2.0, 3.0])  # round 0 (warm-up: 1.0, dropped), then 9, 2, 3: median 3

    def fake_matmul(sizes):
        calls.append("matmul")
        return next(rates)
    monkeypatch.setattr(cal, "_measure_matmul_flops_per_s", fake_matmul)
    monkeypatch.setattr(cal, "_measure_memory_bytes_per_s", lambda n: calls.append("memory") or 5.0)
    monkeypatch.setattr(cal, "_measure_launch_overhead_s", lambda: calls.append("launch") or 1e-6)
    monkeypatch.setattr(cal, "measure_optimizer", lambda: calls.append("optimizer") or (4e9, 3e-5))
    got = cal.measure_device(rounds=3)
    assert got["matmul_flops_per_s"] == 3.0 and got["memory_bytes_per_s"] == 5.0
    assert got["optimizer_bytes_per_s"] == 4e9 and got["optimizer_tensor_s"] == 3e-5
    # interleaved, one warm-up round; the optimizer (a fresh process per call since round 19, which warms itself
    # up) is not measured in the warm-up round
    assert calls == ["matmul", "memory", "launch"] + ["matmul", "memory", "launch", "optimizer"] * 3
    # each quantity's split-half difference over its rounds (9, 2, 3: odd rounds 9, 3 -> 6; even 2 -> |6-2| / 3)
    assert got["matmul_flops_per_s_split_half"] == pytest.approx(4 / 3) and got["memory_bytes_per_s_split_half"] == 0
    with pytest.raises(ValueError, match="rounds=0"):
        cal.measure_device(rounds=0)


def test_step_efficiency_prices_the_reference_on_the_device_rates():
    """The reference step's price scales with the device's rates (roofline) and the efficiency is the
    clamped ratio of priced to measured seconds."""
    slow = dataclasses.replace(H100_SXM, kind="cpu", launch_overhead_s=0.0,
                               peak_flops_per_s={torch.float32: 1e11}, hbm_bytes_per_s=1e10)
    fast = dataclasses.replace(slow, peak_flops_per_s={torch.float32: 2e11}, hbm_bytes_per_s=2e10)
    priced = price_reference_s(slow)
    assert priced > 0 and price_reference_s(fast) == pytest.approx(priced / 2, rel=1e-9)
    assert step_efficiency(0.5, [1.0, 2.0, 0.9]) == pytest.approx(0.5)  # median 1.0
    assert step_efficiency(3.0, [1.0]) == 1.0  # clamped: the rates are an upper bound
    with pytest.raises(ValueError, match="positive"):
        step_efficiency(1.0, [])


def test_profile_clamps_a_measured_speed_up_of_concurrent_processes():
    """A contention factor below 1 is noise: the rank device is never faster than one process alone."""
    profile = Profile(device=_cpu_device(), links={2: Link("l", 1e-4, 1e9)}, contention={2: (0.65, 0.9, 0.5)})
    dev = profile.device_for(2)
    assert dev.peak_flops_per_s[torch.float32] == profile.device.peak_flops_per_s[torch.float32]
    assert dev.hbm_bytes_per_s == profile.device.hbm_bytes_per_s
    assert dev.optimizer_bytes_per_s == profile.device.optimizer_bytes_per_s


def test_profile_floors_contention_at_the_cores_share_with_more_processes_than_cores():
    """4 single-threaded processes on 2 cores each get half a core: every slowdown is >= 4 / 2 = 2. A profile
    measured AdamW at x1.46 with 4 processes on 2 cores (/tmp/r16/calC.json; another calibration of the same
    machine: x4.00): the rank device's optimizer rate is the solo rate / 2, and the pipeline search's sharing
    points are floored alike; 2 processes on 2 cores keep their measured factor (floor 1)."""
    from cost_model.contention import contention_floor
    assert contention_floor(4, 2) == 2.0 and contention_floor(2, 2) == 1.0 and contention_floor(3, 2) == 1.5
    assert contention_floor(4, None) == 1.0 and contention_floor(1, 8) == 1.0
    profile = Profile(device=_cpu_device(), links={n: Link("l", 1e-4, 1e9) for n in (2, 4)}, cpu_count=2,
                      contention={2: (1.01, 2.0, 1.09), 4: (2.26, 4.0, 1.46)})
    solo = profile.device.optimizer_bytes_per_s
    assert profile.device_for(4).optimizer_bytes_per_s == pytest.approx(solo / 2.0, rel=1e-12)
    assert profile.device_for(2).optimizer_bytes_per_s == pytest.approx(solo / 1.09, rel=1e-12)
    assert profile.device_for(4).peak_flops_per_s[torch.float32] == pytest.approx(
        profile.device.peak_flops_per_s[torch.float32] / 2.26, rel=1e-12)
    sharing = profile.cluster(4).sharing
    assert dict(sharing.optimizer_slowdown) == {2: 1.09, 4: 2.0}
    assert dict(sharing.compute_slowdown) == {2: 1.01, 4: 2.26}


def _cpu_device():
    import dataclasses
    return dataclasses.replace(H100_SXM, kind="cpu", optimizer_bytes_per_s=4e9)


def test_fit_link_takes_non_decreasing_medians_so_a_slowed_small_message_gives_no_negative_bandwidth():
    """Under load a small message's repeats can all be slowed (the smoke calibration under load 8-15 once fitted a
    negative inverse bandwidth from raw repeats and raised): the fit takes one median per size, made
    non-decreasing by a suffix minimum (noise only slows a sample down), as the size fits do."""
    from cost_model.calibrate import _fit_alpha_beta

    samples = [("all_gather", 2, 1 << 16, t) for t in (6e-3, 5e-3, 7e-3)] + \
              [("all_gather", 2, 1 << 20, t) for t in (1.0e-3, 1.1e-3, 0.9e-3)] + \
              [("all_gather", 2, 1 << 22, t) for t in (1.2e-3, 1.3e-3, 1.1e-3)]
    with pytest.raises(ValueError, match="non-positive inverse bandwidth"):
        _fit_alpha_beta(samples, "raw repeats")  # the fact behind: the raw repeats fit no bandwidth
    link = fit_link(samples, per_kind=True, size_fits=True)
    assert link.bandwidth_bytes_per_s > 0 and link.per_kind["all_gather"][1] > 0
    # through the suffix-minimum medians (1.0 ms at 64 KiB and 1 MiB, 1.2 ms at 4 MiB): 0.2 ms per (4 MiB - 1 MiB)
    # of all-gather bytes (ring factor 1/2 on 2 ranks); the least-squares line lies near it
    assert link.bandwidth_bytes_per_s == pytest.approx(0.5 * 3 * (1 << 20) / 0.2e-3, rel=0.5)


def test_a_device_count_the_profile_lacks_names_the_cli_remedy(tmp_path):
    """Round 13 (r13d): planning 4 devices on a profile calibrated for 2 said "Remedy: calibrate(nprocs=(4,))", a
    Python call, to a user of `parallelizer plan --cluster profile.json`."""
    profile = Profile(device=_device(tmp_path), links={2: Link("gloo_x2", 90e-6, 1.8e9)})
    with pytest.raises(ValueError, match=r"nprocs=4; calibrated: \[2\]") as info:
        profile.cluster(4)
    assert "`parallelizer calibrate -o PROFILE.json --nprocs 2 4`" in str(info.value)


def test_blocking_collectives_are_timed_through_the_functional_collectives_a_step_calls(monkeypatch):
    """Calibration times each blocking kind the way an emitted program calls it (`rewriter.collectives`: torch's
    functional collectives, out of place, waited on at once), not as an in-place `dist.all_reduce`; on 2 gloo
    ranks here the functional call costs 0.1-0.3 ms more CPU per call below 1 MiB (round 15, r15c)."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from cost_model import measure
    called = []

    def fake(name):
        def run(x, *args, **kwargs):
            called.append((name, x.numel()))
            return x.clone()
        return run

    for name in ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single"):
        monkeypatch.setattr(funcol, name, fake(name))
    for name in ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single", "send", "recv"):
        monkeypatch.setattr(dist, name, fake("c10d " + name))
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        measure._collective_op(kind, 4096, 0, 2)()
    measure._collective_op("send_recv", 4096, 0, 2)()
    # all_gather's bytes are its output's (a rank sends half), reduce_scatter's its input's: nccl-tests convention
    assert called == [("all_reduce", 1024), ("all_gather_single", 512), ("reduce_scatter_single", 1024),
                      ("all_to_all_single", 1024), ("c10d send", 1024)]


def test_calls_per_sample_grow_for_small_messages():
    from cost_model.measure import inner_for
    assert [inner_for(b, 1) for b in (4096, (1 << 20) - 4, 1 << 20, 4 << 20, (4 << 20) + 4, 64 << 20)] == \
        [16, 16, 4, 4, 1, 1]
    assert inner_for(4096, 20) == 20 and inner_for(16 << 20, 3) == 3


def test_sync_wait_is_the_last_exit_after_the_mean_entry_less_the_back_to_back_time():
    """`measure.sync_wait_s`: per call max_r exit - mean_r entry (the straggler's lag over the mean entry plus the
    collective once the last rank is in), median over calls, minus the back-to-back time, clamped at 0."""
    from cost_model.measure import sync_wait_s
    entries = [[0.0, 10.0, 20.0], [1.0, 10.0, 26.0]]  # ms; call 2: rank 1 enters 6 ms late
    exits = [[3.0, 12.0, 27.0], [3.0, 12.5, 27.0]]
    # per call: 3 - 0.5 = 2.5, 12.5 - 10 = 2.5, 27 - 23 = 4.0 -> median 2.5; back to back 1.0
    assert sync_wait_s(entries, exits, 1.0) == pytest.approx(1.5)
    assert sync_wait_s(entries, exits, 3.0) == 0.0  # never negative
    three = [[0.0], [0.0], [3.0]]  # 3 ranks: mean entry 1.0, last exit 5.0
    assert sync_wait_s(three, [[5.0], [5.0], [5.0]], 0.5) == pytest.approx(3.5)
    with pytest.raises(ValueError, match="same number"):
        sync_wait_s([[0.0, 1.0], [0.0]], [[1.0, 2.0], [1.0]], 0.0)
    with pytest.raises(ValueError, match="same number"):
        sync_wait_s([[], []], [[], []], 0.0)


def test_sync_wait_with_more_ranks_than_cores_leaves_the_stragglers_lag_to_the_contention_slowdown():
    """`measure.sync_wait_s(..., oversubscribed=True)`: per call max_r exit - max_r entry (what the collective takes
    once the last rank is in), median over calls, minus the back-to-back time: ranks taking turns on the cores
    enter late because the others computed, which the contention slowdown prices already."""
    from cost_model.measure import sync_wait_s
    entries = [[0.0, 10.0, 20.0], [1.0, 10.0, 26.0]]  # the same stamps as the test above
    exits = [[3.0, 12.0, 27.0], [3.0, 12.5, 27.0]]
    # per call: 3 - 1 = 2.0, 12.5 - 10 = 2.5, 27 - 26 = 1.0 -> median 2.0; back to back 1.0
    assert sync_wait_s(entries, exits, 1.0, oversubscribed=True) == pytest.approx(1.0)
    three = [[0.0], [0.0], [3.0]]  # last entry 3.0, last exit 5.0
    assert sync_wait_s(three, [[5.0], [5.0], [5.0]], 0.5, oversubscribed=True) == pytest.approx(1.5)
    assert sync_wait_s(three, [[5.0], [5.0], [5.0]], 2.5, oversubscribed=True) == 0.0


def test_pipeline_action_costs_round_trip_and_an_older_profile_gets_the_documented_default(tmp_path):
    """Round 16 (r16f): the device's `pipeline_action_s` is written and read back; a profile written before it
    gets `CPU_PIPELINE_ACTION` (measured on this machine, documented in cost_model.pipeline_actions); an
    unknown key or a negative value says to re-run calibration."""
    old = _device(tmp_path)
    assert old.pipeline_action == CPU_PIPELINE_ACTION and CPU_PIPELINE_ACTION.forward_s > 0
    cost = PipelineActionCost(forward_s=1e-4, backward_input_s=2e-4, backward_weight_s=3e-4, backward_s=4e-4,
                              send_s=5e-5, recv_s=6e-5, step_s=2e-3)
    profile = Profile(device=dataclasses.replace(old, pipeline_action=cost), links={})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(profile, {}), sort_keys=True))
    assert json.loads(path.read_text())["device"]["pipeline_action_s"]["backward_weight_s"] == 3e-4
    assert load_profile(path).device.pipeline_action == cost
    drift = compare_profiles(Profile(device=old, links={}), profile)  # `calibrate --compare` shows them too
    assert drift["pipeline action step_s"] == pytest.approx(2e-3 / CPU_PIPELINE_ACTION.step_s - 1)
    for bad in ({"forward_s": 1e-4, "fwd": 1e-4}, {"forward_s": -1e-4}):
        data = json.loads(path.read_text())
        data["device"]["pipeline_action_s"] = bad
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match="re-run"):
            load_profile(path)


def test_pipeline_action_cost_is_the_median_less_the_bare_op_and_scales_with_the_cores():
    cost = action_cost_from_samples({"F": [3e-4, 1e-4, 2e-4], "B": [1e-5], "send action": [4e-5, 6e-5],
                                     "recv action": [3e-5], "step loop": [1e-3, 3e-3]},
                                    {"F": [5e-5, 5e-5], "B": [2e-5]})
    assert tuple(getattr(cost, n) for n in cost.seconds_fields()) == pytest.approx(
        (1.5e-4, 0.0, 0.0, 0.0, 5e-5, 3e-5, 2e-3, 0.0, 0.0, 0.0, 0.0, 0.0))  # B clamped at 0; no "comm op" / "comm
    # byte" / "split node" / "first touch byte" / "split byte" samples: 0
    with pytest.raises(ValueError, match="finite seconds"):
        action_cost_from_samples({"F": [-1.0]}, {})
    with pytest.raises(ValueError, match="PipelineActionCost.send_s"):
        PipelineActionCost(send_s=-1e-6)
    # processes sharing the cores slow host work like launches: Profile.device_for(n) scales it by the factor
    assert H100_SXM.scaled(2.0, 1.0).pipeline_action.send_s == 2 * H100_SXM.pipeline_action.send_s
    assert H100_SXM.pipeline_action == GPU_PIPELINE_ACTION and GPU_PIPELINE_ACTION.forward_s == 0.0


def test_gloo_threads_cpu_per_p2p_op_is_measured_round_trips_and_an_older_profile_gets_the_documented_default(
        tmp_path):
    """Round 18: `comm_thread_s` (the communication library's own threads' CPU per P2P op, the process's CPU less
    the posting thread's over a step, per op posted) is the median of the "comm op" samples; it is written and
    read back; a profile written before round 18 (a `pipeline_action_s` without the key) gets
    `CPU_PIPELINE_ACTION.comm_thread_s` (measured, documented in cost_model.pipeline_actions), not 0."""
    cost = action_cost_from_samples({"comm op": [3e-4, 1e-4, 2e-4, 9e-4]}, {})
    assert cost.comm_thread_s == pytest.approx(2.5e-4) and cost.forward_s == 0.0
    assert CPU_PIPELINE_ACTION.comm_thread_s > 0
    old = _device(tmp_path)
    measured = dataclasses.replace(CPU_PIPELINE_ACTION, comm_thread_s=7e-5,
                                   own_runner=PipelineActionCost(forward_s=2e-4))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(Profile(device=dataclasses.replace(
        old, pipeline_action=measured), links={}), {}), sort_keys=True))
    assert json.loads(path.read_text())["device"]["pipeline_action_s"]["comm_thread_s"] == 7e-5
    assert load_profile(path).device.pipeline_action == measured
    data = json.loads(path.read_text())
    del data["device"]["pipeline_action_s"]["comm_thread_s"]
    path.write_text(json.dumps(data))
    older = load_profile(path).device.pipeline_action
    assert older.comm_thread_s == CPU_PIPELINE_ACTION.comm_thread_s
    assert older.own_runner == PipelineActionCost(forward_s=2e-4)  # nested: the simulator never reads its comm
    assert GPU_PIPELINE_ACTION.comm_thread_s == 0.0  # NCCL progresses on the device


def test_the_own_runners_costs_round_trip_and_a_profile_without_them_prices_bitpipe_at_torchs(tmp_path):
    """Round 17: `pipeline_action_s.own_runner` (the package's BitPipe runner, measured by `parallelizer calibrate`)
    is written, read back, compared and scaled with the rest; a profile without it (round 16's) still loads, and
    BitPipe is then priced at torch's figures (`for_schedule`); a nested own_runner of its own is refused."""
    old = _device(tmp_path)
    own = PipelineActionCost(forward_s=2e-4, backward_s=2.2e-4, send_s=8e-5, recv_s=9e-5, step_s=2e-3)
    torch_cost = PipelineActionCost(forward_s=1e-4, backward_s=1.1e-4, send_s=4e-5, recv_s=4.5e-5, step_s=3e-3)
    profile = Profile(device=dataclasses.replace(old, pipeline_action=dataclasses.replace(torch_cost, own_runner=own)),
                      links={})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(profile, {}), sort_keys=True))
    assert json.loads(path.read_text())["device"]["pipeline_action_s"]["own_runner"]["forward_s"] == 2e-4
    loaded = load_profile(path).device.pipeline_action
    assert loaded.own_runner == own and loaded.for_schedule("bitpipe") == own
    assert loaded.for_schedule("1f1b") == loaded.for_schedule("zbv") == loaded
    assert loaded.scaled(2.0).own_runner.forward_s == pytest.approx(4e-4)
    doubled = Profile(device=dataclasses.replace(old, pipeline_action=dataclasses.replace(
        torch_cost, own_runner=own.scaled(2.0))), links={})
    assert compare_profiles(profile, doubled)["pipeline action own runner forward_s"] == pytest.approx(1.0)
    # a round-16 profile: no own_runner key; it loads and BitPipe pays torch's figures, as before
    data = json.loads(path.read_text())
    del data["device"]["pipeline_action_s"]["own_runner"]
    path.write_text(json.dumps(data))
    older = load_profile(path).device.pipeline_action
    assert older.own_runner is None and older.for_schedule("bitpipe") == older == torch_cost
    assert "own_runner" not in _profile_to_json(Profile(device=dataclasses.replace(old, pipeline_action=torch_cost),
                                                        links={}), {})["device"]["pipeline_action_s"]
    with pytest.raises(ValueError, match="own_runner"):
        PipelineActionCost(own_runner=dataclasses.replace(torch_cost, own_runner=own))


def test_a_contention_reading_below_k_over_cores_is_raised_to_it():
    """Round 17: k single-threaded processes on fewer cores get at most cores / k of a core each, so the slowdown
    is >= k / cores; the x4 AdamW factor read 1.41 and 1.46 on 2 cores (impossible) in two of five calibrations of
    2026-12-03 and was priced as such. Clamped to [max(1, k / cores), k]."""
    assert contention_factor(1.0, [1 / 1.41] * 4, 4, 2) == pytest.approx(2.0)
    assert contention_factor(1.0, [1 / 2.3] * 4, 4, 2) == pytest.approx(2.3)
    assert contention_factor(1.0, [1 / 5.0] * 4, 4, 2) == pytest.approx(4.0)
    assert contention_factor(1.0, [1 / 0.7] * 2, 2, 2) == pytest.approx(1.0)
    assert contention_factor(1.0, [1 / 1.5] * 2, 2, 4) == pytest.approx(1.5)


def test_a_contention_window_keeps_every_process_busy_until_all_have_finished_it():
    """Round 17: after its counted window a process keeps computing until all k have finished theirs
    (`_keep_busy`), so no process's window ends with fewer than k competing; here the others finish after 3
    more calls of this one."""
    import multiprocessing

    done = multiprocessing.get_context("spawn").Value("i", 0)
    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 3:
            with done.get_lock():
                done.value += 3  # the other three processes finish their window
    _keep_busy(fn, done, 4)
    assert len(calls) == 3 and done.value == 4
    _keep_busy(fn, done, 5)  # the last of the next window: returns at once
    assert len(calls) == 3 and done.value == 5


def test_per_byte_and_split_backward_costs_are_measured_samples_and_an_older_profile_gets_the_documented_defaults(
        tmp_path):
    """Round 19: `comm_thread_per_byte_s` (gloo's threads per byte on each end of a P2P op, the slope between two
    message sizes) and `split_backward_per_node_s` (torch's split backward beyond a full one, per autograd node)
    are the medians of their "comm byte" / "split node" samples; both are written and read back; a profile
    written before round 19 gets `CPU_PIPELINE_ACTION`'s documented figures (measured on this machine), not 0;
    the GPU presets charge neither (NCCL progresses on the device; their host work hides under kernels)."""
    cost = action_cost_from_samples({"comm byte": [3e-10, 1e-10, 2e-10], "split node": [2e-5, 4e-5, 3e-5, 1e-5]}, {})
    assert cost.comm_thread_per_byte_s == pytest.approx(2e-10) and cost.split_backward_per_node_s == pytest.approx(2.5e-5)
    assert cost.comm_thread_s == 0.0 and cost.forward_s == 0.0
    assert CPU_PIPELINE_ACTION.comm_thread_per_byte_s > 0 and CPU_PIPELINE_ACTION.split_backward_per_node_s > 0
    measured = dataclasses.replace(CPU_PIPELINE_ACTION, comm_thread_per_byte_s=5e-10, split_backward_per_node_s=1e-5)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(Profile(device=dataclasses.replace(
        _device(tmp_path), pipeline_action=measured), links={}), {}), sort_keys=True))
    assert load_profile(path).device.pipeline_action == measured
    data = json.loads(path.read_text())
    for key in ("comm_thread_per_byte_s", "split_backward_per_node_s"):
        del data["device"]["pipeline_action_s"][key]
    path.write_text(json.dumps(data))
    older = load_profile(path).device.pipeline_action
    assert older.comm_thread_per_byte_s == CPU_PIPELINE_ACTION.comm_thread_per_byte_s
    assert older.split_backward_per_node_s == CPU_PIPELINE_ACTION.split_backward_per_node_s
    assert GPU_PIPELINE_ACTION.comm_thread_per_byte_s == 0.0 and GPU_PIPELINE_ACTION.split_backward_per_node_s == 0.0


def test_torchs_split_backward_costs_more_per_node_than_a_full_backward_on_this_cpu():
    """`_split_per_node` (the calibration's measurement; per-thread CPU, valid under load): torch's
    `stage_backward_input` + `stage_backward_weight` walk the stage's autograd graph in Python, so the split costs
    a positive amount per node beyond one full backward (round 19: 24 us per node at load ~40); a finite, > 0
    figure below 1 ms per node."""
    from cost_model.pipeline_actions import _split_per_node
    got = statistics.median(_split_per_node() for _ in range(3))
    assert 0 < got < 1e-3


def test_a_collective_sample_lasts_at_least_a_few_scheduler_slices():
    """Round 23 (r23c): calls per sample raised so a sample lasts >= MIN_SAMPLE_S at the warm-up's per-call seconds
    (samples under 5 ms had a 30% split-half difference in the idle pairs, 12% from 20 ms); never below inner_for,
    at most MAX_SAMPLE_CALLS, unchanged where one call is already long."""
    from cost_model.measure import MAX_SAMPLE_CALLS, MIN_SAMPLE_S, inner_for, sample_calls
    assert MIN_SAMPLE_S == 0.020
    assert sample_calls(64 << 10, 1, 0.27e-3) == 75  # ceil(20 / 0.27): x2 send_recv 64 KiB, 16 calls before
    assert sample_calls(1 << 20, 1, 1.9e-3) == 11  # x2 all_reduce 1 MiB: 4 calls (7.6 ms) before
    assert sample_calls(16 << 20, 1, 18e-3) == 2  # ceil(20 / 18)
    assert sample_calls(64 << 20, 1, 91e-3) == inner_for(64 << 20, 1) == 1  # one call already lasts 91 ms
    assert sample_calls(4096, 1, 1e-3) == 20 and sample_calls(4096, 1, 5e-3) == inner_for(4096, 1) == 16
    assert sample_calls(4096, 1, 1e-6) == MAX_SAMPLE_CALLS
    assert sample_calls(4096, 1, 0.0) == 16  # an unpaired send_recv rank timed no call: its floor
    with pytest.raises(ValueError, match="warmup_per_call_s=nan must be finite and >= 0 .* 4096-byte"):
        sample_calls(4096, 1, float("nan"))


def test_the_sync_measurement_records_how_far_apart_the_ranks_leave_the_collective():
    """Round 23 (r23c): `measure.exit_spread_s`, median over calls of max_r exit - min_r exit, recorded beside the
    sync wait (the test of where the 4-rank wait lies: after the collective, ranks leaving a wait apart, or inside
    it, every rank late together); pooled from the pass that measured the sync, as sync_s."""
    from cost_model.measure import exit_spread_s
    from cost_model.rounds import pool_passes
    exits = [[3.0, 12.0, 27.0], [3.0, 12.5, 27.0], [7.5, 17.0, 27.5]]  # ms; the third rank left late twice
    # per call: 4.5, 5.0, 0.5 -> median 4.5
    assert exit_spread_s(exits) == pytest.approx(4.5)
    assert exit_spread_s([[1.0], [1.0]]) == 0.0
    with pytest.raises(ValueError, match="same number"):
        exit_spread_s([[1.0, 2.0], [1.0]])
    one = {"samples": {"all_reduce": {4096: [1e-3]}}, "collective_cpu": {}, "comm_overlap": None, "sync_s": None}
    last = {**one, "comm_overlap": 0.5, "sync_s": 4e-3, "sync_exit_spread_s": 4.5e-3}
    assert pool_passes([one, last])["sync_exit_spread_s"] == 4.5e-3
    assert pool_passes([one, one])["sync_exit_spread_s"] is None
