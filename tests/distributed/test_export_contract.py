"""Getting the trained model out of a ParallelModule (round 14, trial r14c), on 2 gloo ranks against eager:

- the model's own methods read on the parallel module (`pm.save_pretrained(dir)`, `pm.generate(ids)`, `pm.config`,
  what a script calls after swapping the model for pm) raise `ModelAttributeError` (an AttributeError, so
  `hasattr` stays False) naming the model's class and the remedies (`pm.full_model()`, the full-state recipe,
  `checkpoint.export_full_state_dict`); before, torch's bare "'ParallelModule' object has no attribute ...";
- the export recipe `model.load_state_dict(pm.full_state_dict())` -> `model.save_pretrained` -> `from_pretrained`
  / `generate` gives eager's logits and tokens and is no longer warned about (before: StaleModelWarning that the
  model is stale at save/generate, and that it was changed after wrapping at pm's next forward, both false); the
  model's own `save_pretrained` without the recipe still warns, and so does reading the model after pm trained on;
- a rank's optimizer state loaded into an optimizer over the model on one device (tp / fsdp pieces) is refused with
  `StateDictError` before anything steps (before: torch's "The size of tensor a (16) must match the size of
  tensor b (32)" mid-step); under ddp, whose pieces are whole tensors, it resumes as eager does;
- a pipeline cast after wrapping (`pm.to(torch.bfloat16)`, for a low-precision export) gathers its full state dict
  in the cast dtype (before: the other pp ranks received bf16 bytes into float32 buffers: values 1e17 off,
  silently); running a program traced in other dtypes than pm was cast to is a PlanMismatchError naming the
  tensor and the remedies (before: torch's "mixed dtype (CPU)" on every rank; a pipeline's "[Stage 0] failed to run
  forward"), while a model whose ops all follow their inputs' dtype (token ids in) still runs cast to float64, as eager's.
"""
import pytest

from parallelizer.runtime import spawn
from launch_once import run_each
from export_workers import cast_after_wrapping, export_recipe, model_attributes, one_device_resume

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("export"))
    return spawn(run_each, 2, [(model_attributes, (["tp2"],)), (export_recipe, (["tp2", "fsdp2"], directory)),
                               (one_device_resume, (["tp2", "fsdp2", "ddp2"],)), (cast_after_wrapping, ())],
                 timeout_s=400)


def test_the_models_methods_on_pm_are_typed_errors_with_remedies(ranks):
    for rank in (0, 1):
        r = ranks[rank][0]["tp2"]
        for attr in ("save_pretrained", "generate", "config"):
            kind, message = r[attr]
            assert kind == "ModelAttributeError", (attr, kind, message)
            assert f"ParallelModule.{attr}" in message and "GPT2LMHeadModel" in message, message
        assert "pm.full_model() as m: m.save_pretrained(...)" in r["save_pretrained"][1]
        assert "export_full_state_dict(pm, dir, config=model.config)" in r["save_pretrained"][1]
        assert "model.load_state_dict(pm.full_state_dict())" in r["generate"][1]
        assert "model.config" in r["config"][1]
        assert r["hasattr generate"] is False and r["unknown"] == "AttributeError"


def test_the_full_state_recipe_exports_eagers_model_without_false_warnings(ranks):
    for rank in (0, 1):
        for name in ("tp2", "fsdp2"):
            r = ranks[rank][1][name]
            warned, logits, same_tokens = r["recipe"]
            assert warned == [], (name, warned)
            assert logits < 1e-5, (name, logits)  # after 2 AdamW steps, float32 (eager: 2.4e-7 here)
            assert same_tokens, name
            assert r["next step"] == [], (name, r["next step"])
            stale = r["stale again"]
            assert stale and "state_dict() of the model given to auto_parallelize" in stale[0], (name, stale)


def test_a_ranks_optimizer_pieces_loaded_on_one_device_are_refused(ranks):
    for rank in (0, 1):
        r = ranks[rank][2]
        for name in ("tp2", "fsdp2"):
            kind, message, unchanged = r[name]
            assert kind == "refused", (name, kind, message)
            assert unchanged, name
            assert "one rank's piece" in message and "no parallel module holds" in message, message
            assert "parallelizer.checkpoint.load(pm1, opt1, dir)" in message, message
        kind, worst, _ = r["ddp2"]
        assert kind == "stepped" and worst < 1e-5 + 1e-6, (kind, worst)


def test_a_cast_pipeline_exports_its_values_and_cast_programs_are_typed(ranks):
    for rank in (0, 1):
        r = ranks[rank][3]
        worst, dtypes = r["pipeline full"]
        assert worst == 0.0 and dtypes == ["torch.bfloat16"], r["pipeline full"]  # data movement: bitwise
        for key, what in (("pipeline step", "PipelineModule.step"), ("tp2 forward", "ParallelModule forward")):
            kind, message = r[key]
            assert kind == "PlanMismatchError", (key, kind, message)
            assert message.startswith(f"{what}: ") and "torch.float32 -> torch.bfloat16" in message, message
            assert "cast the model before auto_parallelize" in message and "torch.autocast" in message, message
        assert r["int input double"] < 1e-12, r["int input double"]
