"""bf16 (issue 12 item 11): a model with bf16 parameters and an fp32 model with a torch.autocast(bfloat16)
region trace, plan and run on dp=2 and tp=2, and match eager at bfloat16's tolerance (`runtime.tolerance`:
torch.testing's bf16 rtol, relative to each tensor's scale, for two bf16 computations): outputs, loss, every
gradient, parameters after 3 AdamW steps. A batch norm synchronised over ranks on 16-bit inputs keeps the
precision of torch's one-device kernel (round 12)."""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
from parallelizer.runtime.tolerance import compute_dtype
from parallelizer.runtime.launch import spawn
from launch_once import run_each
from precision_models import (autocast_mlp, batch_norm_precision_rank, bf16_mlp, cast_round_trip, conv_batch_norm,
                              half_side_branch)

pytestmark = pytest.mark.distributed


def test_bf16_and_autocast_models_match_eager_at_bf16_tolerance():
    cases = []
    for fn in (bf16_mlp, autocast_mlp):
        traced = parallelizer.trace(*fn())
        assert compute_dtype(traced) == torch.bfloat16
        for mesh, roles in (({"dp": 2}, {"dp": "ddp"}), ({"tp": 2}, {"tp": "tp"})):
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(traced, mesh, axis_roles=roles)
            cases.append((fn, {}, spec_from_plan(plan)))
    reports = rehearse_many(cases, timeout_s=300)
    for (fn, _, spec), report in zip(cases, reports):
        assert report.matches(), (fn.__name__, spec.mesh, str(report))
        assert report.output > 1e-4 or report.grad > 1e-5, str(report)  # bf16 rounding is really there
    autocast_tp = reports[3]
    assert autocast_tp.collectives.get("all_reduce"), str(autocast_tp)  # the row-parallel sum runs in bf16


BN_CASES = {"float16": (torch.float16, dict(dtype="float16", hw=64, batch=16), None),
            "bfloat16": (torch.bfloat16, dict(dtype="bfloat16"), None),
            "autocast_bf16": (torch.bfloat16, dict(), "bf16"),
            "instance_autocast_bf16": (torch.bfloat16, dict(norm="instance", shift=20.0), "bf16")}


@pytest.fixture(scope="module")
def batch_norm_runs():
    """case -> (its spec, the per-rank results of `batch_norm_precision_rank`): every case's plan made here, the
    cases run in ONE launch of 2 ranks (`launch_once.run_each`; round 27, r27a: one launch per case before)."""
    specs = {}
    for case, (_, kwargs, precision) in BN_CASES.items():
        model, inputs = conv_batch_norm(**kwargs)
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles={"dp": "ddp"},
                                     **({"precision": precision} if precision else {}))
        specs[case] = spec_from_plan(plan)
    per_rank = spawn(run_each, 2, [(batch_norm_precision_rank, (specs[case], BN_CASES[case][1])) for case in BN_CASES],
                     timeout_s=600)
    return {case: (specs[case], [ranks[i] for ranks in per_rank]) for i, case in enumerate(BN_CASES)}


@pytest.mark.parametrize("case", list(BN_CASES))
def test_batch_norm_statistics_over_ranks_keep_the_precision_of_one_device(batch_norm_runs, case):
    """A training BatchNorm2d on a batch-sharded (ddp) 16-bit input synchronises its statistics in float32, as
    torch's kernel accumulates them, rounding the mean and 1/std to the input's dtype where the kernel does (a
    model cast whole to 16 bits, on CPU) and not under autocast (the planner's `precision="bf16"` recipe: float32
    weights and buffers). The per-sample channel means of the normalised output (289 or 4096 values each, whose
    one-ulp roundings average out) equal one device's within a quarter of an ulp of the dtype, 16-bit running
    buffers within one ulp and float32 ones at float32's tolerance. Before (round 12, r12c), count, sums and
    variance were held in the input's dtype: float16 with 16 x 64 x 64 values per channel (sums above 65504) gave
    NaN outputs and buffers; bfloat16 counted 8 x 17 x 17 = 2312 as 2304 (outputs 1.0e-2 off, now 5.4e-4);
    under autocast outputs were 8.7e-3 and the float32 running mean 1.1e-3 off (now 0 and 1.5e-8). An
    InstanceNorm2d tracking running statistics (its output needs no communication; its buffers average over the
    sharded batch) under autocast: running mean 6.8e-3 off, now 0."""
    dtype, _, precision = BN_CASES[case]
    spec, results = batch_norm_runs[case]
    assert (spec.autocast is not None) == (precision is not None)
    norm = next(n for n in spec.nodes if n.startswith(("batch_norm", "instance_norm")))
    assert str(spec.nodes[norm].inputs[0]) == "S(0)"  # statistics synchronised over the ranks
    for r in results:
        torch.testing.assert_close(r["out"], r["ref"], rtol=0, atol=torch.finfo(dtype).eps / 4)
        for name, ref in r["ref_buffers"].items():
            got = r["buffers"][name]
            if ref.dtype == torch.float32:
                torch.testing.assert_close(got, ref, msg=name)
            else:
                ulp = torch.finfo(ref.dtype).eps * ref.float().abs().clamp(min=1.0)
                assert ((got.float() - ref.float()).abs() <= ulp).all(), (name, got, ref)


def test_a_float32_model_narrowing_inside_is_judged_per_tensor_and_by_its_float64_replay():
    """A float32 model with a float16 side branch, and one with 16-bit round trips on its main path (r17a's
    pattern), against the same models whose one-device reference is off by 0.1% of the scale on the float32 path
    (`precision_models._skew`: the sharded programs compute the exported function, the reference 1.001 times
    it). Before (round 18, r18c), every tensor was judged at the whole graph's float16 bound: both wrong cases
    matched (ratio <= 0.9). Now the side-branch model's float32 tensors are judged at float32 (`runtime.reach`)
    and the round-trip model by its float64 replay (`runtime.replay64`, casts widened): both differ; the right
    programs still match on dp=2 and tp=2."""
    cases = []
    for fn in (half_side_branch, cast_round_trip):
        with contextlib.redirect_stdout(io.StringIO()):
            traced = parallelizer.trace(*fn())
            plans = [parallelizer.plan(traced, mesh, axis_roles=roles)
                     for mesh, roles in (({"dp": 2}, {"dp": "ddp"}), ({"tp": 2}, {"tp": "tp"}))]
        cases += [(fn, kwargs, spec_from_plan(p)) for p in plans for kwargs in ({}, {"skew": 1e-3})]
    reports = rehearse_many(cases, timeout_s=400)
    for (fn, kwargs, spec), report in zip(cases, reports):
        assert report.matches() == (not kwargs), (fn.__name__, kwargs, spec.mesh, str(report))
        assert "replayed in float64" in report.reference, str(report)  # narrowing inside, or outside its bound
