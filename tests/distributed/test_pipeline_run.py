"""Pipeline parallelism on 4 gloo ranks (issue: pipeline): transformers GPT-2 with 4 layers and a tied
embedding / lm_head, cut into stages at layer boundaries and run with torch.distributed.pipelining.
Loss and every gradient after one step, parameters after 3 AdamW steps, and gradients accumulated over two
`step` calls (two batches before one optimizer step, tied embedding included) match the single-device model
within 1e-5, for pp=2 x tp=2, pp=4 with Interleaved1F1B and pp=2 x dp=2 with 4 microbatches, whose dp
gradient sync must run once per step (one bucket all-reduce, counted), not once per microbatch
(pp=2 x dp=2 gpipe and pp=4 1F1B on the user's path: test_pipeline_rehearse.py).

In the same launch, plans made with precision="bf16" (the autocast recipe, `runtime.precision`) train 2 AdamW
steps against the eager single-device model under the same torch.autocast(bfloat16) over the same
microbatches: GPT-2 pp=2 x dp=2 with bitpipe (our runner) and pp=2 x tp=2 with zbv (torch's runtime, V
placement), and a stack of bias-free Linear -> ReLU blocks, whose pipeline boundary values and their
gradients are bfloat16, pp=2 x dp=2 with 1f1b: loss, every gradient and the parameters within the recipe bound
(`runtime.rehearsal._max_diff`: bfloat16 tolerance, or no further from the fp32 model than twice the
single-device recipe). And the rank body of `parallelizer rehearse` (`runtime.pipeline_rehearsal._rank_main`) on
a plan made by `parallelizer plan --mesh pp=2,dp=2 --precision bf16` of the GPT-2 preset (its own causal-LM
loss, computed in the last stage under autocast): the report matches and names the autocast reference."""
import contextlib
import functools
import io

import pytest

import parallelizer
from parallelizer import cli, presets, zoo
from parallelizer.planner import Plan
from parallelizer.rewriter.grad_sync import FIRST_BUCKET_BYTES
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from parallelizer.runtime.pipeline_rehearsal import _rank_judged, _rank_main as rehearsal_rank
from parallelizer.runtime.rehearsal import _report
from launch_once import run_each
from pipeline_workers import judged_with_a_wrong_gradient, run_bf16_pipeline, run_pipeline
from precision_models import linear_stack
from trial_models import norm_fed_bias_stack

# pytest-timeout's 600 s (pyproject) covers the module fixture's setup too: it must not cut the launch's own 900 s
# deadline short (that one names the ranks still running; a loaded machine can take several times the idle time)
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1200)]

GPT2_4 = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=8, seq_len=16)
WIDE_TP = dict(n_embd=1024, n_head=16, seq_len=256)            # weights dominate: tensor parallel pays

# pp=2 x dp=2 (gpipe) and pp=4 (1f1b) run on the user's path in test_pipeline_rehearse.py (plan -> rehearse);
# here: a wide-model intra-stage TP plan, interleaved virtual stages, and gradient accumulation over steps.
CASES = {  # name: (intra-stage mesh, plan options, wide config, pp, stages, schedule, microbatches)
    "pp2_tp2": ({"tp": 2}, {"data_axes": ()}, WIDE_TP, 2, 2, "1f1b", 2),
    "pp4_interleaved_1f1b": ({"dp": 1}, {}, {}, 4, 8, "interleaved_1f1b", 4),  # dp=1: nothing to plan wide
    # pp2_dp2_m4: the dp gradient sync runs once per step, not once per microbatch
    "pp2_dp2_m4": ({"dp": 2}, {"axis_roles": {"dp": "ddp"}}, {}, 2, 2, "1f1b", 4),
}

GPT2_BF16 = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, seq_len=16)
BF16_CASES = {  # name: (builder, its kwargs, mesh, plan options, schedule, microbatches, global batch)
    "bf16_gpt2_pp2_dp2_bitpipe": (zoo.gpt2, GPT2_BF16, {"pp": 2, "dp": 2}, {"axis_roles": {"dp": "ddp"}}, "bitpipe", 2, 8),
    "bf16_gpt2_pp2_tp2_zbv": (zoo.gpt2, GPT2_BF16, {"pp": 2, "tp": 2}, {"axis_roles": {"tp": "tp"}}, "zbv", 4, 8),
    "bf16_stack_pp2_dp2_1f1b": (linear_stack, {}, {"pp": 2, "dp": 2}, {"axis_roles": {"dp": "ddp"}}, "1f1b", 2, 8),
}


def _bf16_plan(fn, kwargs, mesh, options, schedule, microbatches, batch):
    """A pipeline plan with precision="bf16" (`parallelizer.plan`: records the autocast recipe) on one microbatch."""
    example = fn(batch=batch // microbatches, **kwargs)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(parallelizer.trace(*example), mesh, schedule=schedule, microbatches=microbatches,
                                 precision="bf16", **options)


PRESET = ["--model", "gpt2", "--config", "n_layer=4,n_embd=64,n_head=4,vocab_size=256", "--seq-len", "16"]


def _cli_bf16_plan(out) -> Plan:
    """`parallelizer plan ... --mesh pp=2,dp=2 --precision bf16` (gpipe, 2 microbatches of 4)."""
    argv = ["plan", *PRESET, "--mesh", "pp=2,dp=2", "--roles", "dp=ddp", "--schedule", "gpipe", "--microbatches", "2",
            "--global-batch", "8", "--precision", "bf16", "--no-progress", "-o", str(out)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(argv) == 0
    return Plan.load(out)


def _intra_stage_plan(mesh, options, wide):
    """The planner's (dp, tp) plan for one stage group, made on a wide GPT-2 of one microbatch."""
    traced = parallelizer.trace(*zoo.gpt2(device="meta", **{**GPT2_4, **wide}))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, mesh, **options)


BF16_CANCELLING = {"dtype": "bfloat16", "scale": 0.1}  # `norm_fed_bias_stack` as a bf16 model


def _cancelling_plan(**options) -> Plan:
    """pp=2 x dp=2 (ddp), 1f1b, 2 microbatches of 4 of `norm_fed_bias_stack(**options)`."""
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(*norm_fed_bias_stack(batch=4, **options)), {"pp": 2, "dp": 2},
                                 schedule="1f1b", microbatches=2, axis_roles={"dp": "ddp"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both cases' intra-stage plans, then ONE launch of 4 gloo ranks running both (`launch_once`):
    {name: (plan, [rank 0's report, ..., rank 3's])}."""
    plans, calls = {}, []
    for name, (mesh, options, wide, pp, stages, schedule, microbatches) in CASES.items():
        batch = wide.get("batch", GPT2_4["batch"]) // microbatches
        plans[name] = _intra_stage_plan(mesh, options, {**wide, "batch": batch})
        calls.append((run_pipeline, (GPT2_4, spec_from_plan(plans[name]), pp, stages, schedule, microbatches)))
    for name, (fn, kwargs, *rest) in BF16_CASES.items():
        plans[name] = _bf16_plan(fn, kwargs, *rest)
        calls.append((run_bf16_pipeline, (fn, {**kwargs, "batch": rest[-1]}, spec_from_plan(plans[name]),
                                          plans[name].pipeline.to_dict(), 2)))
    plans["bf16_rehearse"] = plan = _cli_bf16_plan(tmp_path_factory.mktemp("bf16") / "plan.json")
    calls.append((rehearsal_rank, (presets.build_cpu, cli._global_batch(plan.model["recipe"], 2), spec_from_plan(plan),
                                   plan.pipeline.to_dict(), 2, 1e-3, 1e-3)))  # as `parallelizer rehearse` runs it
    plans["cancelling"] = plan = _cancelling_plan()
    judged = (norm_fed_bias_stack, {"batch": 8}, spec_from_plan(plan), plan.pipeline.to_dict(), 3, 1e-3, 1e-3, False)
    calls += [(_rank_judged, judged), (judged_with_a_wrong_gradient, judged)]
    plans["cancelling_wrong"] = plan
    plans["cancelling_bf16"] = plans["cancelling_bf16_wrong"] = plan = _cancelling_plan(**BF16_CANCELLING)
    judged = (norm_fed_bias_stack, {"batch": 8, **BF16_CANCELLING}, spec_from_plan(plan), plan.pipeline.to_dict(), 3,
              1e-3, 1e-3, False)
    calls += [(_rank_judged, judged), (functools.partial(judged_with_a_wrong_gradient, factor=1.1), judged)]
    per_rank = spawn(run_each, 4, calls, timeout_s=900)
    names = [*CASES, *BF16_CASES, "bf16_rehearse", "cancelling", "cancelling_wrong", "cancelling_bf16",
             "cancelling_bf16_wrong"]
    return {name: (plans[name], [r[i] for r in per_rank]) for i, name in enumerate(names)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pipeline_matches_single_device(runs, name):
    pp = CASES[name][3]
    plan, reports = runs[name]
    if plan.mesh.world_size > 1:
        kinds = {s.kind for _, s in plan.steps()}
        expected = "grad_all_reduce" if "dp" in name else "all_gather"
        assert expected in kinds, (name, kinds)
    for rank, r in enumerate(reports):
        assert r["loss"] <= 1e-5 and r["grad"] <= 1e-5 and r["params"] <= 1e-5, (name, rank, r)
        assert r["accumulated"] <= 1e-5, (name, rank, r["accumulated"])  # two steps accumulate like eager
        assert "does not split into" in r["uneven_batch_error"]
        if "dp2" in name:  # each stage's gradients (< 1 MiB, FIRST_BUCKET_BYTES) fill one bucket per backward:
            # one all-reduce per step, not one per microbatch (m = 4), and no per-parameter fallback
            assert max(r["stage_param_bytes"]) < FIRST_BUCKET_BYTES, r["stage_param_bytes"]
            assert r["bucket_launches_per_step"] == 1 and r["sync_fallbacks"] == 0, (rank, r)
    if pp == 2 and plan.mesh.world_size > 1:
        assert "_tp = " in reports[0]["stages"][0] or "_dp = " in reports[0]["stages"][0]


@pytest.mark.parametrize("name", sorted(BF16_CASES))
def test_bf16_pipeline_matches_single_device_under_autocast(runs, name):
    plan, reports = runs[name]
    assert plan.config["mixed_precision"] == "autocast_bf16" and plan.pipeline.schedule == BF16_CASES[name][4]
    assert plan.pipeline.pp == 2 and plan.mesh.world_size == 2
    for rank, r in enumerate(reports):
        for key in ("loss", "grad", "params"):  # (|diff| to the autocast reference, its ratio to the bound, |diff| to fp32)
            assert r[key][1] <= 1.0, (name, rank, key, r)
        assert r["grad"][2] > 0 and r["params"][2] > 0, (name, rank, r)  # bf16 rounding really happened
        if r["last"]:
            assert r["loss"][2] > 0, (name, rank, r)
    outputs = {d for r in reports for d in r["outputs"]}
    sent = {d for r in reports for d in r["sent"]}  # what stages other than the last send to the next one
    assert "torch.bfloat16" in outputs, (name, outputs)  # the stages ran under autocast (bf16 logits / activations)
    # GPT-2's block boundary is the residual sum (fp32); the Linear -> ReLU stack sends bf16 (and gets bf16 back)
    assert sent == ({"torch.bfloat16"} if "stack" in name else {"torch.float32"}), (name, sent)


def test_bf16_pipeline_plan_rehearses_like_parallelizer_rehearse(runs):
    plan, per_rank = runs["bf16_rehearse"]
    assert plan.pipeline.pp == 2 and plan.config["mixed_precision"] == "autocast_bf16"
    report = _report(4, per_rank, "", plan.config["mixed_precision"])  # what rehearse_pipeline returns
    assert report.matches(), str(report)
    assert "reference: the single-device model under torch.autocast(bfloat16)" in str(report), str(report)
    assert report.collectives.get("grad_all_reduce"), report.collectives


def test_pipeline_rehearsal_judges_rounding_of_a_cancelling_sum_against_float64(runs):
    """A bias whose gradient is 0 in exact arithmetic and a sum of large cancelling terms in fp32
    (`trial_models.NormFedBiasStack`) on pp=2 x dp=2: the dp ranks sum their halves in another order than one
    device, so the gradient differs by ~2e-3 (ratio ~200 to the fp32 bound) and AdamW moves the bias ~1e-3 apart;
    one device's fp32 lies as far from float64. The pipeline rehearsal now reruns such a case judged also against a
    float64 copy of the model (`rehearsal.float64_excess`, as rehearsals on one mesh do) and matches; before, it
    reported NUMERICS DIFFER for a right program."""
    plan, per_rank = runs["cancelling"]
    assert all(r["float64_judge"] for r in per_rank), "the fp32 bound alone flagged nothing: the case tests nothing"
    report = _report(4, per_rank)
    assert report.matches(), str(report)
    assert report.grad > 1e-4 and "float64 copy" in report.reference, str(report)


def test_pipeline_rehearsal_with_the_float64_judge_still_flags_a_wrong_gradient(runs):
    """The same case with one weight's gradient made 0.1% wrong on every rank: judged against float64 too, it
    differs (a wrong term is off by the size of the values, far beyond their rounding)."""
    plan, per_rank = runs["cancelling_wrong"]
    report = _report(4, per_rank)
    assert not report.matches() and report.worst_grad.startswith("blocks.1.linear.weight"), str(report)


def test_a_bf16_pipeline_is_judged_against_float64_in_its_own_tolerances(runs):
    """The same model cast whole to bf16 (inputs of 0.1, where its forward stays within 1% of float64's) on
    pp=2 x dp=2: the bias gradients carry bf16 rounding of the cancelling terms' size, on one device and on the
    ranks alike. Judged by the bf16 bound alone it reported NUMERICS DIFFER at 69x (fp16: 818x) for a right
    program; the float64 copy, in bf16's tolerances, now judges 16-bit programs too (0.39); a weight gradient
    made 10% wrong still differs."""
    plan, per_rank = runs["cancelling_bf16"]
    assert all(r["float64_judge"] for r in per_rank), "the bf16 bound alone flagged nothing: the case tests nothing"
    report = _report(4, per_rank)
    assert report.matches() and "float64 copy" in report.reference, str(report)
    plan, per_rank = runs["cancelling_bf16_wrong"]
    report = _report(4, per_rank)
    assert not report.matches() and max(r["grad"][2] for r in per_rank) > 1, str(report)
