"""bf16 mixed precision at run time (issue 13, Build 3; `runtime.precision`): a plan made with precision="bf16"
for an fp32 model runs its forward under torch.autocast(bfloat16) with fp32 weights and fp32 gradients.
On 2 gloo ranks (dp=2 DDP and tp=2 Megatron) the in-repo GPT matches the single-device model run under the
same autocast recipe (`runtime.rehearsal.recipe_excess`: within twice the recipe's own rounding, or within
bfloat16's tolerance of `runtime.tolerance`): outputs, loss, every gradient, parameters after 3 AdamW steps.
One launch of ranks. That the program really runs in bf16 and fp32 plans run unchanged: tests/unit/
test_mixed_precision_runtime.py."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many

pytestmark = pytest.mark.distributed

GPT = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, block_size=64, batch=8, seq_len=16)
CASES = {  # name: (mesh, axis roles, precision)
    "bf16_dp2": ({"dp": 2}, {"dp": "ddp"}, "bf16"),
    "bf16_tp2": ({"tp": 2}, {"tp": "tp"}, "bf16"),
}


@pytest.fixture(scope="module")
def reports():
    traced = parallelizer.trace(*zoo.gpt(device="meta", **GPT))
    plans = {}
    for name, (mesh, roles, precision) in CASES.items():
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            plans[name] = parallelizer.plan(traced, mesh, axis_roles=roles, precision=precision)
    found = rehearse_many([(zoo.gpt, GPT, spec_from_plan(plans[n])) for n in CASES], timeout_s=300)
    return {n: (plans[n], r) for n, r in zip(CASES, found)}


@pytest.mark.parametrize("name", ["bf16_dp2", "bf16_tp2"])
def test_bf16_plan_matches_the_autocast_reference_at_bf16_tolerance(reports, name):
    plan, report = reports[name]
    assert plan.config["precision"] == "bf16" and plan.config["mixed_precision"] == "autocast_bf16"
    assert report.matches(), (name, str(report))
    assert "torch.autocast(bfloat16)" in str(report), str(report)  # the report says what it compared with
    assert report.output > 1e-4, str(report)  # two bf16 computations: their rounding is really there
    kind = "grad_all_reduce" if "dp" in name else "all_reduce"
    assert report.collectives.get(kind), (name, report.collectives)

