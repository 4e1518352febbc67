"""Pipeline plans on the user's path (issue 13): `parallelizer plan --mesh pp=2,... --schedule --microbatches`
then `parallelizer rehearse plan.json --nproc 4` on a 4-layer GPT-2 preset (tied embedding / lm_head, its own
causal-LM loss with ignored labels): loss, every gradient and the parameters after 2 AdamW steps match one
device (eager gradient accumulation over the same microbatches) within 1e-5, for pp=2 x tp=2, pp=2 x dp=2
and pp=4, each with activation recomputation forced (`--recompute full|selective`: the stage programs rerun
their blocks / attention cores under torch.utils.checkpoint). Axis roles make the tiny model's intra-stage
plan use its axis (the cost model would replicate)."""
import contextlib
import io

import pytest

from parallelizer.cli import main, rehearse_plan
from parallelizer.planner import Plan

pytestmark = pytest.mark.distributed

MODEL = ["--model", "gpt2", "--config", "n_layer=4,n_embd=64,n_head=4,vocab_size=256", "--seq-len", "16"]
CASES = {  # name: (mesh, roles, schedule, microbatches, collective expected on rank 0, recomputation)
    # stage 0's own solve (embedding + 2 blocks) gathers activations over tp for its matmuls (since round 15 a gather
    # that several uses share is priced once; before, it sharded them along the sequence: reduce_scatter)
    "pp2_tp2": ("pp=2,tp=2", "tp=tp", "1f1b", 2, "all_gather", "full"),
    "pp2_dp2": ("pp=2,dp=2", "dp=ddp", "gpipe", 2, "grad_all_reduce", "selective"),
    "pp4": ("pp=4", None, "1f1b", 4, None, "full"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rehearse_pipeline_plan(name, tmp_path):
    mesh, roles, schedule, microbatches, collective, recompute = CASES[name]
    out = tmp_path / "plan.json"
    argv = ["plan", *MODEL, "--mesh", mesh, "--schedule", schedule, "--microbatches", str(microbatches),
            "--global-batch", str(4 * microbatches), "--recompute", recompute, "--no-progress", "-o", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        assert main(argv + (["--roles", roles] if roles else [])) == 0
    assert "Pipeline stages" in shown.getvalue() and "traced batch: 4" in shown.getvalue()
    plan = Plan.load(out)
    assert plan.pipeline.pp == int(mesh.split(",")[0].split("=")[1]) and plan.pipeline.microbatches == microbatches
    assert plan.recompute == {f"transformer.h.{i}": recompute for i in range(4)}, plan.recompute
    with contextlib.redirect_stdout(io.StringIO()):
        report = rehearse_plan(plan, 4, width="real", steps=2, timeout_s=300)
    assert report.matches(), (name, str(report))
    assert max(report.loss, report.grad, report.params) <= 1e-5, (name, str(report))
    if collective:
        assert report.collectives.get(collective), (name, report.collectives)
