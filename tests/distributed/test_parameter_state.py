"""Trial r13a: what users attach to the model's parameters before wrapping reaches the ParallelModule's
parameters. Gradient hooks (a row mask that trains only new tokens' embedding rows, a gradient scale, a
post-accumulate hook) and Python attributes that optimizer set-up code reads (mamba_ssm's `_no_weight_decay`)
stayed on the model's own tensors, which the program never uses: every plan trained without them, silently
(embedding gradient |sum| 0.1406 where one device gives 0.0374 on the rows it may train; l1.weight's gradient
norm 0.0882 against 0.0441). Replicated parameters now carry them; a sharded one with a hook is refused."""
import pytest

from parallelizer.runtime.launch import spawn
from launch_once import run_each
from param_state_workers import hooked_pipeline, hooks_and_attributes, unhooked_reference_differs

pytestmark = pytest.mark.distributed

CASES = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"})}


@pytest.fixture(scope="module")
def results():
    calls = [(hooks_and_attributes, case) for case in CASES.values()] + [(unhooked_reference_differs, ()),
                                                                          (hooked_pipeline, ())]
    per_rank = spawn(run_each, 2, calls, timeout_s=300)
    return {name: [ranks[i] for ranks in per_rank] for i, name in enumerate([*CASES, "dropped_flag", "pp"])}


def test_hooks_and_attributes_on_replicated_parameters_train_as_on_one_device(results):
    for r in results["ddp"]:
        assert "error" not in r, r
        assert r["dropped"] > 1e-3, r  # the hooks matter: without them the gradients differ by this much
        assert r["grad"] <= 1e-6, r
        assert r["flag"] is True, r
        assert r["params"] <= 1e-5, r
    assert min(results["dropped_flag"]) > 1e-3  # a dropped flag moves l1.bias by this much in 3 steps


@pytest.mark.parametrize("case", ["fsdp", "tp"])
def test_a_hook_on_a_sharded_parameter_is_refused_on_every_rank(results, case):
    for r in results[case]:
        assert "error" in r, r
        assert "emb.weight" in r["error"] and "l1.weight" in r["error"] and "Remedy" in r["error"], r["error"]


def test_a_hook_in_a_pipeline_model_is_refused_on_every_rank(results):
    for text in results["pp"]:  # each rank builds only its own stage: the hooked block is on rank 1
        assert "blocks.1.fc.weight" in text and "microbatch" in text, text
