"""A hand-edited plan file whose layouts the planner could not have chosen is refused when the plan meets its
model (`fingerprint.check_plan` -> `planner.strategies.unplannable_strategies`), naming the node and the
layouts it may take. Before (r13d), `Plan.load(path, traced=...)`, `auto_parallelize(plan=...)` and
`parallelizer rehearse` accepted them: a 3x3 conv sharded along a spatial dim ran without its neighbours' rows
(`rehearse` on 2 gloo ranks: gradients 6.1e-2 off one device), a loss mean declared Replicate gave each rank
its own half-batch mean (loss 1.27 off), a BatchNorm running buffer stored sharded was written on half its
rows (4.6e-2 off); only a rehearsal could show it."""
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.errors import PlanValidationError
from parallelizer.planner import Plan


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.head = nn.Conv2d(8, 16, 3, padding=1), nn.Linear(16, 10)

    def forward(self, x, y):
        x = F.relu(self.b1(self.c1(x)))
        return F.cross_entropy(self.head(F.relu(self.c2(x)).mean((2, 3))), y)


@pytest.fixture(scope="module")
def made():
    traced = parallelizer.trace(_CNN(), (torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))))
    return traced, parallelizer.plan(traced, {"dp": 2}, cluster="h100:1x2", axis_roles={"dp": "ddp"})


def _edited(plan, tmp_path, node=None, strategy=None, param=None, stored=None):
    d = json.loads(plan.to_json())
    for row in d["graph"]:
        if row[0] == node:
            row[2] = strategy
    if param is not None:
        d["params"][param]["stored"] = stored
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    return path


def test_planner_made_plan_and_a_plannable_edit_load(made, tmp_path):
    traced, plan = made
    Plan.load(_edited(plan, tmp_path), traced=traced)
    Plan.load(_edited(plan, tmp_path, "cross_entropy_loss", "R R -> R"), traced=traced)  # a rule's strategy


@pytest.mark.parametrize("edit, named", [
    (dict(node="conv2d_1", strategy="S(2) R R -> S(2)"), "conv2d_1 (aten.conv2d.default, op): 'S(2) R R -> S(2)'"),
    (dict(node="cross_entropy_loss", strategy="S(0) S(0) -> R"), "cross_entropy_loss (aten.cross_entropy_loss"),
    (dict(param="b1.running_mean", stored="S(0)"), "b_b1_running_mean (placeholder, buffer b1.running_mean): '-> S(0)'"),
    (dict(param="head.weight", stored="S(0)"), "p_head_weight (placeholder, param head.weight): '-> S(0)'"),
])
def test_unplannable_edit_is_refused_naming_the_node(made, tmp_path, edit, named):
    traced, plan = made
    path = _edited(plan, tmp_path, **edit)
    Plan.load(path)  # the JSON alone is consistent: only the model shows what no rule allows
    with pytest.raises(PlanValidationError, match="could not have chosen") as info:
        Plan.load(path, traced=traced)
    assert named in str(info.value) and "it offers" in str(info.value) and "Remedy" in str(info.value)


def test_a_refused_edit_is_offered_the_strategies_nearest_to_it_first(made, tmp_path):
    """Round 23 new-user trial: an mm of a GPT-3-13B plan edited to 'S(0)R RS(1) -> S(0)R' was offered six
    Partial-input strategies ('PP RR -> PP', ...: sorted by text) before its one-layout fix."""
    traced, plan = made
    with pytest.raises(PlanValidationError) as err:
        Plan.load(_edited(plan, tmp_path, "conv2d_1", "S(0) R R -> R"), traced=traced)  # planned: -> S(0)
    offered = str(err.value).split("(it offers ", 1)[1]
    assert offered.startswith("'S(0) R R -> S(0)'"), offered[:200]


@pytest.mark.parametrize("field, value", [(2, [9, 16]), (1, "float16")])
def test_an_edge_edited_to_another_shape_or_dtype_is_refused_naming_it(made, tmp_path, field, value):
    # round 25 new-user trial: a Qwen2 plan's edge (8, 16, 64) edited to (9, 16, 64), or float32 to float16, loaded
    # with its model; the program is the traced graph's, but `show`'s step bytes were the edit's
    traced, plan = made
    d = json.loads(plan.to_json())
    row = next(r for r in d["graph"] if r[0] == "linear_default")  # the head: input 0, the pooled (8, 16) float32 features
    assert row[3][0][1:3] == ["float32", [8, 16]]
    src = row[3][0][0]
    row[3][0][field] = value
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    Plan.load(path)  # the JSON alone is consistent
    with pytest.raises(PlanValidationError, match=f"edge {src} -> linear_default \\(input 0\\)") as info:
        Plan.load(path, traced=traced)
    assert "the model carries (8, 16) float32" in str(info.value) and "Remedy" in str(info.value)
