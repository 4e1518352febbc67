"""BitPipe's action lists (planner/bitpipe.py): placement, completeness, a valid execution order, and the
per-rank order of the authors' schedule figures."""
import pytest
import torch

from parallelizer.planner.bitpipe import BACKWARD, FORWARD, bitpipe_actions, bitpipe_placement

# The authors' figure github.com/wuhouming/BitPipe docs/BitPipe_images/scale-moreb.svg, panel (b) "direct
# concatenation" (p = 4 devices, N = 8 microbatches, 1-2 and 5-6 down, 3-4 and 7-8 up), read box by box from
# the SVG: per device, F / B = forward / backward of its first-half chunk (model stage < p), f / b of its
# second-half chunk, then the microbatch (1-based). Microbatches 1-4 in the same order are BitPipe-v.svg
# (N = 4, one unit). One label of device 3 is elided in the SVG ("B..."): the box is B5.
FIGURE_P4_M8 = [
    "F1 F2 F3 f3 F4 f4 f1 b1 f2 b2 b3 B3 b4 B4 B1 F5 F6 B2 F7 f7 F8 f8 f5 b5 f6 b6 b7 B7 b8 B8 B5 B6",
    "F1 F3 F2 F4 f3 f1 f4 f2 b1 b3 b2 b4 B3 B1 B4 B2 F5 F7 F6 F8 f7 f5 f8 f6 b5 b7 b6 b8 B7 B5 B8 B6",
    "F3 F1 F4 F2 f1 f3 f2 f4 b3 b1 b4 b2 B1 B3 B2 B4 F7 F5 F8 F6 f5 f7 f6 f8 b7 b5 b8 b6 B5 B7 B6 B8",
    "F3 F4 F1 f1 F2 f2 f3 b3 f4 b4 b1 B1 b2 B2 B3 F7 F8 B4 F5 f5 F6 f6 f7 b7 f8 b8 b5 B5 b6 B6 B7 B8",
]


def _tokens(s, rank):
    p = s.num_ranks
    out = []
    for a in s.actions[rank]:
        kind = "F" if a.computation_type == FORWARD else "B"
        out.append((kind if s.model_stage(a.stage_index) < p else kind.lower()) + str(a.microbatch_index + 1))
    return " ".join(out)


def test_per_rank_order_is_the_figures():
    s = bitpipe_actions(4, 8)
    assert [_tokens(s, r) for r in range(4)] == FIGURE_P4_M8
    basic = bitpipe_actions(4, 4)  # BitPipe-v.svg: one unit
    unit1 = [" ".join(t for t in row.split() if int(t[1:]) <= 4) for row in FIGURE_P4_M8]
    assert unit1[0] == "F1 F2 F3 f3 F4 f4 f1 b1 f2 b2 b3 B3 b4 B4 B1 B2"  # BitPipe-v.svg, device 1
    assert [_tokens(basic, r) for r in range(4)] == unit1


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


@pytest.mark.parametrize("p,m", [(2, 2), (2, 6), (4, 4), (4, 12), (6, 18), (8, 8), (8, 32)])
def test_every_action_once_and_in_a_valid_order(p, m):
    s = bitpipe_actions(p, m)
    s.validate()
    S = s.num_stages
    seen = [(a.stage_index, a.computation_type, a.microbatch_index) for r in range(p) for a in s.actions[r]]
    copy_of_mb = {j: 0 if j % p < p // 2 else 1 for j in range(m)}  # units of p: first half down, then up
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


@pytest.mark.parametrize("p,m", [(3, 6), (1, 2), (4, 6), (4, 2), (4, 0)])
def test_bad_arguments_raise(p, m):
    with pytest.raises(ValueError, match="bitpipe needs"):
        bitpipe_actions(p, m)


def test_runtime_refuses_a_plan_bitpipe_cannot_run():
    # typed errors before any communication: BitPipe runs 2 pp model stages on an even pp (microbatch
    # counts that are not a multiple of pp: test_bad_arguments_raise)
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


def test_the_twin_exchange_keeps_its_buffers_from_one_step_to_the_next():
    """Round 20 (r20e measured 33,915 minor faults per step over 4 ranks from fresh 13 MB exchange buffers): a copy's
    (send, receive) buffers are made once and reused while its trainable parameters keep their size and dtype;
    a change (a parameter frozen between steps) makes new ones of the new size."""
    import types
    from parallelizer.runtime.bitpipe import BitPipeRunner
    runner = types.SimpleNamespace(_exchange_buffers={})
    params = [torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(4))]
    first = BitPipeRunner._exchange_buffer(runner, 1, params)
    again = BitPipeRunner._exchange_buffer(runner, 1, params)
    assert [t.numel() for t in first] == [10, 10] and all(a is b for a, b in zip(first, again))
    assert BitPipeRunner._exchange_buffer(runner, 2, params)[0] is not first[0]  # another copy: its own buffers
    fewer = BitPipeRunner._exchange_buffer(runner, 1, params[:1])
    assert [t.numel() for t in fewer] == [6, 6] and fewer[0] is not first[0]


def test_simulated_peak_holds_the_receive_buffers_posted_at_the_steps_start():
    """Round 25 (r25i): BitPipe's runner posts every cross-rank receive of the step at its start, so each rank
    holds those buffers until their actions run. pp=2, m=4 (2 units): rank 0's cross-rank receives per unit are
    5F1 (boundary 0's activations, a0), 3F0 (boundary 2's, a2), 6B1 (boundary 2's gradients, g2), 0B0 (g0); rank
    1's mirror 1F0, 7F1, 2B0, 4B1 the same. Saved activations peak after 3F0 at 4 A (one microbatch through the 4
    stages); held then: both units' buffers less the two consumed, 4 A + a0 + a2 + 2 (g0 + g2). Torch's schedules
    (interleaved_1f1b) post theirs ahead of one action only and keep the saved-activation peak."""
    import dataclasses

    from parallelizer.planner.simulate import StageTimes, simulate

    A, fwd, bwd = 100.0, (1.0, 2.0, 4.0), (8.0, 16.0, 32.0)
    times = dataclasses.replace(StageTimes.uniform(4, 1.0, 1.0, 0.0), act_bytes=(A,) * 4, p2p_bytes=fwd,
                                p2p_bwd_bytes=bwd)
    r = simulate("bitpipe", 2, 4, times)
    assert r.peak_inflight_bytes == (4 * A + 1 + 4 + 2 * (8 + 32),) * 2
    assert r.inflight_microbatches == (1.0, 1.0)  # saved activations alone: one microbatch through the model
    plain = simulate("bitpipe", 2, 4, dataclasses.replace(times, p2p_bytes=None, p2p_bwd_bytes=None))
    assert plain.peak_inflight_bytes == (4 * A,) * 2
    inter = simulate("interleaved_1f1b", 2, 4, times)
    assert inter.peak_inflight_bytes == simulate("interleaved_1f1b", 2, 4, dataclasses.replace(
        times, p2p_bytes=None, p2p_bwd_bytes=None)).peak_inflight_bytes


def test_held_with_posted_receives_closed_form_and_refusals():
    """max(all buffers at the start, saved after action i + the buffers of the actions after i)."""
    from parallelizer.planner.bitpipe import held_with_posted_receives

    assert held_with_posted_receives([0, 0], [5, 7]) == 12  # nothing saved: the start holds every buffer
    assert held_with_posted_receives([10, 30, 0], [5, 0, 7]) == 37  # after action 1: 30 + the last's 7
    assert held_with_posted_receives([], []) == 0.0
    with pytest.raises(ValueError, match="one entry per action"):
        held_with_posted_receives([1, 2], [1])
    with pytest.raises(ValueError, match=">= 0"):
        held_with_posted_receives([1], [-1])
