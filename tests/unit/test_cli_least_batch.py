"""`parallelizer plan` searching a pipeline for a model that does not run on one sample (round 10 (e)).

The search traces one sample (`cli.cmd_plan`); a residual stack with BatchNorm1d over (batch, features), trained,
raises "Expected more than 1 value per channel" there, so `plan --mesh pp=4` and `plan` without a mesh
failed with "cannot trace the model ... make forward traceable by torch.export" (a false refusal: the same
plan with --microbatches runs and matches one device). The search now traces the least batch that runs and
chooses only microbatches of at least that many samples.
"""
import torch
import torch.nn.functional as F

from parallelizer import cli
from parallelizer.planner import Plan


class _BNBlock(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.bn = torch.nn.BatchNorm1d(width)

    def forward(self, x):  # (B, width)
        return x + F.relu(self.bn(self.fc(x)))


class BNStack(torch.nn.Module):
    """Linear -> 4 x (Linear, BatchNorm1d, ReLU, residual) -> Linear -> cross-entropy (its own loss)."""

    def __init__(self, width: int = 12, layers: int = 4):
        super().__init__()
        self.inp = torch.nn.Linear(6, width)
        self.blocks = torch.nn.ModuleList(_BNBlock(width) for _ in range(layers))
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h), y)


def bn_stack(batch: int = 8, layers: int = 4):
    """`--model test_cli_least_batch:bn_stack`: (model, (x (batch, 6), y (batch,)))."""
    g = torch.Generator().manual_seed(7)
    return BNStack(layers=layers), (torch.randn(batch, 6, generator=g), torch.arange(batch) % 3)


def _plan(tmp_path, capsys, *mesh):
    out = tmp_path / "plan.json"
    code = cli.main(["plan", "--model", "test_cli_least_batch:bn_stack", *mesh, "--global-batch", "8",
                     "--cluster", "h100:1x4", "--precision", "fp32", "--no-progress", "-o", str(out)])
    return code, capsys.readouterr(), out


def test_pipeline_search_traces_the_least_batch_the_model_runs_on(tmp_path, capsys):
    code, text, out = _plan(tmp_path, capsys, "--mesh", "pp=4")
    assert code == 0, text.err  # before: 2, "cannot trace the model (ValueError) ... Expected more than 1 value"
    assert "does not trace on fewer than 2 samples" in text.out
    plan = Plan.load(out)
    assert plan.pipeline.pp == 4
    assert 8 // plan.pipeline.microbatches >= 2, plan.pipeline.microbatches  # every microbatch runs BatchNorm
    assert plan.model["inputs"]["x"][0] == 8 // plan.pipeline.microbatches  # traced at the step batch


def test_search_without_a_mesh_plans_it_too(tmp_path, capsys):
    code, text, out = _plan(tmp_path, capsys)
    assert code == 0, text.err
    search = Plan.load(out).model["search"]
    assert 8 // (search["mesh"]["shape"][1] * search["microbatches"]) >= 1
    assert 8 // search["microbatches"] >= 2, search
