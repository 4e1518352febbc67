"""In-place c10d collectives on tensors laid out otherwise on each rank (`runtime.in_place`, round 25 r25g).

gloo (torch 2.13.0) exchanges the memory of a non-contiguous tensor in `all_reduce` / `broadcast` as if it were
contiguous (pytorch#192920), with no error. Each member of the runtime's calls, on 2 gloo ranks in ONE launch,
against values computed without those collectives:
- the helpers themselves: a column view with gaps, a tensor transposed in memory on one rank only, a
  channels_last sender into contiguous receivers, a complex tensor (exact: sums of integers and moves);
- a pipeline's shared-parameter gradient sum (`pipeline.sum_over_copies`) on zbv, whose split backward keeps
  the transposed layout `torch.autograd.grad` gives an einsum's weight: a weight shared by blocks on both
  pipeline ranks trains as on one device (before: 0.56 off after 2 SGD steps, the second loss 2.6303 for 2.6096);
- `PipelineModule.full_state_dict` after `pm.to(memory_format=torch.channels_last)`: the holder's
  channels_last convolution weights reach the other rank as they are (before: 0.31 off on every rank), and
  `checkpoint.export_full_state_dict` writes them (before: safetensors' ValueError "non contiguous tensor").
"""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer.runtime import spawn
from launch_once import run_each
from in_place_workers import channels_last_state, conv_stack, helpers, shared_lm, shared_pipeline

pytestmark = pytest.mark.distributed


def _pipeline_plan(builder, microbatches: int, schedule: str):
    model, inputs = builder(batch={"shared": 8, "conv": 4}[builder.__name__.split("_")[0]] // microbatches)
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), {"pp": 2}, schedule=schedule,
                                 microbatches=microbatches)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    shared = _pipeline_plan(shared_lm, 4, "zbv")
    conv = _pipeline_plan(conv_stack, 2, "1f1b")
    export = str(tmp_path_factory.mktemp("channels_last_export"))
    calls = [(helpers, ()), (shared_pipeline, (shared,)), (channels_last_state, (conv, export))]
    return spawn(run_each, 2, calls, timeout_s=600)


def test_the_helpers_give_the_values_of_any_layout(results):
    for rank, (cases, _, _) in enumerate(results):
        for name, (got, want) in cases.items():
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m, n=name, r=rank: f"rank {r}, {n}: {m}")


def test_a_weight_shared_across_pipeline_ranks_trains_as_one_device_on_a_split_backward(results):
    for rank, (_, run, _) in enumerate(results):
        for step, (loss, ref_loss) in enumerate(run["losses"]):
            torch.testing.assert_close(loss.float(), ref_loss, msg=lambda m, s=step, r=rank: f"rank {r} step {s}: {m}")
        for fqn, want in run["reference"].items():
            torch.testing.assert_close(run["state"][fqn], want, msg=lambda m, f=fqn, r=rank: f"rank {r}, {f}: {m}")


def test_a_pipelines_full_state_dict_after_channels_last_is_the_models(results):
    for rank, (_, _, run) in enumerate(results):
        assert run["channels_last_held"], (rank, "pm.to(channels_last) left every parameter contiguous")
        loss, ref_loss = run["loss"]
        torch.testing.assert_close(loss.float(), ref_loss)
        for fqn, want in run["reference"].items():
            torch.testing.assert_close(run["state"][fqn], want, msg=lambda m, f=fqn, r=rank: f"rank {r}, {f}: {m}")
    exported = results[0][2]["exported"]  # written by rank 0 (before: safetensors refused the channels_last holder)
    assert isinstance(exported, dict) and exported.keys() == results[0][2]["reference"].keys(), exported
    for fqn, want in results[0][2]["reference"].items():
        torch.testing.assert_close(exported[fqn], want, msg=lambda m, f=fqn: f"exported {f}: {m}")
