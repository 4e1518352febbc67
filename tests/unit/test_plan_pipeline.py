"""Pipeline plans on the user's path: `parallelizer.plan(traced, {"pp": 2, "dp": 2}, schedule=, microbatches=)`
(the search with the factorisation fixed) records the stages in `Plan.pipeline`; JSON round trip byte-identical;
the stage table; typed errors."""
import contextlib
import io
import json

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.errors import PipelineError
from parallelizer.plan_io import plan_text
from parallelizer.planner import Plan


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
