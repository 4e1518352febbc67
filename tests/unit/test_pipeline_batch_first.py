"""A pipeline cuts every input into microbatches along dim 0 (`runtime.microbatches`); an input declared with its
batch in another dim (`batch_dims`, a sequence-first (S, B, D) activation) was planned on a "pp" mesh anyway and
microbatched along the sequence, another function, silently (round 13: r13a's left item "pipelines always cut dim
0"). A fixed mesh with "pp" now refuses it; the search leaves pp out."""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer.errors import PipelineError


class SeqFirst(torch.nn.Module):
    """(S, B, 8) -> centred over the sequence -> two residual Linear blocks -> head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        x = x - x.mean(0, keepdim=True)
        for block in self.blocks:
            x = x + torch.relu(block(x))
        return self.head(x)


def _plan(mesh, **options):
    torch.manual_seed(0)
    traced = parallelizer.trace(SeqFirst(), (torch.randn(6, 4, 8),))
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(traced, mesh, **options)


def test_a_pipeline_of_an_input_whose_batch_is_not_dim_0_is_refused_and_the_search_leaves_pp_out():
    with pytest.raises(PipelineError, match=r"'x' has its batch in dim 1 \(batch_dims\).*Remedy: pass those inputs "
                                            r"batch-first"):
        _plan({"pp": 2}, batch_dims={"x": 1}, microbatches=2)
    searched = _plan(None, cluster="h100:1x4", batch_dims={"x": 1})
    assert "pp" not in searched.mesh.axis_names and searched.pipeline is None
    assert _plan({"pp": 2}, microbatches=2).pipeline is not None  # batch-first inputs pipeline as before
