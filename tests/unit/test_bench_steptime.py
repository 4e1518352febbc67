"""benchmarks.bench_steptime: identical plans timed once, rotated interleaved rounds, the paired pick verdict
(round 17, r17e; no ranks started: the pure helpers and a small spec pair)."""

import dataclasses

import pytest

from benchmarks._steptime_workers import round_order
from benchmarks.bench_steptime import _distinct, paired_ratio, same_program, verdict
from parallelizer.core.mesh import MeshSpec
from parallelizer.rewriter.spec import ShardingSpec


def test_each_round_has_its_own_order_the_same_on_every_rank_with_a_models_cases_together():
    """Per round a seeded order (every rank computes the same one): a model's cases contiguous (the first step
    after another model's is slower and is run untimed), models and cases within a model shuffled, so that
    over 15 rounds no case always runs first for its model or after the same neighbour."""
    groups = ["mlp"] * 4 + ["gpt2"] * 8 + ["llama"] * 6
    orders = [round_order(groups, r) for r in range(15)]
    assert all(sorted(o) == list(range(18)) for o in orders)
    assert orders == [round_order(groups, r) for r in range(15)]  # deterministic: the ranks agree
    for o in orders:
        runs = [groups[o[0]]] + [groups[b] for a, b in zip(o, o[1:]) if groups[a] != groups[b]]
        assert sorted(runs) == ["gpt2", "llama", "mlp"]  # one contiguous block per model
    assert len({tuple(groups[o[k]] for k in (0, 4, 17)) for o in orders}) > 1  # the models' order varies
    gpt2_first = {next(i for i in o if groups[i] == "gpt2") for o in orders}
    assert len(gpt2_first) > 4
    for case in range(4, 12):
        before = {o[o.index(case) - 1] for o in orders if o.index(case) > 0 and groups[o[o.index(case) - 1]] == "gpt2"}
        assert len(before) > 2


def test_the_same_spec_under_other_axis_names_is_one_program():
    a = ShardingSpec(mesh=MeshSpec(("dp",), (2,)), nodes={}, params={})
    b = dataclasses.replace(a, mesh=MeshSpec(("tp",), (2,)))
    case = ("spec", "gpt2", {"n_layer": 4})
    assert same_program((*case, a), (*case, b))
    assert not same_program((*case, a), (*case, dataclasses.replace(a, mesh=MeshSpec(("dp",), (4,)))))
    assert not same_program((*case, a), (*case, dataclasses.replace(a, recompute={"block0": "full"})))
    assert not same_program((*case, a), ("spec", "llama", {"n_layer": 4}, b))
    assert same_program(("pipeline", "gpt2", {}, "{...}"), ("pipeline", "gpt2", {}, "{...}"))
    assert not same_program(("pipeline", "gpt2", {}, "{a}"), ("pipeline", "gpt2", {}, "{b}"))


def test_paired_ratio_cancels_drift_between_rounds():
    """Load drifting 1x -> 3x across rounds hits both plans of a round alike: the per-round ratio is exact
    where the ratio of medians of plans timed at different moments is not."""
    drift = [1.0, 1.5, 2.0, 2.5, 3.0]
    pick = [100.0 * d * 1.03 for d in drift]
    fastest = [100.0 * d for d in drift]
    med, q1, q3 = paired_ratio(pick, fastest)
    assert med == pytest.approx(1.03) and q1 == pytest.approx(1.03) and q3 == pytest.approx(1.03)


def _row(kind, predicted, samples, timed_as=None):
    r = {"model": "m", "world": 2, "kind": kind, "predicted_ms": predicted, "parts_ms": {"fwd": predicted},
         "samples_ms": samples, "measured_ms": sorted(samples)[len(samples) // 2]}
    if timed_as is not None:
        r["timed_as"] = timed_as
    return r


def test_verdict_says_whether_the_spread_straddles_the_tolerance():
    fastest = _row("ddp", 101.0, [100.0, 100.0, 100.0, 100.0])
    near = verdict([_row("free", 100.0, [102.0, 104.0, 105.0, 108.0]), fastest])
    assert near["ok"] and not near["clear"]  # ratio median 1.045, IQR 1.035-1.0575: straddles 1.05
    clear_miss = verdict([_row("free", 100.0, [110.0, 111.0, 112.0, 113.0]), fastest])
    assert not clear_miss["ok"] and clear_miss["clear"]
    clear_hit = verdict([_row("free", 100.0, [101.0, 101.0, 102.0, 102.0]), fastest])
    assert clear_hit["ok"] and clear_hit["clear"]
    noisy_miss = verdict([_row("free", 100.0, [101.0, 106.0, 107.0, 112.0]), fastest])
    assert not noisy_miss["ok"] and not noisy_miss["clear"]


def test_identical_plans_timed_once_are_merged_without_counting_their_steps_twice():
    steps = [100.0, 120.0, 110.0]
    rows = [_row("free dp=2", 50.0, steps, "free dp=2"), _row("free tp=2", 50.0, steps, "free dp=2"),
            _row("ddp", 51.0, [90.0, 91.0, 92.0], "ddp")]
    merged = _distinct(rows)
    assert [r["kind"] for r in merged] == ["free dp=2 = free tp=2", "ddp"]
    assert merged[0]["samples_ms"] == steps and merged[0]["measured_ms"] == 110.0


def test_the_profile_pair_report_lists_each_plans_difference_and_a_changed_pick():
    """`--compare-profiles` (round 23, r23c): the summary line, every plan largest difference first, and each
    group's pick on either profile, a changed one marked."""
    from benchmarks.bench_steptime import compare_report
    from cost_model.profile_compare import compare_step_predictions
    diff = compare_step_predictions({"mlp x2 ddp": 0.05, "mlp x2 tp": 0.04}, {"mlp x2 ddp": 0.05, "mlp x2 tp": 0.06})
    text = compare_report(diff, [("mlp x2", "tp", "ddp")], "a.json", "b.json")
    lines = text.splitlines()
    assert "2 plans' predicted step time: median |difference| 25.0%, worst mlp x2 tp +50.0%, within 10%: 1" in text
    assert lines.index("| mlp x2 tp | +50.0% |") < lines.index("| mlp x2 ddp | +0.0% |")
    assert "| mlp x2 | tp | ddp (changed) |" in lines
