"""Round 21 (r21c), issue 13 (two calibrations within 10%): every measurement spread over the calibration's passes,
and a per-pass reference matmul that leaves out a pass run in another machine state (cost_model.passes,
cost_model.rounds.deviating_passes / pool_rounds). Synthetic samples with closed forms; no real measuring."""
import dataclasses
import importlib
import json
import math
import random
import statistics
import types
import warnings

import pytest

from cost_model import host_cost
from cost_model import passes as passes_mod
from cost_model.calibrate import predicted_pass_drift
from cost_model.passes import pool_all, share, steal_fraction
from cost_model.rounds import deviating_passes, pool_rounds


def test_rounds_are_shared_over_the_passes_as_evenly_as_possible():
    assert share(5, 3) == [2, 2, 1] and share(1, 3) == [1, 0, 0] and share(10, 3) == [4, 3, 3] and share(9, 3) == [3] * 3
    assert sum(share(21, 3)) == 21 and share(0, 2) == [0, 0]
    with pytest.raises(ValueError, match="passes=0"):
        share(3, 0)


def test_a_pass_whose_reference_is_off_the_median_by_more_than_the_tolerance_is_the_odd_one_out():
    """References 100, 80, 102: median 100; pass 2 is -20% (> 10%), the other two a majority -> (1,). 100, 89, 111:
    two passes 11% off, one agrees: no majority, nothing dropped. Two passes: no median pass to compare with."""
    assert deviating_passes([100.0, 80.0, 102.0]) == (1,)
    assert deviating_passes([100.0, 80.0, 102.0], tolerance=0.25) == ()
    assert deviating_passes([100.0, 89.0, 111.0]) == ()
    assert deviating_passes([100.0, 50.0]) == ()
    assert deviating_passes([100.0, 100.0, 100.0, 60.0, 140.0]) == (3, 4)  # 3 of 5 agree
    with pytest.raises(ValueError, match="finite and > 0"):
        deviating_passes([100.0, 0.0, 100.0])


def test_pool_rounds_leaves_out_dropped_passes_unless_only_they_measured_a_quantity():
    """Passes 1, 1, 1 / 2, 2, 2 / 1, 1, 1: all pooled, median 1 and pass-half |1 - 2| / 1 = 1 (as pool_passes);
    pass 2 dropped, median 1 and pass-half 0 over six 1s. A key only the dropped pass measured keeps its rounds, and
    has no pass-half (None); predicted_pass_drift leaves such keys out of its median."""
    per = [{"a": [1.0] * 3}, {"a": [2.0] * 3, "b": [5.0, 7.0]}, {"a": [1.0] * 3}]
    whole = pool_rounds(per)
    assert whole["median"]["a"] == 1.0 and whole["pass_half"]["a"] == pytest.approx(1.0)
    got = pool_rounds(per, drop=(1,))
    assert got["samples"]["a"] == [1.0] * 6 and got["median"]["a"] == 1.0 and got["pass_half"]["a"] == 0.0
    assert got["kept"] == {"a": [0, 2], "b": [1]} and got["median"]["b"] == 6.0
    assert got["pass_half"]["b"] is None  # one pass measured it: no pass-half prediction (0 would read as agreement)
    # the split-half of b's rounds in order (5, 7): odd rounds 5, even rounds 7, over the median 6
    assert got["split_half"]["b"] == pytest.approx(2 / 6)
    assert predicted_pass_drift({"device_pass_half": {"x": None, "y": 0.3}, "contention_pass_half": {"z": 0.1},
                                 "collective_pass_half": {"2": {"all_reduce": {"4096": 0.2}}}}) == pytest.approx(0.2)


def _record(ref: float, scale: float, rng: random.Random, rounds: int = 7, sigma: float = 0.1) -> dict:
    """One synthetic pass: reference `ref` FLOP/s; every sample of every quantity `scale` x lognormal(0, sigma)."""
    draw = lambda: scale * rng.lognormvariate(0, sigma)  # noqa: E731
    return {"references": [ref], "steal": 0.0,
            "collectives": {2: {"samples": {"all_reduce": {4096: [draw() for _ in range(rounds)]}},
                                "collective_cpu": {}, "comm_overlap": None, "sync_s": None}},
            "device": {"matmul_flops_per_s": [draw() for _ in range(rounds)]}, "pipeline": None, "own_runner": None,
            "contention": None}


def test_leaving_out_a_slow_pass_removes_the_shift_it_gives_the_pooled_median():
    """Seeded synthetic calibrations: 3 passes x 7 rounds, round noise lognormal sigma 0.1; in run B pass 2 runs in a
    state 25% slower (every sample x 1.25, its reference matmul / 1.25). Pooled with it, B's log-median is shifted by
    the root q of 14 Phi(q / sigma) + 7 Phi((q - ln 1.25) / sigma) = 10.5 (the pool's middle sample: 0.0597, +6.2%);
    left out (the reference is 20% off the median pass, tolerance 10%), only the round noise remains: the mean
    |B / A - 1| of two medians of 21 and 14 lognormal rounds is sqrt(2 / pi) x sqrt(pi / 2 x sigma^2 x (1/21 + 1/14))
    = sigma x sqrt(1/21 + 1/14) = 0.0345. Both checked within 15% over 600 seeded pairs."""
    rng = random.Random(21)
    sigma, d = 0.1, math.log(1.25)
    phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    lo, hi = 0.0, d
    for _ in range(60):  # bisection: the left side grows with q
        q = (lo + hi) / 2
        lo, hi = (q, hi) if 14 * phi(q / sigma) + 7 * phi((q - d) / sigma) < 10.5 else (lo, q)
    shift_kept, shift_dropped, diffs = [], [], []
    for _ in range(600):
        a = [_record(1e11, 1.0, rng) for _ in range(3)]
        b = [_record(1e11, 1.0, rng), _record(1e11 / 1.25, 1.25, rng), _record(1e11, 1.0, rng)]
        kept = pool_all(b, (2,), tolerance=1e9)  # nothing off by more than 1e9: the round-20 pooling
        with pytest.warns(UserWarning, match="pass 2 of 3 ran in another machine state"):
            dropped = pool_all(b, (2,))
        assert dropped["dropped"] == (1,)
        shift_kept.append(math.log(kept["collectives"][2]["collectives"]["all_reduce"][4096]))
        shift_dropped.append(math.log(dropped["device"]["median"]["matmul_flops_per_s"]))
        diffs.append(abs(dropped["collectives"][2]["collectives"]["all_reduce"][4096]
                         / pool_all(a, (2,))["collectives"][2]["collectives"]["all_reduce"][4096] - 1))
    assert statistics.fmean(shift_kept) == pytest.approx(q, rel=0.15) and q == pytest.approx(0.0597, abs=5e-4)
    assert abs(statistics.fmean(shift_dropped)) < 0.1 * q  # no shift left (its own noise: 0.1 / sqrt(14 x 600))
    assert statistics.fmean(diffs) == pytest.approx(sigma * math.sqrt(1 / 21 + 1 / 14), rel=0.15)


def test_passes_all_off_the_median_with_no_majority_are_kept_with_a_warning():
    rng = random.Random(3)
    records = [_record(r, 1.0, rng) for r in (1.0e11, 0.85e11, 1.2e11)]
    with pytest.warns(UserWarning, match="no majority of passes agrees.*calibrate again on an idle machine"):
        got = pool_all(records, (2,))
    assert got["dropped"] == () and got["references"] == [1.0e11, 0.85e11, 1.2e11]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # passes within the tolerance: no warning
        pool_all([_record(r, 1.0, rng) for r in (1.0e11, 0.95e11, 1.05e11)], (2,))
    with pytest.raises(ValueError, match="reference"):
        pool_all([{**records[0], "references": []}], (2,))


def test_steal_is_the_hypervisors_share_of_all_cpu_time_between_two_readings(tmp_path):
    """/proc/stat's first line: user nice system idle iowait irq softirq steal ...; the share is Δsteal / Δ(sum of the
    first 8): (100 - 40) / (1100 - 700) = 60 / 400."""
    path = tmp_path / "stat"
    path.write_text("cpu  300 0 100 200 50 0 10 40 0 0\ncpu0 1 2 3\n")
    before = passes_mod._cpu_jiffies(str(path))
    path.write_text("cpu  500 0 200 250 50 0 0 100 0 0\n")
    after = passes_mod._cpu_jiffies(str(path))
    assert before == (40, 700) and after == (100, 1100)
    assert steal_fraction(before, after) == pytest.approx(60 / 400)
    assert steal_fraction(None, after) is None and passes_mod._cpu_jiffies(str(tmp_path / "none")) is None


def test_calibrate_spreads_every_measurement_over_its_passes_and_leaves_out_a_slow_one(monkeypatch, tmp_path):
    """calibrate() with 3 passes: each pass measures x2 and x4 collectives (7 rounds, large messages 2; the last pass
    also comm_overlap and sync), then its share of 5 device rounds (2, 2, 1), of 10 pipeline steps (4, 3, 3) and of 9
    contention windows (3, 3, 3), a reference matmul before every block; the own runner once, in pass 2. Pass 2's
    reference (and every quantity it measured) is 30% slower: it is dropped with a warning, and each quantity is the
    median of passes 1 and 3 (stubbed measurements)."""
    cal = importlib.import_module("cost_model.calibrate")  # the module (cost_model.calibrate is also a function)
    order, state = [], {"pass": 0}
    slow = lambda: 1.3 if state["pass"] == 2 else 1.0  # noqa: E731

    def reference():
        order.append("ref")
        return 1e11 / slow()

    def collectives(n, kinds, sizes, repeats, large_repeats, extras):
        if n == 2:
            state["pass"] += 1
        order.append((f"x{n}", repeats, large_repeats, extras))
        return {"samples": {k: {s: [slow() * (s * 1e-9 + 1e-4)] * repeats for s in sizes} for k in kinds},
                "collective_cpu": {k: {s: 1e-5 for s in sizes} for k in kinds},
                "comm_overlap": 0.5 if extras else None, "sync_s": 1e-4 if extras else None}

    def device(sizes, numel, rounds, host):
        order.append(("device", rounds, host))
        return {k: [v / slow() if k.endswith("per_s") else v * slow()] * rounds for k, v in
                {"matmul_flops_per_s": 1e10, "memory_bytes_per_s": 1e10, "launch_overhead_s": 1e-6,
                 "optimizer_bytes_per_s": 5e9, "optimizer_tensor_s": 3e-5, "reference_step_s": 0.2,
                 "op_host_slope_s": 2e-5, "op_host_bwd_slope_s": 3e-5}.items()}

    def pipeline(steps):
        order.append(("pipeline", steps))
        return {"samples": {"F": [slow() * 2e-4] * steps, "send action": [slow() * 5e-5] * steps},
                "bare": {"F": [1e-4] * steps}}

    def contention(counts, rounds):
        order.append(("contention", rounds))
        return {2: (slow(), 1.0, 1.0), 4: (2.0 * slow(), 2.0, 2.0)}
    monkeypatch.setattr(passes_mod, "reference_flops_per_s", reference)
    monkeypatch.setattr(passes_mod, "measure_collectives", collectives)
    monkeypatch.setattr(passes_mod, "measure_device_rounds", device)
    monkeypatch.setattr(passes_mod, "HostPrograms", types.SimpleNamespace(build=lambda: "host programs"))  # built once
    monkeypatch.setattr(passes_mod, "measure_pipeline_action_samples", pipeline)
    monkeypatch.setattr(passes_mod, "measure_own_runner", lambda: order.append("own runner") or cal.CPU_PIPELINE_ACTION)
    monkeypatch.setattr(passes_mod, "measure_contention", contention)
    monkeypatch.setattr(cal, "price_reference_s", lambda rates: 0.1)
    path = tmp_path / "p.json"
    with pytest.warns(UserWarning, match="pass 2 of 3 ran in another machine state.*-23%"):
        profile = cal.calibrate(nprocs=(2, 4), out_path=path, progress=False,
                                message_sizes_bytes=(1 << 12, 1 << 20, 1 << 26))

    def one_pass(i, device_rounds, steps):
        last = i == 3
        return (["ref", ("x2", 7, 2, last), "ref", ("x4", 7, 2, last), "ref",
                 ("device", device_rounds, "host programs"), "ref",
                 ("pipeline", steps)] + (["own runner"] if i == 2 else []) + ["ref", ("contention", 3)])
    assert order == one_pass(1, 2, 4) + one_pass(2, 2, 3) + one_pass(3, 1, 3)
    m = json.loads(path.read_text())["measurements"]
    assert m["passes_dropped"] == [2] and m["pass_reference_flops_per_s"] == [1e11, 1e11 / 1.3, 1e11]
    assert len(m["pass_steal"]) == 3
    # every quantity is passes 1 and 3's value: pass 2's x1.3 is left out
    assert m["collectives"]["2"]["all_reduce"][str(1 << 20)] == pytest.approx((1 << 20) * 1e-9 + 1e-4)
    assert profile.device.peak_flops_per_s and m["matmul_flops_per_s"] == 1e10 and m["optimizer_tensor_s"] == 3e-5
    assert profile.device.pipeline_action.forward_s == pytest.approx(1e-4)
    assert profile.device.pipeline_action.send_s == pytest.approx(5e-5)
    assert profile.device.pipeline_action.own_runner == cal.CPU_PIPELINE_ACTION  # kept, with a warning
    assert profile.contention == {2: (1.0, 1.0, 1.0), 4: (2.0, 2.0, 2.0)}
    assert m["pass_half_median"] == 0.0 and m["device_pass_half"]["matmul_flops_per_s"] == 0.0
    assert profile.comm_overlap == {2: 0.5, 4: 0.5} and profile.collective_sync == {2: 1e-4, 4: 1e-4}
    # round 22: the host seconds per node come from the pooled device rounds' slopes, less the priced slope
    assert m["op_host_slope_s"] == 2e-5 and m["device_pass_half"]["op_host_slope_s"] == 0.0
    priced = dataclasses.replace(profile.device, matmul_efficiency=1.0, memory_efficiency=1.0, op_host_s=0.0,
                                 op_host_bwd_s=0.0)
    want = host_cost.op_host_from_slopes(priced, None, 2e-5, 3e-5)
    assert (profile.device.op_host_s, profile.device.op_host_bwd_s) == pytest.approx(want) and 0 < want[0] < 2e-5
    with pytest.raises(ValueError, match="collective_passes=0"):
        cal.calibrate(nprocs=(2,), progress=False, collective_passes=0)
