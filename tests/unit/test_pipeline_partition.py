"""Stage partition DP: equals brute force (min-max stage time under memory limits) on small chains."""
import itertools
import math
import random

import pytest

from parallelizer.planner.partition import ChainCosts, partition_chain, uniform_partition


def _brute(costs: ChainCosts, S: int, inflight, limit):
    """Min over all compositions of L blocks into S parts of >= 1 block of the slowest stage's time."""
    L, best = costs.num_blocks, (math.inf, None)
    for inner in itertools.combinations(range(1, L), S - 1):
        cuts = (0, *inner, L)
        mems = [costs.stage_memory_bytes(s, S, cuts[s], cuts[s + 1], inflight[s]) for s in range(S)]
        if any(st + inflight[s] * a > limit for s, (st, a) in enumerate(mems)):
            continue
        t = max(costs.stage_time_s(s, S, cuts[s], cuts[s + 1]) for s in range(S))
        best = min(best, (t, cuts))
    return best


def _random_chain(rng: random.Random, L: int) -> ChainCosts:
    r = lambda: round(rng.uniform(0.1, 3.0), 3)
    return ChainCosts(tuple(r() for _ in range(L)), tuple(r() for _ in range(L)), tuple(r() for _ in range(L)),
                      pre_s=r(), post_s=r(), pre_state_bytes=r(), pre_act_bytes=r(), post_state_bytes=r(),
                      post_act_bytes=r(), cut_fwd_s=tuple(r() / 10 for _ in range(L + 1)),
                      cut_bwd_s=tuple(r() / 10 for _ in range(L + 1)))


@pytest.mark.parametrize("seed", range(40))
def test_dp_matches_brute_force(seed):
    rng = random.Random(seed)
    L = rng.randint(1, 9)
    S = rng.randint(1, L)
    costs = _random_chain(rng, L)
    inflight = tuple(float(S - s) for s in range(S))  # 1F1B-like: earlier stages keep more microbatches
    limit = rng.choice([math.inf, rng.uniform(3.0, 25.0)])
    want_t, want_cuts = _brute(costs, S, inflight, limit)
    got = partition_chain(costs, S, inflight, limit)
    if want_cuts is None:
        assert got is None
        return
    assert got.max_stage_s == pytest.approx(want_t, rel=1e-12)
    # the returned cuts achieve the reported time and respect memory
    assert max(costs.stage_time_s(s, S, got.cuts[s], got.cuts[s + 1]) for s in range(S)) == pytest.approx(want_t)
    for s in range(S):
        st, a = costs.stage_memory_bytes(s, S, got.cuts[s], got.cuts[s + 1], inflight[s])
        assert st + inflight[s] * a <= limit


def test_balanced_optimum_moves_blocks_off_heavy_ends():
    """8 equal blocks on 4 stages with a heavy embedding (pre) and head (post): the ends get fewer blocks."""
    costs = ChainCosts((1.0,) * 8, (0.0,) * 8, (0.0,) * 8, pre_s=1.0, post_s=2.0)
    got = partition_chain(costs, 4)
    assert got.max_stage_s == 3.0
    assert got.cuts[1] <= 2 and got.cuts[-2] == 7  # pre stage <= 2 blocks, head stage 1 block
    assert uniform_partition(8, 4) == (0, 2, 4, 6, 8)  # the even split's last stage costs 4.0
    assert costs.stage_time_s(3, 4, 6, 8) == 4.0


def test_memory_limit_forces_a_worse_but_feasible_split():
    costs = ChainCosts((1.0, 1.0, 1.0, 5.0), (10.0, 10.0, 10.0, 10.0), (0.0,) * 4)
    assert partition_chain(costs, 2).cuts == (0, 3, 4)            # time-optimal: 3 | 5
    assert partition_chain(costs, 2, limit_bytes=20.0).cuts == (0, 2, 4)  # 30 B do not fit: 2 | 6
    assert partition_chain(costs, 2, limit_bytes=19.0) is None


def test_uniform_and_errors():
    assert uniform_partition(10, 4) == (0, 3, 6, 8, 10)
    with pytest.raises(ValueError, match="num_stages=5"):
        partition_chain(ChainCosts((1.0,) * 4, (0.0,) * 4, (0.0,) * 4), 5)
    with pytest.raises(ValueError, match="cut_fwd_s"):
        ChainCosts((1.0,), (0.0,), (0.0,), cut_fwd_s=(0.0,))
