"""`runtime.mirror`: a ParallelModule's submodules are instances of the model's module classes, so code that
finds modules by type after wrapping acts as on the model, and a setting changed after build selects a
program traced with it (one process, mesh of one device; the 2-rank checks are in test_contract.py).
Before, the loops below matched nothing and did nothing, silently."""
import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer.errors import PipelineError, TraceError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from contract_workers import ConvBN, DropoutMLP  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    """auto_parallelize outside a launcher creates a one-process gloo group; do not leak it to other tests."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _both(model_cls, x):
    torch.manual_seed(0)
    model = model_cls()
    reference = copy.deepcopy(model)
    return parallelizer.auto_parallelize(model, (x,), cluster="h100:1x1"), reference


def _stats(pm, reference) -> float:
    sd = pm.full_state_dict()
    return max((sd[k] - v).abs().max().item() for k, v in reference.state_dict().items() if "running" in k)


def test_submodules_are_instances_of_the_models_classes_and_refuse_to_run():
    x = torch.randn(8, 3, 8, 8)
    pm, _ = _both(ConvBN, x)
    assert [type(m).__name__ for m in pm.children()] == ["Conv2d", "BatchNorm2d", "Linear"]
    assert isinstance(pm.bn, nn.BatchNorm2d) and pm.bn.momentum == 0.1
    assert "BatchNorm2d(8, eps=1e-05, momentum=0.1" in repr(pm)
    with pytest.raises(TraceError, match="call of the submodule Conv2d"):
        pm.conv(x)  # it would run on this rank's shards


def test_batchnorm_frozen_by_type_after_wrapping_matches_eager():
    """Detection fine-tuning's loop: train(), then every BatchNorm to eval (running statistics frozen)."""
    x = torch.randn(8, 3, 8, 8)
    pm, reference = _both(ConvBN, x)
    for m in (pm, reference):
        m.train()
        for module in m.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.eval()
    torch.testing.assert_close(pm(x), reference(x))
    assert _stats(pm, reference) == 0.0  # untouched: eval BatchNorm writes no statistics (pure data movement)


def test_a_setting_changed_after_wrapping_is_traced_with_it():
    """A Dropout's p lowered to 0 by type (a dropout schedule's end): the program is traced again with p=0,
    so the outputs are deterministic and equal eager's; the change is named in the warning."""
    x = torch.randn(8, 16)
    pm, reference = _both(DropoutMLP, x)
    for m in (pm, reference):
        for module in m.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
    with pytest.warns(UserWarning, match=r"settings changed: drop\.p=0\.0"):
        out = pm(x)
    torch.testing.assert_close(out, reference(x))


def test_update_bn_is_refused_by_name_and_the_recipe_matches_it():
    """torch.optim.swa_utils.update_bn sets momentum=None (a cumulative average that reads a buffer in Python):
    a TraceError naming the change and the recipe; the recipe (momentum 1/k for the k-th batch) equals
    update_bn on the eager model."""
    x = torch.randn(8, 3, 8, 8)
    loader = [x, 2 * x + 1]
    pm, reference = _both(ConvBN, x)
    with pytest.raises(TraceError, match=r"(?s)bn\.momentum=None.*momentum = 1 / k"):
        torch.optim.swa_utils.update_bn(loader, pm)
    torch.optim.swa_utils.update_bn(loader, reference)
    bns = [m for m in pm.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in bns:
        m.momentum = 0.1  # update_bn's restore never ran
        m.reset_running_stats()
    with torch.no_grad():
        for k, batch in enumerate(loader, 1):
            for m in bns:
                m.momentum = 1.0 / k
            pm(batch)
    torch.testing.assert_close(pm.full_state_dict()["bn.running_mean"], reference.bn.running_mean)
    torch.testing.assert_close(pm.full_state_dict()["bn.running_var"], reference.bn.running_var)


def test_a_pipeline_refuses_stage_changes_it_cannot_trace():
    from parallelizer.runtime.pipeline_module import PipelineModule

    x = torch.randn(8, 16)
    stage, _ = _both(DropoutMLP, x)
    pipe = PipelineModule.__new__(PipelineModule)
    pipe.__dict__["run"] = type("Run", (), {"stages": [stage]})()
    pipe._check_modes()  # unchanged: fine
    stage.drop.p = 0.0
    with pytest.raises(PipelineError, match=r"settings changed: drop\.p=0\.0"):
        pipe._check_modes()
    stage.drop.p = 0.5
    stage.drop.eval()
    with pytest.raises(PipelineError, match="submodules switched train/eval: drop"):
        pipe._check_modes()
