"""Pipelines over layers that are not all identical (round 15, r15d) on 4 gloo ranks in ONE launch
(`launch_once`), each against one device by the rank body of `parallelizer rehearse`
(`runtime.pipeline_rehearsal._rank_main`: eager gradient accumulation over the same microbatches, and the whole
batch at once for the loss; loss, every gradient every step, parameters after 3 AdamW steps, within float32's
bound):

- layers of two kinds alternating (x-transformers' attention / feed-forward entries, Jamba's Mamba / attention
  layers, Qwen3-MoE's dense / MoE layers) cut between every layer on pp=4 (before: refused, "pp=4 stages > the 2
  blocks of layers.*"), and cut (1, 3) on pp=2 x tp=2 with tensor-parallel stages of different contents;
- DiT's head calling the first block's embedding (`transformer_blocks[0].norm1.emb`) on pp=2 x dp=2: the first
  and last stages hold that embedding as a tied weight (gradients summed);
- PixArt's caption projection (two Linear(d, d), a repeated group ahead of the blocks) on pp=2 x dp=2: cut between
  the blocks, the projected caption sent to the second stage (before: refused, round 17, r17b).
"""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from parallelizer.runtime.pipeline_rehearsal import _rank_main as rehearsal_rank
from parallelizer.runtime.rehearsal import _report
from launch_once import run_each
from layer_kinds_models import dit_like, hybrid_lm, pixart_like

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

CASES = {  # name: (builder, global batch, mesh, plan options, blocks per stage)
    "hybrid_pp4_1f1b": (hybrid_lm, 8, {"pp": 4}, dict(schedule="1f1b", microbatches=4), (1, 1, 1, 1)),
    "hybrid_pp2_tp2_gpipe": (hybrid_lm, 8, {"pp": 2, "tp": 2},
                             dict(schedule="gpipe", microbatches=2, axis_roles={"tp": "tp"}), None),
    "dit_pp2_dp2_1f1b": (dit_like, 8, {"pp": 2, "dp": 2},
                         dict(schedule="1f1b", microbatches=2, axis_roles={"dp": "ddp"}), (2, 2)),
    "pixart_pp2_dp2_1f1b": (pixart_like, 8, {"pp": 2, "dp": 2},
                            dict(schedule="1f1b", microbatches=2, axis_roles={"dp": "ddp"}), (2, 2)),
}


def _plan(fn, batch, mesh, options):
    traced = parallelizer.trace(*fn(batch=batch // options["microbatches"]))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, mesh, **options)


@pytest.fixture(scope="module")
def runs():
    plans = {name: _plan(fn, batch, mesh, options) for name, (fn, batch, mesh, options, _) in CASES.items()}
    calls = [(rehearsal_rank, (CASES[name][0], {"batch": CASES[name][1]}, spec_from_plan(plan),
                               plan.pipeline.to_dict(), 3, 1e-3, 1e-3)) for name, plan in plans.items()]
    per_rank = spawn(run_each, 4, calls, timeout_s=600)
    return {name: (plans[name], [r[i] for r in per_rank]) for i, name in enumerate(plans)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_pipeline_over_layers_of_several_kinds_matches_one_device(runs, name):
    plan, per_rank = runs[name]
    blocks = CASES[name][4]
    if blocks is not None:
        assert plan.pipeline.blocks_per_stage == blocks, plan.pipeline.blocks_per_stage
    report = _report(4, per_rank, "", None)  # what `parallelizer rehearse` prints and judges
    assert report.matches(), str(report)
    if "tp2" in name:
        assert any(k != "grad_all_reduce" for k in report.collectives), report.collectives  # tp really used
