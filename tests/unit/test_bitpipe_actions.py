"""BitPipe's action lists (planner/bitpipe.py): placement, completeness, a valid execution order."""
import pytest

from parallelizer.planner.bitpipe import BACKWARD, FORWARD, bitpipe_actions, bitpipe_placement


def test_v_placement_mirrored_for_the_up_pipeline():
    # down: stages 0..3 on ranks 0..3, stages 4..7 back on 3..0; up: the mirror image
    assert bitpipe_placement(4) == (0, 1, 2, 3, 3, 2, 1, 0,
                                    3, 2, 1, 0, 0, 1, 2, 3)
    s = bitpipe_actions(4, 4)
    for rank in range(4):
        stages = sorted(s.copy_to_stage[c] for c in s.copies_on(rank))
        assert stages == sorted([rank, 7 - rank, 3 - rank, 4 + rank])  # 4 chunks: 2 per pipeline
        for c in s.copies_on(rank):
            assert s.copy_to_rank[s.twin(c)] == 3 - rank  # gradient partner: rank p - 1 - r
    assert s.copy_to_rank[s.copy_of(0, 3)] == s.copy_to_rank[s.copy_of(0, 4)]  # the V's tip is local


@pytest.mark.parametrize("p,m", [(2, 2), (2, 6), (4, 4), (4, 8), (8, 8), (8, 32)])
def test_every_action_once_and_in_a_valid_order(p, m):
    s = bitpipe_actions(p, m)
    seen = [(a.stage_index, a.computation_type, a.microbatch_index) for rank in s.actions for a in rank]
    expected = {(c, kind, j) for c in range(4 * p) for j in s.microbatches_of(c) for kind in (FORWARD, BACKWARD)}
    assert len(seen) == len(expected) == 4 * p * m  # each (copy, microbatch) of its pipeline: one F, one B
    assert set(seen) == expected
    for rank, actions in enumerate(s.actions):
        assert all(s.copy_to_rank[a.stage_index] == rank for a in actions)
    # replay the per-rank lists in order, one action at a time from any rank whose next action is ready:
    # it must finish (the runtime executes exactly this way, so it cannot deadlock)
    done, heads, S = set(), [0] * p, s.num_stages
    def ready(a):
        c, j, st = a.stage_index, a.microbatch_index, a.stage_index % S
        if a.computation_type == FORWARD:
            return st == 0 or (c - 1, FORWARD, j) in done
        return (c, FORWARD, j) in done and (st == S - 1 or (c + 1, BACKWARD, j) in done)
    while any(h < len(a) for h, a in zip(heads, s.actions)):
        moved = False
        for r in range(p):
            if heads[r] < len(s.actions[r]) and ready(a := s.actions[r][heads[r]]):
                done.add((a.stage_index, a.computation_type, a.microbatch_index))
                heads[r] += 1
                moved = True
        assert moved, f"deadlock at {heads}"


def test_microbatches_split_between_the_pipelines_and_bubble_below_interleaved_1f1b():
    s = bitpipe_actions(4, 8)
    assert list(s.microbatches_of(s.copy_of(0, 0))) == [0, 1, 2, 3]
    assert list(s.microbatches_of(s.copy_of(1, 5))) == [4, 5, 6, 7]
    # unit times (F=1, B=2 per chunk of 1/(2p)): 1F1B on p stages would take (m + p - 1) * 6 = 66 units,
    # interleaved 1F1B (v=2) m * 6 + (p - 1) * 3 = 57; the busy time is 6m = 48
    assert s.makespan_units == 51
    assert s.unit_bubble_fraction == pytest.approx(3 / 51)


@pytest.mark.parametrize("p,m", [(3, 4), (1, 2), (4, 3), (4, 0)])
def test_bad_arguments_raise(p, m):
    with pytest.raises(ValueError, match="bitpipe needs"):
        bitpipe_actions(p, m)
