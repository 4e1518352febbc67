"""benchmarks.paired_rounds: the statistics that decide which schedule pairs a bench's paired timed rounds order
(issue 14, round 25). Right values are computed independently: binomial tails summed from Pascal's triangle, Holm's
procedure by its definition on hand-made p-values, and the bootstrap interval against the sample's order statistics.
Pure: no ranks started."""

import random
import statistics

import pytest

from benchmarks.paired_rounds import (holm_rejects, median_ratio_interval, min_rounds_to_decide, paired_verdicts,
                                      sign_test_p)


def _binomial_half(n: int) -> list[float]:
    """P(X = k), X ~ Binomial(n, 1/2), from Pascal's triangle (independent of math.comb)."""
    row = [1]
    for _ in range(n):
        row = [a + b for a, b in zip([0] + row, row + [0])]
    return [c / 2 ** n for c in row]


@pytest.mark.parametrize("wins, losses", [(10, 0), (0, 10), (9, 1), (15, 5), (17, 3), (10, 10), (3, 4), (0, 0), (1, 0)])
def test_the_sign_test_is_twice_the_binomial_tail_of_the_rarer_direction(wins, losses):
    pmf = _binomial_half(wins + losses)
    expected = min(1.0, 2 * sum(pmf[:min(wins, losses) + 1]))
    assert sign_test_p(wins, losses) == pytest.approx(expected, rel=1e-12)


def test_known_sign_test_values():
    # 10 of 10 one way: 2 / 1024; 17 of 20: 2 (1 + 20 + 190 + 1140) / 2^20
    assert sign_test_p(10, 0) == pytest.approx(2 / 1024)
    assert sign_test_p(3, 17) == pytest.approx(2 * 1351 / 2 ** 20)
    assert sign_test_p(5, 5) == 1.0


def test_holm_rejects_by_its_definition():
    """m = 4, alpha 0.05: thresholds 0.0125, 0.0167, 0.025, 0.05 for the sorted p-values; 0.01 and 0.015 pass, 0.03 >
    0.025 stops the procedure, so 0.04 is not rejected although it is below 0.05."""
    assert holm_rejects([0.04, 0.01, 0.03, 0.015]) == [False, True, False, True]
    assert holm_rejects([0.001] * 15) == [True] * 15
    assert holm_rejects([0.0034, 0.001]) == [True, True]  # 0.001 <= 0.025, then 0.0034 <= 0.05
    assert holm_rejects([0.02, 0.02], alpha=0.05) == [True, True]
    assert holm_rejects([0.03, 0.03], alpha=0.05) == [False, False]


@pytest.mark.parametrize("pairs, rounds", [(15, 10), (1, 6), (3, 7)])
def test_min_rounds_is_the_fewest_all_alike_rounds_holm_can_decide(pairs, rounds):
    assert min_rounds_to_decide(pairs) == rounds
    assert sign_test_p(rounds, 0) <= 0.05 / pairs < sign_test_p(rounds - 1, 0)


def test_the_bootstrap_interval_holds_the_median_and_narrows_with_rounds():
    rng = random.Random(3)
    ratios = [1.05 * rng.lognormvariate(0, 0.1) for _ in range(40)]
    a, b = [r * 100 for r in ratios], [100.0] * 40
    med, low, high = median_ratio_interval(a, b)
    assert med == pytest.approx(statistics.median(ratios))
    srt = sorted(ratios)
    assert srt[5] <= low <= med <= high <= srt[-6]  # within the sample, around the median
    _, low10, high10 = median_ratio_interval(a[:10], b[:10])
    assert high10 - low10 > high - low
    assert median_ratio_interval(a, b) == (med, low, high)  # fixed seed: the same rounds give the same report


def test_paired_verdicts_cancel_a_load_that_moves_all_configurations_alike():
    """Three configurations whose per-round steps are 1.00 / 1.03 / 1.03 times a load factor that varies 3x between
    rounds (so their pooled ranges overlap entirely), B and C differ only by noise: 20 rounds decide A vs B and A vs
    C (A faster in all 20), and not B vs C."""
    rng = random.Random(0)
    load = [rng.uniform(1.0, 3.0) for _ in range(20)]
    noise = [rng.choice((-1, 1)) * 0.001 for _ in range(20)]
    a = [100 * x for x in load]
    b = [103 * x for x in load]
    c = [103 * x * (1 + e) for x, e in zip(load, noise)]
    v = {(x.i, x.j): x for x in paired_verdicts([a, b, c])}
    assert v[0, 1].decided and v[0, 1].sign == -1 and v[0, 1].wins == 20
    assert v[0, 1].ratio == pytest.approx(100 / 103) and v[0, 1].low == pytest.approx(100 / 103)
    assert v[0, 2].decided and v[0, 2].sign == -1
    assert not v[1, 2].decided and v[1, 2].wins + v[1, 2].losses == 20


def test_ties_count_for_neither_side():
    v = paired_verdicts([[1.0] * 12, [1.0] * 2 + [2.0] * 10])[0]
    assert (v.wins, v.losses, v.ties) == (10, 0, 2) and v.p == pytest.approx(2 / 1024) and v.decided


@pytest.mark.parametrize("rounds", [[[1.0, 2.0], [1.0]], [[], []]])
def test_unpaired_rounds_are_refused(rounds):
    with pytest.raises(ValueError, match="paired rounds"):
        paired_verdicts(rounds)


@pytest.mark.parametrize("call", [lambda: sign_test_p(-1, 3), lambda: holm_rejects([0.1], alpha=1.5),
                                  lambda: holm_rejects([1.2]), lambda: median_ratio_interval([1.0], [0.0]),
                                  lambda: median_ratio_interval([1.0], [1.0], confidence=1.0)])
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()
