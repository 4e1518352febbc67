"""BitPipe and DualPipeV executed (issue 14): the user loop (`auto_parallelize` + `pm.step` + AdamW) on 4 gloo
ranks (pp=4) with an 8-block GPT-2 (tied wte / lm_head, padded labels) on a plan with 2 stages per pp rank
whose schedule is bitpipe (our P2P runner: two weight copies per stage, eager twin gradient exchange) or
dualpipev / zbv (torch's ScheduleDualPipeV / ScheduleZBVZeroBubble with our stage split, V placement): loss
(every step), every gradient (every step) and the parameters after 3 AdamW steps match the single-device model
within 1e-5 (fp32), with `pm.clip_grad_norm_` in the loop: its global norm (BitPipe's twin copies and the tied
wte / lm_head counted once) equals torch's clip_grad_norm_ on one device."""
import pytest

from parallelizer.runtime import spawn
from schedule_workers import base_plan_json, train_schedules
from step_workers import CLIP

pytestmark = pytest.mark.distributed

SCHEDULES = ["bitpipe", "dualpipev", "zbv"]
HELD = {  # pp rank -> blocks of its stages (one block per stage): bitpipe 4 chunks (2 copies), V: 2 chunks
    "bitpipe": {0: ["0", "3", "4", "7"], 1: ["1", "2", "5", "6"], 2: ["1", "2", "5", "6"], 3: ["0", "3", "4", "7"]},
    "dualpipev": {0: ["0", "7"], 1: ["1", "6"], 2: ["2", "5"], 3: ["3", "4"]},
    "zbv": {0: ["0", "7"], 1: ["1", "6"], 2: ["2", "5"], 3: ["3", "4"]},
}


def test_bitpipe_dualpipev_and_zbv_train_like_one_device():
    reports = spawn(train_schedules, 4, base_plan_json(4, 8), SCHEDULES, timeout_s=500)
    for rank, report in enumerate(reports):
        for name in SCHEDULES:
            r = report[name]
            assert r["loss"] <= 1e-5 and r["grad"] <= 1e-5 and r["params"] <= 1e-5, (rank, name, r)
            assert r["norm"] <= 1e-5 and r["ref_norm"] > CLIP[0] and r["norm_spread"] == 0.0, (rank, name, r)
            assert r["state_keys"] and r["state"] <= 1e-5 and r["loaded"] == 0.0, (rank, name, r)
            assert r["blocks"] == HELD[name][rank], (rank, name, r["blocks"])
        # bitpipe: the down pipeline enters and leaves at rank 0, the up pipeline at rank 3
        assert tuple(report["bitpipe"]["first_last"]) == ((True, True) if rank in (0, 3) else (False, False))
        for name in ("dualpipev", "zbv"):  # V: the first and the last stage on rank 0
            assert tuple(report[name]["first_last"]) == ((True, True) if rank == 0 else (False, False))


@pytest.mark.slow
@pytest.mark.timeout(300)  # a hang guard: ~5-30 s here
def test_the_bitpipe_runners_per_action_cost_is_measured_for_the_profile():
    """Round 17 (issue 14): `parallelizer calibrate` registers a benchmark of our BitPipe runner with the leaf
    cost_model (`runtime.bitpipe_cost`), which records it as `PipelineActionCost.own_runner`. The runner runs F
    and full B only (no I / W); every measured cost is positive host seconds below 50 ms per action."""
    from cost_model.pipeline_actions import _OWN_RUNNER_BENCHMARK, register_own_runner_benchmark
    from parallelizer.runtime.bitpipe_cost import measure_bitpipe_actions, register

    cost = measure_bitpipe_actions(steps=2, timeout_s=240)
    assert 0 < cost.forward_s < 0.05 and 0 < cost.backward_s < 0.05
    assert 0 < cost.send_s < 0.05 and 0 < cost.recv_s < 0.05 and 0 < cost.step_s < 0.5
    assert cost.backward_input_s == cost.backward_weight_s == 0.0 and cost.own_runner is None
    before = _OWN_RUNNER_BENCHMARK[0]
    register()
    try:
        assert _OWN_RUNNER_BENCHMARK[0] is measure_bitpipe_actions
    finally:
        register_own_runner_benchmark(before)
