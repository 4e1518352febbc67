"""benchmarks.bench_schedules_runtime.report: the per-rank page-fault / system-CPU line (round 22, r22h: at full
size gpipe's ranks fault 7-17 thousand pages per step, 1f1b's none, CPU the cost model does not price), the
steps written before it (no such fields) reported as before, the pairs the paired timed rounds decide (the
measurement's own confidence in its order, round 25: a sign test per pair with Holm's correction,
`benchmarks.paired_rounds`, tested in test_paired_rounds.py) and the order the rounds step the schedules in.
Pure: no ranks started."""

import statistics

import pytest

from benchmarks.bench_schedules_runtime import SCHEDULES, VARIANTS, predecessors, report, step_order


ROUNDS = 12  # >= paired_rounds.min_rounds_to_decide(15) = 10: a pair ordered alike in every round is decided


def _sim():
    return {n: {"ms": {v: 100.0 + i for v in VARIANTS}, "stages": 4, "work_ms": 400.0, "work_before_ms": 390.0,
                "rank_work_ms": [100.0] * 4, "numel": [10] * 4, "tensors": [2] * 4}
            for i, n in enumerate(SCHEDULES)}


def _measured(with_faults: bool):
    out = {}
    for i, n in enumerate(SCHEDULES):
        m = {"ms": [110.0 + 10 * r + i for r in range(ROUNDS)], "cpu_ms": [400.0] * ROUNDS, "loss1": 7.0, "numel": [10] * 4,
             "tensors": [2] * 4, "rank_cpu_ms": [[100.0, 101.0, 102.0] * 4] * 4}
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


def test_the_report_scores_each_variant_on_the_pairs_the_rounds_decide():
    """Round r of schedule i took 110 + 10 r + i ms: every one of the 12 rounds orders the schedules alike (sign test
    p = 2^-11 per pair, below Holm's strictest 0.05 / 15), so all 15 pairs are decided, and the simulated order
    (100 + i) agrees on all of them."""
    text = report(_sim(), _measured(False), "header")
    assert "Pairs the 12 paired timed rounds decide" in text and ": 15 of 15 (the others" in text
    rows = [r for r in text.splitlines() if "Spearman" in r]
    assert rows and all("of the pairs the rounds decide 15 of 15;" in r for r in rows)
    row = next(r for r in text.splitlines() if r.startswith("| gpipe vs 1f1b |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["12 / 0 / 0", "0.00049", "yes"] and cells[-1] == "yes"
    median = statistics.median((110 + 10 * r) / (111 + 10 * r) for r in range(ROUNDS))
    low, high = (float(x) for x in cells[4].split("[")[1].rstrip("]").split(","))
    assert cells[4].startswith(f"{median:.3f} [") and low <= median <= high < 1
    assert cells[5] == f"{100 / 101:.3f}"


def test_a_decided_pair_the_simulation_orders_the_other_way_is_named():
    """Swap gpipe's and 1f1b's simulated times: the decided pair gpipe vs 1f1b (gpipe faster in every round) is now
    simulated the other way, in every variant, and named; the other 14 decided pairs still agree."""
    sim = _sim()
    sim["gpipe"]["ms"], sim["1f1b"]["ms"] = sim["1f1b"]["ms"], sim["gpipe"]["ms"]
    text = report(sim, _measured(False), "header")
    rows = [r for r in text.splitlines() if "Spearman" in r]
    assert rows and all("of the pairs the rounds decide 14 of 15 (not: gpipe vs 1f1b);" in r for r in rows)
    assert any(r.startswith("| gpipe vs 1f1b | 12 / 0 / 0 |") and r.endswith("| NO |") for r in text.splitlines())


def test_rounds_of_noise_decide_nothing():
    """Too few rounds: 5 rounds ordered alike give p = 2^-4 = 0.0625 > 0.05: no pair is decided, and no variant is
    scored on decided pairs."""
    measured = _measured(False)
    for m in measured.values():
        m["ms"] = m["ms"][:5]
    text = report(_sim(), measured, "header")
    assert ": 0 of 15 (the others" in text
    assert all("of the pairs the rounds decide 0 of 0;" in r for r in text.splitlines() if "Spearman" in r)


def test_every_round_steps_every_schedule_once_and_no_schedule_always_runs_first():
    """The step order (`step_order`, seeded per round, the same on every rank): each round a permutation of the six
    schedules; over 24 rounds every schedule runs first at least once and follows at least three different
    schedules (`predecessors`: one per timed step, the warm-up round's steps left out)."""
    order = step_order(1, 24)
    rounds = [order[6 * r:6 * r + 6] for r in range(25)]
    assert all(sorted(r) == sorted(SCHEDULES) for r in rounds)
    assert {r[0] for r in rounds} == set(SCHEDULES)
    assert step_order(1, 24) == order  # deterministic: every rank computes the same order
    after = predecessors(order, 1)
    assert all(len(after[n]) == 24 for n in SCHEDULES)
    assert all(len(set(after[n]) - {n}) >= 3 for n in SCHEDULES)
    assert after[order[6]][0] == order[5]  # the first timed step follows the warm-up round's last


def test_the_first_touch_variant_prices_every_schedule_on_the_largest_activation_peak_per_rank(monkeypatch):
    """Round 27: `simulate_all` prices each schedule's first touch with the heap every rank keeps, the largest
    in-flight activation peak of the six schedules on that rank (each rank stepped all six in the warm-up), whatever
    ran just before: a stand-in `simulate_schedule` whose schedule i peaks at i + rank bytes on each rank, and whose
    first-touch ms is 1000 + the pool's bytes on rank 0 + 10 x those on rank 3, shows pool (5, 6, 7, 8) for all."""
    import benchmarks.bench_schedules_runtime as bench

    pools = []

    def fake(name, plan, pc, pool=None):
        i = SCHEDULES.index(name)
        out = {"ms": {v: 100.0 + i for v in VARIANTS if v != "first touch"},
               "peak_bytes": [float(i + r) for r in range(4)], "touched_bytes": None}
        if pool is not None:
            pools.append(tuple(pool))
            out["ms"]["first touch"] = 1000.0 + pool[0] + 10 * pool[3]
            out["touched_bytes"] = [0.0] * 4
        return out
    monkeypatch.setattr(bench, "simulate_schedule", fake)
    sim = bench.simulate_all({n: None for n in SCHEDULES}, None)
    assert pools == [(5.0, 6.0, 7.0, 8.0)] * len(SCHEDULES)
    assert all(sim[n]["ms"]["first touch"] == 1085.0 for n in SCHEDULES)
    assert [sim[n]["ms"]["measured"] for n in SCHEDULES] == [100.0 + i for i in range(6)]  # the other variants kept


def test_the_report_decides_pairs_on_all_ranks_cpu_and_scores_the_priced_work():
    """Round r of schedule i used 400 + 10 i + r ms of CPU over the ranks: all 15 pairs decided on CPU; the priced
    solo work says 400 for every schedule but 1f1b (390, the least) and bitpipe (450, the most): gpipe vs 1f1b is
    priced the other way, gpipe, interleaved_1f1b, zbv and dualpipev tie (6 pairs: not ordered alike), 8 agree."""
    measured = _measured(False)
    sim = _sim()
    for i, n in enumerate(SCHEDULES):
        measured[n]["cpu_ms"] = [400.0 + 10 * i + r for r in range(ROUNDS)]
        sim[n]["work_ms"] = {"1f1b": 390.0, "bitpipe": 450.0}.get(n, 400.0)
    text = report(sim, measured, "header")
    line = next(r for r in text.splitlines() if "on all ranks' CPU" in r)
    assert ": 15 of 15 (the others" in line and line.endswith(
        "orders 8 of them alike (not: gpipe vs 1f1b, gpipe vs interleaved_1f1b, gpipe vs zbv, gpipe vs dualpipev, "
        "interleaved_1f1b vs zbv, interleaved_1f1b vs dualpipev, zbv vs dualpipev).")
    row = next(r for r in text.splitlines() if r.startswith("| gpipe vs 1f1b |") and "1.026" in r)
    assert row.endswith("| NO |")  # gpipe's CPU is lower in every round; its priced work is higher (400 / 390)
