"""benchmarks.bench_schedules_runtime.report: the per-rank page-fault / system-CPU line (round 22, r22h: at full
size gpipe's ranks fault 7-17 thousand pages per step, 1f1b's none, CPU the cost model does not price), the
steps written before it (no such fields) reported as before, and the pairs the paired timed rounds decide (the
measurement's own confidence in its order). Pure: no ranks started."""

import pytest

from benchmarks.bench_schedules_runtime import SCHEDULES, VARIANTS, decided_pairs, report


def _sim():
    return {n: {"ms": {v: 100.0 + i for v in VARIANTS}, "stages": 4, "work_ms": 400.0, "work_before_ms": 390.0,
                "rank_work_ms": [100.0] * 4, "numel": [10] * 4, "tensors": [2] * 4}
            for i, n in enumerate(SCHEDULES)}


def _measured(with_faults: bool):
    out = {}
    for i, n in enumerate(SCHEDULES):
        m = {"ms": [110.0 + i, 120.0 + i, 130.0 + i], "cpu_ms": [400.0] * 3, "loss1": 7.0, "numel": [10] * 4,
             "tensors": [2] * 4, "rank_cpu_ms": [[100.0, 101.0, 102.0]] * 4}
        if with_faults:  # per rank, per timed step: rank r faulted 1000 r + (0, 10, 20) pages, 5 r + (1, 2, 3) ms
            m["rank_minflt"] = [[1000 * r + 10 * s for s in range(3)] for r in range(4)]
            m["rank_sys_ms"] = [[5.0 * r + s + 1 for s in range(3)] for r in range(4)]
        out[n] = m
    return out


def test_the_report_gives_each_ranks_median_page_faults_and_system_cpu_per_step():
    text = report(_sim(), _measured(True), "header")
    line = next(row for row in text.splitlines() if row.startswith("Per rank minor page faults"))
    # medians per rank: faults 1000 r + 10, system CPU 5 r + 2 ms
    for n in SCHEDULES:
        assert f"{n} 10 / 2, 1010 / 7, 2010 / 12, 3010 / 17" in line


def test_steps_written_before_the_fault_counts_report_as_before():
    text = report(_sim(), _measured(False), "header")
    assert "page faults" not in text
    assert "Parameters per rank priced = held by the runtime: yes" in text


@pytest.mark.parametrize("with_faults", [True, False])
def test_the_orders_and_agreement_lines_do_not_depend_on_the_fault_fields(with_faults):
    rows = [r for r in report(_sim(), _measured(with_faults), "header").splitlines() if "Spearman" in r]
    assert len(rows) == len(VARIANTS) and all("Spearman 1.00" in r for r in rows)


def test_a_pair_is_decided_when_the_paired_rounds_order_it_alike_in_the_share_of_rounds():
    """5 paired rounds: A faster than B in 5 (decided, A first), A faster than C in 3 (not at 80%), C faster than B
    in 4 = 0.8 x 5 (decided, C first)."""
    a = [10, 10, 10, 10, 10]
    b = [11, 12, 13, 14, 15]
    c = [9, 9, 11, 11, 11]
    c[3] = 16  # round 3: C slower than B (16 > 14); rounds 0, 1, 2, 4: C faster than B
    assert decided_pairs([a, b, c]) == [(0, 1, -1), (1, 2, 1)]
    assert decided_pairs([a, b, c], share=1.0) == [(0, 1, -1)]


@pytest.mark.parametrize("rounds, share", [([[1, 2], [1]], 0.8), ([[], []], 0.8), ([[1], [2]], 0.5)])
def test_decided_pairs_refuses_unpaired_rounds_and_a_share_that_decides_nothing(rounds, share):
    with pytest.raises(ValueError, match="paired rounds"):
        decided_pairs(rounds, share)


def test_the_report_scores_each_variant_on_the_pairs_the_rounds_decide():
    """Round r of schedule i took 110 + 10 r + i ms: every round orders the schedules alike, so all 15 pairs are
    decided, and the simulated order (100 + i) agrees on all of them."""
    text = report(_sim(), _measured(False), "header")
    assert "Pairs the timed rounds order the same way in >= 80% of rounds: 15 of 15" in text
    rows = [r for r in text.splitlines() if "Spearman" in r]
    assert rows and all("of the pairs the rounds decide 15 of 15" in r for r in rows)
