"""Round 19 (r19b), issue 13 criterion 6 (two calibrations agree within 10%): the split-half estimate of a
median-of-rounds measurement's spread, and the AdamW rate measured in fresh processes with a pinned allocator."""
import os
import random
import statistics

import pytest

from cost_model import measure
from cost_model.calibrate import predicted_drift
from cost_model.measure import measure_optimizer, measure_optimizer_processes, split_half_difference


def test_split_half_difference_of_synthetic_rounds_has_the_known_answer():
    """Odd rounds (1st, 3rd, ...) against even rounds, over the median of all: 1, 3, 1, 3, 1, 3 -> |1 - 3| / 2."""
    assert split_half_difference([1.0, 3.0, 1.0, 3.0, 1.0, 3.0]) == pytest.approx(1.0)
    assert split_half_difference([2.0, 4.0, 6.0, 4.0, 2.0]) == pytest.approx(abs(2 - 4) / 4)  # odd 2,6,2 -> 2
    assert split_half_difference([5.0] * 7) == 0.0 and split_half_difference([5.0]) == 0.0
    with pytest.raises(ValueError, match="finite"):
        split_half_difference([1.0, float("nan")])


def test_split_half_difference_predicts_the_difference_of_two_runs_times_sqrt_two():
    """Two medians of n iid samples differ by about the split-half difference of one run / sqrt(2) (each half has
    n / 2 samples: twice the variance of a full-run median, and the difference of two halves twice that again).
    Seeded lognormal samples (the shape of timings), 4,000 trials of 2 runs x 10 rounds: the mean split-half over the
    mean |run 1 - run 2| / median is sqrt(2) within 15% (sampling error of the ratio at 4,000 trials: ~3%)."""
    rng = random.Random(19)
    halves, runs = [], []
    for _ in range(4000):
        a = [rng.lognormvariate(0, 0.3) for _ in range(10)]
        b = [rng.lognormvariate(0, 0.3) for _ in range(10)]
        halves.append(split_half_difference(a))
        runs.append(abs(statistics.median(a) - statistics.median(b)) / statistics.median(a))
    assert statistics.fmean(halves) / statistics.fmean(runs) == pytest.approx(2 ** 0.5, rel=0.15)


def test_predicted_drift_is_the_median_over_the_device_and_collective_split_halves():
    m = {"matmul_flops_per_s": 1e10, "matmul_flops_per_s_split_half": 0.10, "optimizer_bytes_per_s_split_half": 0.30,
         "collective_split_half": {"2": {"all_reduce": {"4096": 0.02, "65536": 0.50}}, "4": {"send_recv": {"4096": 0.2}}}}
    assert predicted_drift(m) == pytest.approx(0.2)  # median of 0.10, 0.30, 0.02, 0.50, 0.2
    assert predicted_drift({"matmul_flops_per_s": 1e10}) is None  # a profile written before round 19


def test_the_optimizer_rate_is_the_median_over_its_processes(monkeypatch):
    got = [{"optimizer_bytes_per_s": r, "optimizer_tensor_s": t, "minor_faults_per_step": 0, "pinned": True, "pid": i}
           for i, (r, t) in enumerate([(4e9, 3e-5), (11e9, 2e-5), (10e9, 4e-5)])]
    monkeypatch.setattr(measure, "measure_optimizer_processes", lambda numel, small, processes: got[:processes])
    assert measure_optimizer(processes=3) == (10e9, 3e-5)
    with pytest.raises(ValueError, match="processes=0"):
        measure_optimizer_processes(processes=0)


@pytest.mark.timeout(600)  # a hang guard: 2 spawned processes (import torch each); ~10 s idle
def test_adamw_is_measured_in_fresh_processes_whose_temporaries_reuse_heap_memory():
    """Before round 19 the AdamW rate was measured in the caller's process, where glibc's dynamic malloc thresholds
    left 8 of 12 fresh processes faulting in the step's two 16 MiB temporaries on every step (8,160 minor faults
    per step) and 4 not: a rate 2-3x apart by process. Each measurement now runs in its own spawned process
    (not this one) with the allocator pinned: 0 faults per step (a count, so it holds under any load)."""
    got = measure_optimizer_processes(processes=2)
    assert len({g["pid"] for g in got}) == 2 and os.getpid() not in {g["pid"] for g in got}
    for g in got:
        assert g["pinned"] is True
        assert g["minor_faults_per_step"] < 100  # faulting state: 8,160 (two 16 MiB temporaries of 4 KiB pages)
        assert g["optimizer_bytes_per_s"] > 0 and g["optimizer_tensor_s"] > 0


def _adamw_faults_per_step() -> float:
    """Minor page faults per AdamW step of one 4M-element tensor (two 16 MiB temporaries per step), after 2 warm-up
    steps (in a spawned measuring process)."""
    return measure._optimizer_step_s([1 << 22])[1]


@pytest.mark.timeout(600)  # a hang guard: 1 spawned process (import torch); ~5 s idle
def test_a_gloo_measuring_process_runs_kernels_on_reused_heap_memory():
    """The collectives' and pipeline actions' measuring processes (`gloo_worker`) pin the allocator too: a kernel
    with 16 MiB temporaries (AdamW, as the functional collectives' 4-16 MiB fresh outputs) takes no page faults per
    call there. Unpinned, 8,160 per step in 8 of 12 fresh processes (round 19); under load 24-44 the collectives'
    4 MiB calls took 248-888 faults per call in 4 of 4 unpinned runs and 0 in 4 of 4 pinned ones."""
    assert measure._run_spawned(_gloo_body_worker, 1, (measure._free_port(), 300.0), 330.0, "fault count") < 100


def _gloo_body_worker(rank, world_size, port, timeout_s, queue):
    measure.gloo_worker(rank, world_size, port, timeout_s, queue, _adamw_faults_per_step)
