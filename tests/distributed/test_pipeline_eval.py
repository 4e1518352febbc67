"""A PipelineModule keeps nn.Module's contract where a training loop needs it (round 22, r22c; DESIGN.md rule 10),
on 4 gloo ranks, pp=2 x dp=2 and pp=4:

1. evaluation during training (round 21 trial g, finding 1: `pm.eval()` raised, and neither remedy it named served a
   training run): `pm.eval()`, `pm(val_ids, labels=...)` under no_grad, `pm.train()`, then training continues.
   The eval loss (the model's own, padded labels over 3 or 6 microbatches) and logits equal the eager model's
   `model.eval()` under no_grad at torch.testing's defaults, on every rank; no `.grad` or optimizer state is
   touched; the parameters after 3 more AdamW steps equal eager's; on 1f1b, pp=4, BitPipe and zbv (whose V puts
   two consecutive stages on one rank). A dropout + BatchNorm model evaluates with dropout off and the running
   statistics the training programs left.
2. the model root's settings set on the PipelineModule (round 21 r21b, left (e): `pm.temperature = t` was ignored
   silently): float, int and bool settings and a submodule's float are refused by `step` and the evaluation with
   a PipelineError naming them; a root tensor attribute that is not a buffer (`pm.mask = t`) is replaced on the
   stages and the step's loss equals eager's with the same mask; `pm.blocks` names `pm.stages[i].blocks`.
3. hooks on the PipelineModule (a ParallelModule's step runs them): `step` skipped them silently until
   round 22; now a PipelineError; the evaluation forward runs the forward ones."""
import pytest

from launch_once import run_each
from parallelizer.runtime import spawn
from pipeline_eval_workers import bn_dropout_eval, eval_between_steps, root_settings

pytestmark = pytest.mark.distributed

EVAL_CASES = [({"pp": 2, "dp": 2}, {"schedule": "1f1b"}), ({"pp": 4}, {}), ({"pp": 2, "dp": 2}, {"schedule": "bitpipe"}),
              ({"pp": 2, "dp": 2}, {"schedule": "zbv", "microbatches": 4})]


@pytest.fixture(scope="module")
def reports():
    """ONE launch of 4 ranks: [per rank: the EVAL_CASES reports, the BNDropout reports (pp=4, pp=2 x dp=2), the
    root settings report]."""
    calls = [(eval_between_steps, case) for case in EVAL_CASES]
    calls += [(bn_dropout_eval, ({"pp": 4},)), (bn_dropout_eval, ({"pp": 2, "dp": 2},)),
              (root_settings, ({"pp": 2, "dp": 2},))]
    return spawn(run_each, 4, calls, timeout_s=1500)


@pytest.mark.parametrize("case", range(len(EVAL_CASES)))
def test_a_pipeline_evaluates_between_training_steps_like_one_device(reports, case):
    for rank, rep in enumerate(reports):
        r = rep[case]
        assert r["type"] == "PipelineModule" and r["eval_flags"] == [False], (rank, r)
        assert r["schedule"] == EVAL_CASES[case][1].get("schedule", r["schedule"]), (rank, r)
        assert r["loss"] == "" and r["logits"] == "" and r["logits_shape"] == (12, 16, 128), (rank, r)
        assert r["mean_of_means_off_by"] > 1e-4, r  # the item weighting matters on this batch
        assert not r["touched"], (rank, r)
        assert "PipelineModule.step in eval mode" in r["step_in_eval"] and "pm.train()" in r["step_in_eval"], r
        assert r["params"] == [], (rank, r)


@pytest.mark.parametrize("case", [0, 1])
def test_evaluation_turns_dropout_off_and_reads_the_running_statistics(reports, case):
    for rank, rep in enumerate(reports):
        r = rep[len(EVAL_CASES) + case]
        assert r["before"] == "" and r["after"] == "", (rank, r)
        assert r["moved"] > 1e-3, r  # the training step moved the running statistics the eval reads
        assert r["stats"] == [] and r["after_requires_grad"] is False, (rank, r)


def test_root_settings_set_on_a_pipeline_module_are_refused_or_applied_never_ignored(reports):
    for rank, rep in enumerate(reports):
        r = rep[len(EVAL_CASES) + 2]
        assert r["read"] == (1.0, 0, False), r
        for name, value, old in (("temperature", "0.5", "1.0"), ("shift", "2", "0"), ("center", "True", "False")):
            for where in ("step", "eval"):
                assert f"<root>.{name}={value}" in r[name][where] and f"was {name}={old}" in r[name][where], r[name]
                assert "Remedy" in r[name][where], r[name]
        assert r["mask"] == {"step": "no error", "eval": "no error", "loss": ""}, (rank, r["mask"])
        assert r["mask_read"] == "", r
        assert "pm.stages[i].blocks" in r["submodule_attr"], r
        for where in ("step", "eval"):
            assert "blocks.1.scale=2.0" in r["blocks.1.scale"][where], r["blocks.1.scale"]
        assert "forward pre-hook, forward hook, backward hook(s) registered on the PipelineModule would not run" \
            in r["hooks_step"] and "Remedy" in r["hooks_step"], r["hooks_step"]
        assert r["hooks_fired"] == ["pre", "forward"], r  # the evaluation forward runs them (no backward there)
        assert r["after"] == "", r
