"""`runtime.stage_checks.batch_statistics_nodes`: the nodes whose training forward normalises by statistics over
the batch (BatchNorm in train mode), which a pipeline computes per microbatch (`PipelineModule.step` warns;
tests/distributed/test_pipeline_findings.py runs the step)."""
import torch

import parallelizer
from parallelizer.runtime.stage_checks import batch_statistics_nodes


def _net(norm):
    return torch.nn.Sequential(torch.nn.Linear(6, 8), norm, torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_train_mode_batch_norm_is_found_and_eval_or_other_norms_are_not():
    x = torch.randn(4, 6)
    net = _net(torch.nn.BatchNorm1d(8))
    assert len(batch_statistics_nodes(parallelizer.trace(net, (x,)))) == 1
    assert batch_statistics_nodes(parallelizer.trace(net.eval(), (x,))) == []  # running statistics: per sample
    for norm in (torch.nn.LayerNorm(8), torch.nn.GroupNorm(2, 8)):
        assert batch_statistics_nodes(parallelizer.trace(_net(norm), (x,))) == []
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten())
    assert len(batch_statistics_nodes(parallelizer.trace(conv, (torch.randn(2, 3, 5, 5),)))) == 1
