"""A plan recomputes only what its program can run: blocks whose forward writes state in place are never recomputed
(`planner.recompute.state_writing`), nor "selective" blocks without an attention core (`planner.recompute.runnable`):
recomputation would write the state twice, and the emitted program refused such regions on every rank
(`rewriter.recompute`), so recompute="full" on a model of Linear -> BatchNorm blocks, or "auto" under a budget
that needs recomputation, made a plan that could not run (round 13)."""
import contextlib
import io
import sys
from pathlib import Path

import parallelizer
from parallelizer import zoo
from parallelizer.planner.recompute import forced_regions, state_writing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from state_models import state_blocks  # noqa: E402


def _plan(model, inputs, mesh, **options):
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), mesh, **options)


def test_blocks_writing_state_are_found_and_forced_none_and_others_are_not():
    for ema in (False, True):
        traced = parallelizer.trace(*state_blocks(ema=ema))
        assert sorted(state_writing(traced)) == ["blocks.0", "blocks.1"]
        assert forced_regions(traced) == {"blocks.0": "none", "blocks.1": "none"}
    gpt = parallelizer.trace(*zoo.gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=64, batch=2, seq_len=8))
    assert state_writing(gpt) == {} and forced_regions(gpt) == {}


def test_a_forced_recompute_leaves_them_out_and_says_so_on_one_mesh_and_on_a_pipeline():
    model, inputs = state_blocks()
    plan = _plan(model, inputs, {"dp": 2}, axis_roles={"dp": "ddp"}, recompute="full")
    assert plan.recompute == {}
    assert any("not recomputed: their forward writes state in place" in n for n in plan.notes())
    assert {f.reason.split(":")[0] for f in plan.fallbacks} >= {"recompute"}
    pipeline = _plan(*state_blocks(batch=4), {"pp": 2}, schedule="1f1b", microbatches=2, recompute="full")
    assert pipeline.recompute == {}
    gpt = _plan(*zoo.gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=64, batch=2, seq_len=8), {"dp": 2},
                recompute="full")
    assert set(gpt.recompute.values()) == {"full"} and len(gpt.recompute) == 2  # other blocks still recomputed


def test_selective_on_blocks_without_an_attention_core_is_left_out_and_attention_blocks_keep_it():
    """recompute="selective" on MLP blocks (no attention core: nothing to recompute) was written into the plan, and
    the emitted program refused it on every rank ("the region has no attention core"); one mesh and pipelines."""
    mlp = zoo.mlp(batch=8, in_features=16, dim=32, hidden=64, out_features=4)
    assert _plan(*mlp, {"dp": 2}, axis_roles={"dp": "ddp"}, recompute="selective").recompute == {}
    micro = zoo.mlp(batch=4, in_features=16, dim=32, hidden=64, out_features=4)
    assert _plan(*micro, {"pp": 2}, schedule="1f1b", microbatches=2, recompute="selective").recompute == {}
    gpt = _plan(*zoo.gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=64, batch=2, seq_len=8), {"dp": 2},
                recompute="selective")
    assert gpt.recompute == {"transformer.h.0": "selective", "transformer.h.1": "selective"}, gpt.recompute
