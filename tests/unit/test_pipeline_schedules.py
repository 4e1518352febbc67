"""Schedule placement, validity and in-flight microbatches (the bubbles are tested on the simulator:
test_simulate.py)."""
import pytest

from cost_model.memory import inflight_microbatches as cm_inflight
from parallelizer.planner.schedules import inflight_microbatches, invalid_reason, rank_of_stage


def test_inflight_counts():
    p, m = 4, 16
    assert [inflight_microbatches("gpipe", p, m, r) for r in range(p)] == [16] * 4
    assert [inflight_microbatches("1f1b", p, m, r) for r in range(p)] == [4, 3, 2, 1]
    assert [inflight_microbatches("1f1b", p, 2, r) for r in range(p)] == [2, 2, 2, 1]
    assert inflight_microbatches("1f1b", p, m, 1) == cm_inflight("1f1b", p, m, 1)
    # Megatron's warm-up 2(p-r-1) + (v-1)p, + 1, chunk-microbatches of 1/v of the rank's activations
    assert [inflight_microbatches("interleaved_1f1b", p, m, r) for r in range(p)] == [5.5, 4.5, 3.5, 2.5]
    assert [inflight_microbatches("zbv", p, m, r) for r in range(p)] == [4, 4, 4, 4]
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        inflight_microbatches("dualpipe", p, m, 0)


def test_rank_mapping_and_validity():
    assert [rank_of_stage("interleaved_1f1b", s, 4) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [rank_of_stage("zbv", s, 4) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [rank_of_stage("1f1b", s, 3) for s in range(3)] == [0, 1, 2]
    assert invalid_reason("interleaved_1f1b", 4, 6, 48) is not None
    assert invalid_reason("zbv", 4, 7, 48) is not None and invalid_reason("zbv", 4, 8, 48) is None
    assert invalid_reason("1f1b", 8, 1, 4) == "8 stages > 4 blocks"


def test_bitpipe_validity_and_placement():
    from parallelizer.planner.schedules import ranks_of_stage
    assert invalid_reason("bitpipe", 4, 8, 48) is None and invalid_reason("bitpipe", 32, 64, 256) is None
    assert "even" in invalid_reason("bitpipe", 3, 8, 48) and "even" in invalid_reason("bitpipe", 4, 7, 48)
    assert "multiple of pp" in invalid_reason("bitpipe", 4, 6, 48)  # units of pp microbatches
    # peak in flight (the simulated one, test_simulate.py): rank 0 and 3 of pp=4 keep 1.75, ranks 1, 2 keep 2
    assert [inflight_microbatches("bitpipe", 4, 8, r) for r in range(4)] == [1.75, 2.0, 2.0, 1.75]
    # down copy in a V, up copy mirrored: rank r holds {r, 2p-1-r} down and {p-1-r, p+r} up
    assert [ranks_of_stage("bitpipe", s, 4) for s in range(8)] == [(0, 3), (1, 2), (2, 1), (3, 0),
                                                                   (3, 0), (2, 1), (1, 2), (0, 3)]
