"""Step-time model (issue 13 item 6): piecewise collective fits, contention, overlapped gradient sync, optimizer
step, and a plan's step estimate -- closed forms only, no timing."""
import dataclasses
import math

import pytest
import torch

from cost_model import Cluster, MeshTopology, collective_time_s
from cost_model.calibrate import Profile, _profile_to_json, compare_profiles, fit_link, fit_size_segments, load_profile
from cost_model.communication import alpha_beta_coefficients, flat_collective_time_s, overlapped_comm_exposed_s
from cost_model.compute import optimizer_step_time_s
from cost_model.hardware import DeviceSpec
from cost_model.topology import Link

CPU = DeviceSpec("cpu", {torch.float32: 1e11}, 10**10, 1e10, 1.0, 1.0, 2e-6, kind="cpu",
                 optimizer_bytes_per_s=4e9, optimizer_tensor_s=40e-6)


def test_size_segments_reproduce_every_median_and_extrapolate_with_the_last_slope():
    # a library that is fast on small messages and slows down above 4 MiB (as gloo on a shared CPU)
    sizes = (1 << 12, 1 << 20, 1 << 22, 1 << 26)
    seconds = (100e-6, 1.1e-3, 4.2e-3, 60e-3)
    samples = [(4, b, t) for b, t in zip(sizes, seconds)] + [(4, 1 << 20, 9.0)]  # + an outlier: the median wins
    samples += [(4, 1 << 20, 1.1e-3)]
    segments = fit_size_segments(samples, "all_gather")
    assert [s[0] for s in segments] == [float(b) for b in sizes[1:]]
    link = Link("x4", 1e-4, 1e9, size_fits={"all_gather": segments})
    for b, t in zip(sizes, seconds):
        assert flat_collective_time_s("all_gather", b, 4, link) == pytest.approx(t, rel=1e-9)
    steps, factor = alpha_beta_coefficients("all_gather", 4)
    slope = (seconds[3] - seconds[2]) / (sizes[3] - sizes[2])
    big = 1 << 28
    assert flat_collective_time_s("all_gather", big, 4, link) == pytest.approx(seconds[3] + slope * (big - sizes[3]))
    # other kinds keep the link's own alpha/beta
    assert flat_collective_time_s("all_reduce", 1 << 20, 4, link) == pytest.approx(6 * 1e-4 + 1.5 * (1 << 20) / 1e9)


def test_size_segments_make_medians_monotone_and_clamp_negative_latency():
    # a larger message measured faster: the smaller one is taken as disturbed and priced like the larger one;
    # a steep first segment keeps alpha >= 0
    segments = fit_size_segments([(2, 1 << 10, 1e-6), (2, 1 << 20, 2e-3), (2, 1 << 22, 1.5e-3)], "all_reduce")
    link = Link("x2", 1e-4, 1e9, size_fits={"all_reduce": segments})
    assert all(alpha >= 0 for _, alpha, _ in segments)
    assert flat_collective_time_s("all_reduce", 1 << 22, 2, link) == pytest.approx(1.5e-3, rel=1e-5)
    assert flat_collective_time_s("all_reduce", 1 << 20, 2, link) == pytest.approx(1.5e-3, rel=1e-9)
    with pytest.raises(ValueError, match=">= 2 message sizes"):
        fit_size_segments([(2, 1 << 10, 1e-6)], "all_reduce")


def test_fit_link_size_fits_every_kind_and_reduce_scatter_borrows_all_gather():
    truth = Link("t", 50e-6, 2e9)
    samples = [(k, 2, b, flat_collective_time_s(k, b, 2, truth)) for k in ("all_reduce", "all_gather")
               for b in (1 << 12, 1 << 20, 1 << 24)]
    link = fit_link(samples, per_kind=True, size_fits=True)
    assert set(link.size_fits) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert link.size_fits["reduce_scatter"] == link.size_fits["all_gather"]
    topo = MeshTopology(Cluster(CPU, 1, 2, link, link), (2,), ("dp",))
    assert collective_time_s("all_reduce", 1 << 22, topo, "dp") == pytest.approx(
        flat_collective_time_s("all_reduce", 1 << 22, 2, truth), rel=1e-9)


@pytest.mark.parametrize("fits,match", [
    ({"gather": ((1.0, 1e-6, 1e9),)}, "size_fits key 'gather'"),
    ({"all_gather": ((2.0, 1e-6, 1e9), (1.0, 1e-6, 1e9))}, "strictly increasing"),
    ({"all_gather": ((1.0, 1e-6, 0.0),)}, r"size_fits\['all_gather'\]\[0\]\.bandwidth"),
])
def test_bad_size_fits_name_the_entry(fits, match):
    with pytest.raises(ValueError, match=match):
        Link("x", 1e-6, 1e9, size_fits=fits)


def test_overlapped_comm_exposed_closed_forms():
    # buckets ready at 10 and 30 ms of a 40 ms backward, 15 ms each: the first hides, the second ends at 45 ms
    assert overlapped_comm_exposed_s([0.010, 0.030], [0.015, 0.015], 0.040) == pytest.approx(0.005)
    # sequential engine: the second waits for the first (ends 0.010+0.030=0.040, then +0.015 = 0.055)
    assert overlapped_comm_exposed_s([0.010, 0.012], [0.030, 0.015], 0.040) == pytest.approx(0.015)
    # nothing overlaps: everything in full; partly: the mix
    assert overlapped_comm_exposed_s([0.010, 0.030], [0.015, 0.015], 0.040, overlap=0.0) == pytest.approx(0.030)
    assert overlapped_comm_exposed_s([0.010, 0.030], [0.015, 0.015], 0.040, overlap=0.5) == pytest.approx(
        0.5 * 0.005 + 0.5 * 0.030)
    # a bucket ready at the very end is exposed in full
    assert overlapped_comm_exposed_s([0.040], [0.02], 0.040) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="2 ready times but 1"):
        overlapped_comm_exposed_s([0.0, 0.1], [0.1], 0.2)


def test_optimizer_step_is_memory_bound_traffic_plus_per_tensor_cost():
    # fp32 AdamW: (4, 4, 8) B/element -> 2*4 + 4 + 2*8 = 28 B of traffic per element
    assert optimizer_step_time_s(10**6, 3, (4, 4, 8), CPU) == pytest.approx(28e6 / 4e9 + 3 * 40e-6)
    gpu = dataclasses.replace(CPU, optimizer_bytes_per_s=None, optimizer_tensor_s=0.0)
    assert optimizer_step_time_s(10**6, 3, (2, 4, 12), gpu) == pytest.approx((4 + 4 + 24) * 1e6 / 1e10)
    assert optimizer_step_time_s(0, 0, (4, 4, 8), CPU) == 0.0


def test_profile_device_for_divides_rates_by_measured_contention(tmp_path):
    link = Link("gloo_x4", 1e-4, 1e9, size_fits={"all_reduce": ((1e6, 1e-4, 1e9), (1e8, 2e-4, 0.5e9))})
    # 4 cores: the factors are not floored (`contention_floor`: 4 processes on 2 cores would be >= 2)
    profile = Profile(CPU, {4: link}, contention={4: (2.0, 1.5)}, comm_overlap={4: 0.25}, cpu_count=4)
    dev = profile.cluster(4).device
    assert dev.peak_flops_per_s[torch.float32] == pytest.approx(0.5e11)
    # AdamW at 4 of 10 GB/s is bound by the core: it slows down as compute does
    assert (dev.hbm_bytes_per_s, dev.optimizer_bytes_per_s) == pytest.approx((1e10 / 1.5, 4e9 / 2.0))
    fast_opt = dataclasses.replace(profile, device=dataclasses.replace(CPU, optimizer_bytes_per_s=8e9))
    assert fast_opt.device_for(4).optimizer_bytes_per_s == pytest.approx(8e9 / 1.5)  # memory-bound: memory factor
    measured = dataclasses.replace(profile, contention={4: (2.0, 1.5, 3.0)})  # the AdamW step's own slowdown
    assert measured.device_for(4).optimizer_bytes_per_s == pytest.approx(4e9 / 3.0)
    assert dev.launch_overhead_s == pytest.approx(4e-6) and dev.comm_overlap == 0.25
    path = tmp_path / "p.json"
    import json
    path.write_text(json.dumps(_profile_to_json(profile, {}), sort_keys=True))
    loaded = load_profile(path)
    assert loaded == profile
    assert compare_profiles(profile, loaded) and all(v == 0 for v in compare_profiles(profile, loaded).values())
    slower = dataclasses.replace(profile, contention={4: (2.2, 1.5)})
    assert compare_profiles(profile, slower)["x4 contention matmul"] == pytest.approx(0.1)
    path.write_text(json.dumps(_profile_to_json(measured, {}), sort_keys=True))
    assert load_profile(path).contention == {4: (2.0, 1.5, 3.0)}


def test_estimate_step_time_of_a_ddp_plan_is_compute_plus_exposed_sync_plus_adamw():
    import parallelizer
    from parallelizer import zoo
    from parallelizer.planner.steptime import estimate_step_time

    link = Link("gloo_x2", 1e-4, 1e9)
    cluster = Cluster(dataclasses.replace(CPU, comm_overlap=0.0), 1, 2, link, link)
    traced = parallelizer.trace(*zoo.mlp(in_features=16, dim=32, hidden=64, depth=1, batch=8))
    plan = parallelizer.plan(traced, {"dp": 2}, cluster=cluster, axis_roles={"dp": "ddp"})
    est = estimate_step_time(traced, plan, cluster=cluster)
    numel = sum(p.numel for p in traced.parameters.values() if not p.is_buffer)
    grad_bytes = 4 * numel  # all gradients fit the first 1 MiB bucket: one all-reduce of all of them
    assert est.buckets == 1
    assert est.grad_sync_exposed_s == pytest.approx(2 * 1e-4 + grad_bytes / 1e9)  # overlap 0: in full
    assert est.optimizer_s == pytest.approx(28 * numel / 4e9 + len(plan.params) * 40e-6)
    assert est.total_s == pytest.approx(est.forward_compute_s + est.backward_compute_s + est.blocking_comm_s
                                        + est.grad_sync_exposed_s + est.optimizer_s)
    unbucketed = estimate_step_time(traced, plan, cluster=cluster, bucket_bytes=0)
    assert unbucketed.buckets == 0 and unbucketed.blocking_comm_s > est.blocking_comm_s
    assert est.grad_sync_s == est.grad_sync_exposed_s  # one bucket, overlap 0
    per_param = unbucketed.blocking_comm_s - est.blocking_comm_s  # one all-reduce per parameter: more latencies
    assert per_param == pytest.approx(len(plan.params) * 2 * 1e-4 + grad_bytes / 1e9)


def test_collective_sync_is_added_to_every_collective_and_bucket():
    import parallelizer
    from parallelizer import zoo
    from parallelizer.planner.steptime import estimate_step_time

    link = Link("gloo_x2", 1e-4, 1e9)
    device = dataclasses.replace(CPU, comm_overlap=0.0)
    plain, synced = (Cluster(dataclasses.replace(device, collective_sync_s=s), 1, 2, link, link) for s in (0.0, 2e-3))
    traced = parallelizer.trace(*zoo.mlp(in_features=16, dim=32, hidden=64, depth=1, batch=8))
    plan = parallelizer.plan(traced, {"dp": 2}, cluster=plain, axis_roles={"dp": "ddp"})
    a, b = (estimate_step_time(traced, plan, cluster=c, bucket_bytes=0) for c in (plain, synced))
    # unbucketed: one all-reduce per parameter gradient, the batch all-gather of the output (forward); each waits
    # 2 ms x min(1, compute since the previous collective / the calibration's chunk) (round 20, `sync_wait_s`):
    # every gap of this small MLP is under the chunk, so the waits sum to 2 ms x all the compute / chunk
    from cost_model.communication import sync_chunk_s
    compute, chunk = b.forward_compute_s + b.backward_compute_s, sync_chunk_s(synced.device)
    assert compute < chunk
    assert b.blocking_comm_s - a.blocking_comm_s == pytest.approx(2e-3 * compute / chunk)
    # the ILP charges the full wait to each (it prices an edge without the program's order)
    collectives = len(plan.params) + sum(st.fwd_collective is not None for e in plan.edges for st in e.steps)
    synced_plan = parallelizer.plan(traced, {"dp": 2}, cluster=synced, axis_roles={"dp": "ddp"})
    assert synced_plan.cost.total_s - plan.cost.total_s >= 2e-3 * (collectives - len(plan.params)) - 1e-12
    a, b = (estimate_step_time(traced, plan, cluster=c) for c in (plain, synced))
    assert b.buckets == a.buckets == 1 and b.grad_sync_s - a.grad_sync_s == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="collective_sync_s"):
        dataclasses.replace(CPU, collective_sync_s=-1.0)


def test_profile_collective_sync_round_trips_and_prices_its_process_count(tmp_path):
    import json
    link = Link("gloo_x4", 1e-4, 1e9, size_fits={"all_reduce": ((1e6, 1e-4, 1e9),)})
    profile = Profile(CPU, {2: link, 4: link}, collective_sync={4: 3e-3}, cpu_count=2)
    assert profile.device_for(4).collective_sync_s == 3e-3 and profile.device_for(2).collective_sync_s == 0.0
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(profile, {}), sort_keys=True))
    assert load_profile(path) == profile
    later = dataclasses.replace(profile, collective_sync={4: 4e-3})
    base = flat_collective_time_s("all_reduce", 4096, 4, link) + 3e-3
    assert compare_profiles(profile, later)["x4 collective_sync (of a 4 KiB all_reduce)"] == pytest.approx(1e-3 / base)


def test_recomputation_costs_the_planners_extra_forward_and_repeats_tensor_parallel_collectives():
    import parallelizer
    from parallelizer import zoo
    from parallelizer.planner.steptime import estimate_step_time

    link = Link("gloo_x2", 1e-4, 1e9)
    cluster = Cluster(CPU, 1, 2, link, link)
    traced = parallelizer.trace(*zoo.gpt2(n_layer=2, batch=4, seq_len=16, labels=True))
    est = {}
    for mode in ("none", "selective", "full"):
        plan = parallelizer.plan(traced, {"dp": 2}, cluster=cluster, axis_roles={"dp": "ddp"}, recompute=mode)
        est[mode] = (plan, estimate_step_time(traced, plan, cluster=cluster))
    (none_plan, none), (full_plan, full) = est["none"], est["full"]
    assert none.recompute_s == 0 and 0 < est["selective"][1].recompute_s < full.recompute_s
    # ddp: no collective inside a block, so the extra time is the planner's own extra forward (price_region)
    assert full.recompute_s == pytest.approx(full_plan.cost.compute_s - none_plan.cost.compute_s, rel=1e-9)
    assert full.total_s - none.total_s == pytest.approx(full.recompute_s, rel=1e-9)
    slow_link = Link("slow", 1e-3, 1e9)
    slow = Cluster(CPU, 1, 2, slow_link, slow_link)
    assert estimate_step_time(traced, full_plan, cluster=slow).recompute_s == pytest.approx(full.recompute_s)
    tp = parallelizer.plan(traced, {"tp": 2}, cluster=cluster, axis_roles={"tp": "tp"})
    tp_full = dataclasses.replace(tp, recompute=dict.fromkeys(full_plan.recompute, "full"))
    plain, again = estimate_step_time(traced, tp, cluster=cluster), estimate_step_time(traced, tp_full, cluster=cluster)
    assert again.total_s - plain.total_s == pytest.approx(again.recompute_s, rel=1e-9)
    # the tensor-parallel all-reduces inside the blocks run again: a slower link makes recomputation dearer
    assert estimate_step_time(traced, tp_full, cluster=slow).recompute_s > again.recompute_s > 0


def test_pipeline_plan_is_the_searchs_simulated_step_plus_the_busiest_ranks_adamw():
    import parallelizer
    from parallelizer import zoo
    from parallelizer.planner.steptime import estimate_step_time

    link = Link("gloo_x2", 1e-4, 1e9)
    cluster = Cluster(CPU, 1, 2, link, link)
    traced = parallelizer.trace(*zoo.gpt2(n_layer=2, batch=2, seq_len=16))
    plan = parallelizer.plan(traced, {"pp": 2}, cluster=cluster, schedule="1f1b", microbatches=2)
    est = estimate_step_time(traced, plan, cluster=cluster)
    assert est.pipeline_s == plan.pipeline.estimate.step_s > 0
    trainable = [p for p in plan.params.values() if not p.is_buffer]
    from cost_model.memory import bytes_per_param
    whole = optimizer_step_time_s(sum(math.prod(p.local_shape) for p in trainable), len(trainable),
                                  bytes_per_param("fp32", "adamw"), CPU)
    # each rank steps its stage's parameters; the tied wte / lm_head weight is on both ranks
    assert whole / 2 < est.optimizer_s < whole
    assert est.total_s == pytest.approx(est.pipeline_s + est.optimizer_s)
