"""Pipeline plans on the user's path: `parallelizer.plan(traced, {"pp": 2, "dp": 2}, schedule=, microbatches=)`
(the search with the factorisation fixed) records the stages in `Plan.pipeline`; JSON round trip byte-identical;
the stage table; typed errors; pipeline-boundary compression chosen and recorded (issue 15)."""
import contextlib
import dataclasses
import io
import json

import pytest

import parallelizer
from cost_model.topology import Link, dgx_a100
from parallelizer import zoo
from parallelizer.errors import PipelineError
from parallelizer.plan_io import plan_text
from parallelizer.planner import Plan
from parallelizer.planner.boundary import MIN_GAIN


@pytest.fixture(scope="module")
def traced():  # ONE microbatch: global batch 8 / 2 microbatches
    return parallelizer.trace(*zoo.gpt2(device="meta", n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=4,
                                        seq_len=16))


def _plan(traced, mesh, **kw):
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library's banner
        return parallelizer.plan(traced, mesh, **kw)


def test_pipeline_plan_round_trip_and_stage_table(traced):
    plan = _plan(traced, {"pp": 2, "dp": 2}, schedule="1f1b", microbatches=2)
    assert str(plan.mesh) == "(dp=2)"  # the intra-stage mesh every stage's program uses
    pipe = plan.pipeline
    assert (pipe.pp, pipe.schedule, pipe.microbatches, pipe.virtual_stages) == (2, "1f1b", 2, 1)
    assert str(pipe.mesh) == "(pp=2, dp=2)" and pipe.blocks_per_stage == (2, 2)
    assert [s.blocks for s in pipe.stages] == [("transformer.h.0", "transformer.h.1"),
                                               ("transformer.h.2", "transformer.h.3")]
    assert [s.ranks for s in pipe.stages] == [(0, 1), (2, 3)]
    assert plan.cluster["num_nodes"] * plan.cluster["devices_per_node"] == 4
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again.to_json() == text and again.pipeline == pipe
    assert json.loads(text)["pipeline"]["stages"][1]["pp_rank"] == 1
    assert _plan(traced, {"pp": 2, "dp": 2}, schedule="1f1b", microbatches=2).to_json() == text  # deterministic
    shown = plan_text(again)
    assert "Pipeline stages (pp=2, schedule 1f1b, 2 microbatches" in shown
    assert "transformer.h.2 .. transformer.h.3 (2)" in shown and "2-3" in shown
    assert "Pipeline stages" in plan.summary()


def test_interleaved_and_pp_only(traced):
    plan = _plan(traced, {"pp": 2}, schedule="interleaved_1f1b", microbatches=2)
    assert str(plan.mesh) == "(dp=1)" and plan.pipeline.virtual_stages == 2
    assert [s.pp_rank for s in plan.pipeline.stages] == [0, 1, 0, 1]


def test_pipeline_errors_are_typed_with_remedies(traced):
    uneven = _plan(traced, {"pp": 3}, microbatches=3)  # the search's cut need not be even
    assert sum(uneven.pipeline.blocks_per_stage) == 4 and len(uneven.pipeline.blocks_per_stage) == 3
    with pytest.raises(PipelineError, match=r"pp=5 stages > the 4 blocks of transformer.h.\*.*pp <= 4"):
        _plan(traced, {"pp": 5}, microbatches=5)
    with pytest.raises(PipelineError, match="must be the first"):
        _plan(traced, {"dp": 2, "pp": 2})
    with pytest.raises(PipelineError, match="schedule 'zb'"):
        _plan(traced, {"pp": 2}, schedule="zb")
    with pytest.raises(PipelineError, match="put a 'pp' axis first"):
        _plan(traced, {"dp": 2}, microbatches=2)


def test_single_program_rehearsal_refuses_a_pipeline_plan(traced):
    from parallelizer.runtime.rehearsal import checked_spec
    plan = _plan(traced, {"pp": 2}, microbatches=2)
    with pytest.raises(PipelineError, match="rehearse_pipeline"):
        checked_spec(plan, zoo.gpt2, {})


# --- pipeline-boundary compression (issue 15, Build 3 and 5): the planner picks int8 where the pipeline link is
# slow Ethernet, nothing on DGX InfiniBand, forced codecs on request; JSON round trip, schema, `show`.
# 2 nodes x 2 A100s: pp=2 x dp=2 puts the pipeline axis across nodes. Slow: the nodes on 1 Gbit/s Ethernet
# (125 MB/s per direction, IEEE 802.3ab; 50 us per message assumed); fast: DGX A100's 200 Gb/s InfiniBand.
DGX = dgx_a100(2, devices_per_node=2)
ETHERNET = dataclasses.replace(DGX, inter_node_link=Link("ethernet_1g", 50e-6, 125e6))


def _compressed(traced, cluster, option, **kw):
    return _plan(traced, {"pp": 2, "dp": 2}, cluster=cluster, schedule="1f1b", microbatches=2,
                 boundary_compression=option, **kw)


def test_auto_picks_int8_on_slow_links_and_records_it(traced):
    plan = _compressed(traced, ETHERNET, "auto")
    comp = plan.pipeline.compression
    assert comp is not None and comp.option == "auto"
    assert [b.codec for b in comp.boundaries] == ["int8"] and comp.boundaries[0].bits == 8
    b = comp.boundaries[0]
    assert b.p2p_s < b.uncompressed_p2p_s and 0.25 < b.wire_ratio < 1  # hidden state int8, the mask kept
    assert comp.step_s * (1 + MIN_GAIN) <= comp.uncompressed_step_s
    assert plan.pipeline.estimate.step_s == pytest.approx(comp.step_s, rel=1e-9)
    text = plan.to_json()
    again = Plan.from_json(text)  # validated against plan_schema.json
    assert again.pipeline.compression == comp and again.to_json() == text
    assert json.loads(text)["config"]["boundary_compression"] == "auto"
    shown = plan_text(again)
    assert "Pipeline boundary compression (auto)" in shown and "8-bit" in shown and "0 -> 1" in shown
    assert f"({comp.speedup:.2f}x)" in shown and "boundary compression" in plan.summary().lower()


def test_auto_keeps_full_precision_on_infiniband_and_none_means_none(traced):
    assert _compressed(traced, DGX, "auto").pipeline.compression is None
    plain = _compressed(traced, ETHERNET, "none")
    assert plain.pipeline.compression is None and "boundary_compression" not in plain.config
    forced = _compressed(traced, DGX, "lowrank", boundary_rank=4).pipeline.compression  # forced even where it is slower
    assert [(b.codec, b.rank) for b in forced.boundaries] == [("lowrank", 4)]
    # the hidden state (4, 16, 64) sent as (4, 16, 4); the float causal mask (4, 1, 16, 16) carries no gradient
    assert forced.boundaries[0].wire_ratio == pytest.approx((4 * 16 * 4 + 4 * 16 * 16) / (4 * 16 * 64 + 4 * 16 * 16))
    with pytest.raises(ValueError, match="boundary_compression='zip'"):
        _compressed(traced, DGX, "zip")
