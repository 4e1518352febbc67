"""Round 24 (issue 14): `cost_model.pipeline_actions._split_per_node`, the calibration of torch's split backward per
autograd node, times samples of >= 20 ms (each a run of back-to-back backward passes), the median of `repeats` per
kind, instead of single backward passes of tens of microseconds, which made it swing 31.5 vs 13.4 us (r23d) and
25.0 vs 14.8 us (round 24's idle pair) between two back-to-back calibrations. Checked on a fake clock that charges
each backward pass a known CPU time: the estimate is the closed form and every timed sample but the 2-call warm-ups
lasts at least the minimum (before round 24: one call per sample, and no `min_sample_s`)."""
from unittest import mock

import pytest
import torch

from cost_model import pipeline_actions
from cost_model.measure import MIN_SAMPLE_S

FULL_S, SPLIT_S, FIXED_S = 3e-6, 25e-6, 40e-6  # per autograd node (full, split) and per pass, on the fake clock


class _FakeClock:
    """`time.thread_time` advanced by the fake backward passes only; records each timed span and its passes."""

    def __init__(self) -> None:
        self.now, self.calls, self.spans, self._last = 0.0, 0, [], None

    def thread_time(self) -> float:
        if self._last is None:
            self._last = (self.now, self.calls)
        else:
            self.spans.append((self.now - self._last[0], self.calls - self._last[1]))
            self._last = None
        return self.now

    def charge(self, outputs, per_node_s: float) -> None:
        nodes, stack, seen = 0, [o.grad_fn for o in outputs], set()
        while stack:  # the autograd nodes of the graph (AddmmBackward, TBackward, AccumulateGrad...)
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            nodes += type(fn).__name__ != "AccumulateGrad" or fn.variable.shape[0] == pipeline_actions._WIDTH
            stack.extend(f for f, _ in fn.next_functions)
        self.now += FIXED_S + per_node_s * nodes
        self.calls += 1


@pytest.mark.parametrize("repeats", [1, 3])
def test_split_backward_per_node_is_the_closed_form_from_samples_of_at_least_the_minimum(repeats):
    clock = _FakeClock()
    with mock.patch.object(pipeline_actions, "time", clock), \
            mock.patch("torch.autograd.backward", lambda y, g: clock.charge([y], FULL_S)), \
            mock.patch("torch.distributed.pipelining._backward.stage_backward_input",
                       lambda ys, gs, xs, params: (clock.charge(ys, SPLIT_S), None)), \
            mock.patch("torch.distributed.pipelining._backward.stage_backward_weight", lambda params, groups: None):
        got = pipeline_actions._split_per_node(repeats=repeats, min_sample_s=MIN_SAMPLE_S)
    assert got == pytest.approx(SPLIT_S - FULL_S, rel=1e-9)  # the fixed cost per pass and per depth cancel
    depths = len(pipeline_actions._SPLIT_DEPTHS)
    assert len(clock.spans) == depths * 2 * (1 + repeats)  # per depth and kind: the warm-up, then the samples
    timed = [(s, n) for s, n in clock.spans if n != 2]
    assert len(timed) == depths * 2 * repeats and all(s >= MIN_SAMPLE_S for s, _ in timed), clock.spans
    assert all(s < 2 * MIN_SAMPLE_S for s, _ in timed), clock.spans  # no longer than needed


def test_the_real_measurement_is_a_positive_cost_per_node():
    """On this machine's CPU (thread CPU, so valid under load): torch's split backward costs more than a full one,
    a few to a few hundred microseconds per node (round 19: 24 us; round 24's idle pair 15-25 us)."""
    torch.manual_seed(0)
    got = pipeline_actions._split_per_node(repeats=1, min_sample_s=0.005)
    assert 0 < got < 500e-6, got


class _SizedClock(_FakeClock):
    """Also charges the split's passes per byte of the chain's parameters (fp32), and counts every autograd node but
    the input's AccumulateGrad (any width)."""

    def charge(self, outputs, per_node_s: float, per_byte_s: float = 0.0) -> None:
        nodes, weight_bytes, stack, seen = 0, 0, [o.grad_fn for o in outputs], set()
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            param = type(fn).__name__ == "AccumulateGrad" and isinstance(fn.variable, torch.nn.Parameter)
            nodes += type(fn).__name__ != "AccumulateGrad" or param
            weight_bytes += fn.variable.numel() * 4 if param else 0
            stack.extend(f for f, _ in fn.next_functions)
        self.now += FIXED_S + per_node_s * nodes + per_byte_s * weight_bytes
        self.calls += 1


def test_split_backward_per_byte_is_the_closed_form_beyond_the_per_node_walks():
    """Round 26 (r26e): `_split_per_byte(per_node)` times Linear(512, 512) chains of 1 and 8 layers on 128 rows as
    `_split_per_node` times its Linear(8, 8) ones; a split that costs PER_BYTE_S per byte of its weights on top of
    (SPLIT_S - FULL_S) per node comes out as PER_BYTE_S exactly (the per-node part, given, and the fixed cost per
    pass cancel), and as 0 where the split costs nothing per byte; every timed sample lasts at least the minimum."""
    per_byte_s = 0.1e-9
    for charged, want in ((per_byte_s, per_byte_s), (0.0, 0.0)):
        clock = _SizedClock()
        with mock.patch.object(pipeline_actions, "time", clock), \
                mock.patch("torch.autograd.backward", lambda y, g: clock.charge([y], FULL_S)), \
                mock.patch("torch.distributed.pipelining._backward.stage_backward_input",
                           lambda ys, gs, xs, params: (clock.charge(ys, SPLIT_S, charged), None)), \
                mock.patch("torch.distributed.pipelining._backward.stage_backward_weight", lambda params, groups: None):
            got = pipeline_actions._split_per_byte(SPLIT_S - FULL_S, repeats=1, min_sample_s=MIN_SAMPLE_S)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-18)
        assert all(s >= MIN_SAMPLE_S for s, n in clock.spans if n != 2), clock.spans


def test_the_real_per_byte_measurement_is_a_small_cost_per_byte():
    """On this machine's CPU: a fraction of a nanosecond per weight byte (r26e, load 13-15: 0.06-0.19 ns), below one
    memory pass per byte at a few GB/s."""
    torch.manual_seed(0)
    got = pipeline_actions._split_per_byte(pipeline_actions._split_per_node(repeats=1, min_sample_s=0.005), repeats=1,
                                           min_sample_s=0.005)
    assert 0 <= got < 2e-9, got


def test_the_split_byte_samples_become_the_field_and_an_older_profile_gets_the_documented_figure():
    from cost_model.calibrate import _pipeline_action_from_json, _pipeline_action_to_json
    cost = pipeline_actions.action_cost_from_samples({"split byte": [1e-10, 3e-10, 2e-10], "split node": [2e-5]}, {})
    assert cost.split_backward_per_byte_s == pytest.approx(2e-10) and cost.split_backward_per_node_s == 2e-5
    assert cost.first_touch_per_byte_s == 0.0  # the sample keys land on their own fields
    assert _pipeline_action_from_json(_pipeline_action_to_json(cost)) == cost  # written and read back
    older = {k: v for k, v in _pipeline_action_to_json(cost).items() if k != "split_backward_per_byte_s"}
    assert (_pipeline_action_from_json(older).split_backward_per_byte_s
            == pipeline_actions.CPU_PIPELINE_ACTION.split_backward_per_byte_s > 0)
