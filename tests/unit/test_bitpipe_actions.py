"""BitPipe's action lists (planner/bitpipe.py): placement, completeness, a valid execution order."""
import pytest

from parallelizer.planner.bitpipe import BACKWARD, FORWARD, bitpipe_actions, bitpipe_placement, list_schedule


def test_v_placement_mirrored_for_the_up_pipeline():
    # down: stages 0..3 on ranks 0..3, stages 4..7 back on 3..0; up: the mirror image
    assert bitpipe_placement(4) == (0, 1, 2, 3, 3, 2, 1, 0,
                                    3, 2, 1, 0, 0, 1, 2, 3)
    s = bitpipe_actions(4, 4)
    assert (s.name, s.num_stages, s.copies, s.num_microbatches) == ("bitpipe", 8, 2, 4)
    for rank in range(4):
        mine = [x for x, r in s.stage_to_rank.items() if r == rank]
        assert sorted(s.model_stage(x) for x in mine) == sorted([rank, 7 - rank, 3 - rank, 4 + rank])
        for x in mine:  # the other copy of the same model stage sits on rank p - 1 - r (gradient partner)
            assert s.stage_to_rank[(x + 8) % 16] == 3 - rank
    assert s.stage_to_rank[3] == s.stage_to_rank[4]  # the V's tip is a local hand-off


@pytest.mark.parametrize("p,m", [(2, 2), (2, 6), (4, 4), (4, 8), (8, 8), (8, 32)])
def test_every_action_once_and_in_a_valid_order(p, m):
    s = bitpipe_actions(p, m)
    s.validate()
    S = s.num_stages
    seen = [(a.stage_index, a.computation_type, a.microbatch_index) for r in range(p) for a in s.actions[r]]
    copy_of_mb = {j: 0 if j < m // 2 else 1 for j in range(m)}  # first half down, second half up
    expected = {(c * S + k, kind, j) for j in range(m) for c in [copy_of_mb[j]] for k in range(S)
                for kind in (FORWARD, BACKWARD)}
    assert len(seen) == len(expected) == 2 * S * m
    assert set(seen) == expected
    # replay the per-rank lists in order, one action at a time from any rank whose next action is ready:
    # it must finish (the runtime executes exactly this way, so it cannot deadlock)
    done, heads = set(), [0] * p
    def ready(a):
        x, j, k = a.stage_index, a.microbatch_index, a.stage_index % S
        if a.computation_type == FORWARD:
            return k == 0 or (x - 1, FORWARD, j) in done
        return (x, FORWARD, j) in done and (k == S - 1 or (x + 1, BACKWARD, j) in done)
    while any(heads[r] < len(s.actions[r]) for r in range(p)):
        moved = False
        for r in range(p):
            if heads[r] < len(s.actions[r]) and ready(a := s.actions[r][heads[r]]):
                done.add((a.stage_index, a.computation_type, a.microbatch_index))
                heads[r] += 1
                moved = True
        assert moved, f"deadlock at {heads}"


def test_unit_time_bubble_below_interleaved_1f1b():
    # unit times (F=1, B=2 per chunk of 1/(2p)): the busy time of a rank is 6m = 48; 1F1B on p stages
    # takes (m + p - 1) * 6 = 66 units, interleaved 1F1B (v=2) m * 6 + (p - 1) * 3 = 57
    _, makespan = list_schedule(4, 8)
    assert makespan == 51


@pytest.mark.parametrize("p,m", [(3, 4), (1, 2), (4, 3), (4, 0)])
def test_bad_arguments_raise(p, m):
    with pytest.raises(ValueError, match="bitpipe needs"):
        bitpipe_actions(p, m)


def test_runtime_refuses_a_plan_bitpipe_cannot_run():
    # typed errors before any communication: BitPipe runs 2 pp model stages on an even pp (odd microbatch
    # counts: test_bad_arguments_raise)
    from parallelizer import trace, zoo
    from parallelizer.errors import PipelineError
    from parallelizer.runtime.bitpipe import build_bitpipe
    from parallelizer.runtime.pipeline import cut_stages

    model, args = zoo.gpt2(n_layer=2, n_embd=16, n_head=2, vocab_size=32, batch=1, seq_len=4)
    traced = trace(model, *args)
    with pytest.raises(PipelineError, match="runs 2 \\* pp = 4 model stages.*the plan has 2"):
        build_bitpipe(traced, None, cut_stages(traced, 2), model, pp=2, microbatches=4, loss_fn=None)
    with pytest.raises(PipelineError, match="bitpipe: bitpipe needs an even number of pipeline ranks"):
        build_bitpipe(traced, None, cut_stages(traced, 2), model, pp=1, microbatches=3, loss_fn=None)
