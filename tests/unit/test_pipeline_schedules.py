"""Schedule closed forms: bubbles (Narayanan et al. 2021; Qi et al. 2023) and in-flight microbatches."""
import pytest

from cost_model.memory import inflight_microbatches as cm_inflight
from parallelizer.planner.schedules import (bubble_fraction, bubble_ratio, inflight_microbatches, invalid_reason,
                                            pipeline_time_s, rank_of_stage)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 8), (4, 4), (8, 32), (16, 3)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_1f1b_bubble(name, p, m):
    pipe, bubble = pipeline_time_s(name, p, m, 0.3, 0.4, 0.3)  # T = 1
    assert pipe == pytest.approx(m + p - 1)
    assert bubble_fraction(pipe, bubble) == pytest.approx((p - 1) / (m + p - 1))
    assert bubble_ratio(pipe, bubble) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p,m", [(2, 8), (4, 4), (8, 64)])
def test_interleaved_bubble(p, m):
    v = 2
    pipe, bubble = pipeline_time_s("interleaved_1f1b", p, m, 0.5, 0.25, 0.25)
    assert bubble == pytest.approx((p - 1) / v)
    assert bubble_ratio(pipe, bubble) == pytest.approx((p - 1) / (v * m))
    assert bubble_fraction(pipe, bubble) == pytest.approx((p - 1) / (v * m + p - 1))


def test_zero_bubble_v():
    # T_F = T_B = T_W: zero bubble (Qi et al., table of ZB-V); otherwise (p-1) max(0, F+B-2W) per chunk
    assert pipeline_time_s("zbv", 4, 8, 1.0, 1.0, 1.0) == (24.0, 0.0)
    pipe, bubble = pipeline_time_s("zbv", 4, 8, 2.0, 2.0, 1.0)
    assert bubble == pytest.approx(3 * (2.0 + 2.0 - 2 * 1.0) / 2)
    assert pipe == pytest.approx(8 * 5.0 + bubble)


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
