"""One training-step API for every plan (issue 13, item 3): `auto_parallelize` + `pm.step` + AdamW, the same
user loop, on a 4-block GPT-2 with tied embeddings and padded labels (-100), on 4 gloo ranks: pp=2 x dp=2 (a
saved plan, applied) and pp=2 x tp=2 (planned by rank 0) pipeline plans (torch.distributed.pipelining) and a
dp=2 x tp=2 non-pipeline plan. Loss (every
step, every rank), gradients (every step) and parameters after 3 steps match the single-device model within
1e-5 (fp32); the pipeline loss is token-weighted over microbatches (a plain mean of the microbatch means
would be off by far more than the tolerance); and the typed errors of a pipeline module."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.runtime import spawn
from step_workers import GPT2_4, train

pytestmark = pytest.mark.distributed

CASES = {  # name: (mesh, plan options); the roles make every axis carry real parallelism on this tiny model
    "pp2_tp2": ({"pp": 2, "tp": 2}, {"axis_roles": {"tp": "tp"}}),
    "dp2_tp2": ({"dp": 2, "tp": 2}, {"axis_roles": {"dp": "ddp", "tp": "tp"}}),
}


def _saved_pipeline_plan() -> str:
    """A pp=2 x dp=2 plan made here on one microbatch (4 of the 8 samples) and saved as JSON: the ranks apply
    it (`auto_parallelize(..., plan=)`) without re-planning, its full mesh as the default mesh."""
    traced = parallelizer.trace(*zoo.gpt2(**{**GPT2_4, "batch": GPT2_4["batch"] // 2}))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, {"pp": 2, "dp": 2}, axis_roles={"dp": "ddp"}, microbatches=2).to_json()


def test_step_trains_pipeline_and_non_pipeline_plans_like_one_device():
    cases = {"pp2_dp2": (None, {"plan_json": _saved_pipeline_plan()}), **CASES}
    reports = spawn(train, 4, cases, timeout_s=400)
    for rank, report in enumerate(reports):
        errors = report.pop("errors")
        for name, r in report.items():
            assert r["loss"] <= 1e-5 and r["grad"] <= 1e-5 and r["params"] <= 1e-5, (rank, name, r)
            assert r["kind"] == ("ParallelModule" if name == "dp2_tp2" else "PipelineModule"), (rank, name)
            if name != "pp2_dp2":
                assert "all_gather" in r["collectives"] or "all_reduce" in r["collectives"], (rank, name, r)
            if "dp2" in name:
                assert "grad_all_reduce" in r["collectives"], (rank, name, r)
        for name in ("pp2_dp2", "pp2_tp2"):
            assert report[name]["mean_of_means_off_by"] > 100 * 1e-5, report[name]  # token weighting matters
        assert "(6, 16) does not split into 2 microbatches of 4" in errors["uneven_batch"]
        assert "loss_fn=None, but the model's first output has shape (4, 16, 128)" in errors["no_loss"]
        assert "pm.step(" in errors["forward"]
        assert "cannot switch" in errors["eval"]
        assert "does not split into 2 microbatches" in errors["example_batch"]
        assert "the plan was made for mesh (pp=2" in errors["other_mesh"]
