"""Paired statistics of timed rounds: which of several configurations a measurement orders, at a stated confidence.

A bench that times n configurations in rounds, every configuration once per round back to back (round r's steps run
within seconds of each other), gets per pair (A, B) n_rounds paired differences: a slow minute of the shared machine
hits A's and B's step of the same round alike and cancels in their ratio, while the spread between rounds does not.
So the tests here use the per-round ratios A_r / B_r only, never the two schedules' pooled samples.

- Direction: the exact two-sided sign test (Dixon & Mood 1946, "The statistical sign test", JASA 41:557; Conover
  1999, "Practical Nonparametric Statistics", 3rd ed., section 3.4): under "A and B are exchangeable" each round
  orders them either way with probability 1/2, so the count of rounds A < B is Binomial(n, 1/2) over the n rounds
  that are not ties; p = min(1, 2 P(X <= min(wins, losses))). Distribution-free: the heavy tails of a loaded
  machine's step times (one step 3x its neighbours) do not weaken it, which is why it is used rather than a t-test.
- Many pairs: Holm's step-down correction (Holm 1979, "A simple sequentially rejective multiple test procedure",
  Scand. J. Statist. 6:65) at family-wise error `alpha`: with all 15 pairs of six schedules tested, the chance that
  ANY pair reported as decided is ordered wrongly by the noise alone is at most alpha.
- Size: the median of the per-round ratios and its percentile bootstrap interval (Efron & Tibshirani 1993, "An
  Introduction to the Bootstrap", ch. 13), resampling whole rounds with a fixed seed (deterministic reports).

The minimum rounds to decide anything: a pair ordered alike in all n rounds has p = 2^(1 - n); Holm's first step
needs p <= alpha / pairs, so with 15 pairs at alpha 0.05 no pair is decided in fewer than 10 rounds, and with 20
rounds a pair needs 17 rounds one way (`min_rounds_to_decide`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05          # family-wise error of the decided pairs (Holm)
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign-test p-value of `wins` rounds one way and `losses` the other (ties left out, module
    docstring): 2 P(X <= min(wins, losses)), X ~ Binomial(wins + losses, 1/2), at most 1; 1.0 with no untied round.

    Raises:
        ValueError: a negative count.
    """
    if wins < 0 or losses < 0:
        raise ValueError(f"sign_test_p(wins={wins}, losses={losses}): counts of rounds must be >= 0")
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n)


def holm_rejects(p_values: list[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down procedure (module docstring): sort the m p-values ascending, reject the i-th smallest
    (i = 0..m-1) while p_(i) <= alpha / (m - i), stop at the first that is not. Family-wise error <= alpha.

    Raises:
        ValueError: alpha outside (0, 1) or a p-value outside [0, 1].
    """
    if not 0 < alpha < 1 or any(not 0 <= p <= 1 for p in p_values):
        raise ValueError(f"holm_rejects: alpha {alpha} must be in (0, 1) and p-values {p_values} in [0, 1]")
    m, out = len(p_values), [False] * len(p_values)
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        if p_values[i] > alpha / (m - rank):
            break
        out[i] = True
    return out


def min_rounds_to_decide(pairs: int, alpha: float = ALPHA) -> int:
    """The fewest rounds in which a pair ordered alike in every round passes Holm's first step among `pairs`
    tests: the least n with 2^(1 - n) <= alpha / pairs."""
    return max(1, math.ceil(1 - math.log2(alpha / pairs)))


def median_ratio_interval(a: list[float], b: list[float], confidence: float = 0.95,
                          resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """(median, low, high) of the per-round ratios a[r] / b[r]: the median and its percentile bootstrap interval at
    `confidence`, resampling rounds (module docstring; fixed seed: the same rounds give the same interval).

    Raises:
        ValueError: unequal or empty round lists, a step time <= 0, or confidence outside (0, 1).
    """
    if len(a) != len(b) or not a or not 0 < confidence < 1 or min(min(a), min(b)) <= 0:
        raise ValueError(f"median_ratio_interval: {len(a)} and {len(b)} rounds, confidence {confidence}: need the same "
                         "number (>= 1) of paired rounds with step times > 0 and a confidence in (0, 1)")
    ratios = np.asarray(a, dtype=float) / np.asarray(b, dtype=float)
    draws = np.random.default_rng(seed).integers(0, len(ratios), size=(resamples, len(ratios)))
    meds = np.median(ratios[draws], axis=1)
    low, high = np.quantile(meds, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(np.median(ratios)), float(low), float(high)


@dataclass(frozen=True)
class PairVerdict:
    """What the paired rounds say about configurations i < j.

    Attributes:
        i, j: indices into the measured lists.
        wins, losses, ties: rounds in which i was faster, slower, equal.
        p: exact two-sided sign-test p-value (`sign_test_p`).
        decided: Holm's procedure over all pairs rejects "exchangeable" at the family-wise alpha.
        sign: -1 when i was faster in more rounds, +1 when j was, 0 on a tie.
        ratio, low, high: median of i / j per round and its bootstrap interval (`median_ratio_interval`).
    """

    i: int
    j: int
    wins: int
    losses: int
    ties: int
    p: float
    decided: bool
    sign: int
    ratio: float
    low: float
    high: float


def paired_verdicts(rounds_ms: list[list[float]], alpha: float = ALPHA) -> list[PairVerdict]:
    """Per pair (i < j) of configurations timed in paired rounds (`rounds_ms[c][r]`: configuration c's step in
    round r), the sign test, Holm's decision over all pairs at family-wise `alpha`, and the median ratio with its
    95% bootstrap interval (module docstring).

    Raises:
        ValueError: configurations with different round counts or no rounds, a step <= 0, or alpha outside (0, 1).
    """
    counts = {len(r) for r in rounds_ms}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"paired_verdicts: round counts {sorted(counts)}: need the same number (>= 1) of paired rounds "
                         "per configuration (each round times every configuration once)")
    pairs = [(i, j) for i in range(len(rounds_ms)) for j in range(i + 1, len(rounds_ms))]
    tallies = []
    for i, j in pairs:
        a, b = rounds_ms[i], rounds_ms[j]
        tallies.append((sum(x < y for x, y in zip(a, b)), sum(x > y for x, y in zip(a, b)),
                        sum(x == y for x, y in zip(a, b))))
    ps = [sign_test_p(w, lo) for w, lo, _ in tallies]
    decided = holm_rejects(ps, alpha) if ps else []
    out = []
    for (i, j), (w, lo, t), p, d in zip(pairs, tallies, ps, decided):
        out.append(PairVerdict(i, j, w, lo, t, p, d, (w < lo) - (w > lo),
                               *median_ratio_interval(rounds_ms[i], rounds_ms[j])))
    return out

