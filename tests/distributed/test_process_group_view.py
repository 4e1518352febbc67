"""Round 24 (r24e): a model that asks whether a process group exists is traced, checked and rehearsed as on one
device, on ranks too (`tracer.slots.one_process_view`, `runtime.module_copy.reference_copy`).

Before (main at b0cabbb), on 2 gloo ranks:
- the trace hid the group only from `torch.distributed.is_initialized` read as a module attribute: a model asking
  through `from torch.distributed import is_initialized`, `distributed_c10d.is_initialized()` or
  `dist.get_world_size()` failed on every rank with a TraceError blaming the export (`auto_parallelize` under
  torchrun and `rehearse` could not run it; it traces in one process);
- the trace's eager check called FLAVA's global contrastive head under the group (all-gathered logits, labels
  offset by the rank) and warned that the exported program differs from the model (a false alarm);
- `rehearse` ran its single-device references under the group: FLAVA's head gave a false "NUMERICS DIFFER"
  (loss 0.69 apart, ratio 4.5e4) against a right program, and nn.SyncBatchNorm raised "expected input tensor
  to be on GPU" on every rank, for plain and pipeline plans alike.
Expected values: the same models written without asking (`group_view_models.one_device`), on one device.
"""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer.runtime.launch import spawn
from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline
from parallelizer.runtime.rehearsal import rehearse_many
from parallelizer.rewriter.spec import spec_from_plan

import group_view_models as gv

pytestmark = pytest.mark.distributed

ASKING = ["imported", "c10d", "world_size", "flava"]


@pytest.fixture(scope="module")
def traced_on_ranks():
    """One 2-rank launch: every asking model traced on each rank (warnings, exported loss)."""
    return spawn(gv.trace_on_rank, 2, ASKING, timeout_s=300)


@pytest.mark.parametrize("name", ASKING)
def test_a_model_asking_for_a_group_traces_on_ranks_as_on_one_device(traced_on_ranks, name):
    expected = gv.one_device(name)
    for rank, results in enumerate(traced_on_ranks):
        warned, loss = results[name]
        assert loss is not None, (rank, name, warned)
        torch.testing.assert_close(loss, expected, msg=lambda m: f"rank {rank}, {name}: {m}")
        assert not any("differs from the model's eager forward" in w for w in warned), (rank, name, warned)


@pytest.fixture(scope="module")
def rehearsed():
    """One 2-rank launch: ddp plans of FLAVA's head and the SyncBatchNorm blocks, 2 AdamW steps."""
    cases = []
    for name in ("flava", "sync_bn"):
        model, args = gv.build(name)
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(parallelizer.trace(model, args), {"dp": 2}, axis_roles={"dp": "ddp"})
        cases.append((gv.build, {"name": name}, plan))
    return dict(zip(("flava", "sync_bn"), rehearse_many(cases, steps=2, timeout_s=300)))


@pytest.mark.parametrize("name", ["flava", "sync_bn"])
def test_rehearse_compares_a_model_asking_for_a_group_with_one_device(rehearsed, name):
    report = rehearsed[name]
    assert report.matches(), str(report)
    assert report.loss <= 1e-5, str(report)  # a reference under the group: 0.69 (flava) or no report (sync_bn)


def test_a_pipeline_rehearsal_runs_sync_batchnorm_as_on_one_device():
    model, args = gv.build("sync_bn", batch=gv.BATCH // 2)
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(parallelizer.trace(model, args), {"pp": 2}, global_batch=gv.BATCH, microbatches=2,
                                 schedule="1f1b")
    with pytest.warns(parallelizer.MicrobatchWarning):  # BatchNorm per microbatch: accumulation semantics
        report = rehearse_pipeline(gv.build, {"name": "sync_bn"}, spec_from_plan(plan), plan.pipeline, steps=2,
                                   timeout_s=300)
    assert report.matches(), str(report)
