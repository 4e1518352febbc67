"""bf16 mixed precision at run time (issue 13, Build 3; `runtime.precision`): a plan made with precision="bf16"
for an fp32 model runs its forward under torch.autocast(bfloat16) with fp32 weights and fp32 gradients.
On 2 gloo ranks the in-repo GPT matches the single-device model run under the same autocast recipe
(`runtime.rehearsal.recipe_excess`: no further from the fp32 model than twice the single-device recipe, or
within bfloat16's tolerance of
`runtime.tolerance`): outputs, loss, every gradient, parameters after 3 AdamW steps, for tp=2 (Megatron: the
row-parallel sum reduced in bf16) and, through `parallelizer plan --precision bf16` and `parallelizer
rehearse`'s path, dp=2 (DDP: fp32 gradient all-reduce); the report says what it compared with. That the program
really runs in bf16, and that fp32 plans run unchanged: tests/unit/test_mixed_precision_runtime.py."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer import cli, presets, zoo
from parallelizer.planner import Plan
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many

pytestmark = pytest.mark.distributed

GPT = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, block_size=64)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """tp=2 planned in Python and dp=2 planned by `parallelizer plan --precision bf16`, rehearsed in ONE launch of
    2 ranks (as `parallelizer rehearse` runs each: the plan's spec, the recipe's model)."""
    traced = parallelizer.trace(*zoo.gpt(device="meta", batch=8, seq_len=16, **GPT))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        tp = parallelizer.plan(traced, {"tp": 2}, axis_roles={"tp": "tp"}, precision="bf16")
        out = tmp_path_factory.mktemp("bf16") / "plan.json"
        config = ",".join(f"{k}={v}" for k, v in GPT.items())
        assert cli.main(["plan", "--model", "gpt", "--config", config, "--seq-len", "16", "--global-batch", "8",
                         "--cluster", "h100:1x2", "--mesh", "dp=2", "--roles", "dp=ddp", "--precision", "bf16",
                         "--no-progress", "-o", str(out)]) == 0
    dp = Plan.load(out)
    found = rehearse_many([(zoo.gpt, dict(batch=8, seq_len=16, **GPT), spec_from_plan(tp)),
                           (presets.build_cpu, dp.model["recipe"], spec_from_plan(dp))], timeout_s=300)
    return {"tp": (tp, found[0]), "dp": (dp, found[1])}


@pytest.mark.parametrize("name", ["tp", "dp"])
def test_bf16_plan_matches_the_autocast_reference(reports, name):
    plan, report = reports[name]
    assert plan.config["precision"] == "bf16" and plan.config["mixed_precision"] == "autocast_bf16"
    assert report.matches(), str(report)
    # what `parallelizer rehearse` prints (str(report)) says what the sharded program was compared with
    assert "reference: the single-device model under torch.autocast(bfloat16)" in str(report), str(report)
    assert report.output > 1e-4, str(report)  # two bf16 computations: their rounding is really there
    kind = {"tp": "all_reduce", "dp": "grad_all_reduce"}[name]  # tp: the row-parallel sum, in bf16
    assert report.collectives.get(kind), report.collectives
