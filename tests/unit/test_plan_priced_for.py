"""A plan JSON whose priced-for settings were edited by hand is refused on load, naming the field
(`planner.priced_for`). Before round 26 (trial r25h) a 2x2 plan's mesh edited to (dp=4, tp=1), another
factorisation of the same 4 devices, loaded as a plan on (dp=4, tp=1) that carried the 2x2 solve's step time and
memory; `model.batch` edited 8 -> 7, `config.precision` bf16 -> fp32 or the cluster's device loaded as well and
were what `show` printed, none of them what the cost was computed for."""
import json

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer.errors import PlanValidationError
from parallelizer.planner import Plan


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))).square().mean()


BATCH = {"global_batch": 8, "grad_accum": 1, "seq_len": None, "traced_batch": 8}


@pytest.fixture(scope="module")
def made():
    traced = parallelizer.trace(_MLP(), (torch.randn(8, 16),))
    plan = parallelizer.plan(traced, {"dp": 2, "tp": 2}, cluster="h100:1x4", axis_roles={"dp": "ddp", "tp": "tp"},
                             batch=dict(BATCH))
    return traced, plan


def _write(tmp_path, doc) -> str:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _set(doc, path, value):
    *parents, last = path.split("/")
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value


def test_an_unedited_plan_loads_and_writes_back_the_same_bytes(made, tmp_path):
    traced, plan = made
    doc = json.loads(plan.to_json())
    assert {"mesh", "cluster", "config/precision", "model/batch"} <= set(doc["priced_for"])
    loaded = Plan.load(_write(tmp_path, doc), traced=traced)
    assert loaded.to_json() == plan.to_json()


@pytest.mark.parametrize("path, value", [
    ("mesh/shape", [4, 1]),                       # r25h: another factorisation of the same 4 devices
    ("mesh/axis_names", ["tp", "dp"]),            # the axes swapped: each layout's placements now on the other axis
    ("model/batch/global_batch", 7),              # r25h: the batch record `show` prints
    ("model/batch/traced_batch", 4),
    ("config/precision", "fp32"),
    ("config/memory_budget_bytes", 40_000_000_000),
    ("cluster/device", "a100_sxm"),
    ("cluster/intra_node_link/bandwidth_bytes_per_s", 1e9),
])
def test_a_priced_for_field_edited_by_hand_is_refused_naming_it(made, tmp_path, path, value):
    traced, plan = made
    doc = json.loads(plan.to_json())
    _set(doc, path, value)
    field = "/".join(path.split("/")[:2]) if path.startswith(("config", "model")) else path.split("/")[0]
    for load in (lambda p: Plan.load(p), lambda p: Plan.load(p, traced=traced)):
        with pytest.raises(PlanValidationError, match="edited after it was priced") as err:
            load(_write(tmp_path, doc))
        assert err.value.path == field and f"{field}: now " in str(err.value) and "Remedy: re-plan" in str(err.value)


def test_the_mesh_edit_of_r25h_loaded_with_the_2x2_cost_before(made, tmp_path):
    """What a load of the (dp=4, tp=1) edit gave before: a plan whose mesh is (dp=4, tp=1) and whose cost is the
    2x2 solve's; the plan made for (dp=4, tp=1) costs otherwise (the number the edit misreported)."""
    traced, plan = made
    doc = json.loads(plan.to_json())
    doc["mesh"]["shape"] = [4, 1]
    del doc["priced_for"]  # a document written before round 26: loads as before
    edited = Plan.load(_write(tmp_path, doc))
    assert edited.mesh.shape == (4, 1) and edited.cost.total_s == pytest.approx(plan.cost.total_s, rel=1e-9)
    fresh = parallelizer.plan(traced, {"dp": 4, "tp": 1}, cluster="h100:1x4", axis_roles={"dp": "ddp", "tp": "tp"})
    assert fresh.cost.total_s != pytest.approx(plan.cost.total_s, rel=1e-3)


def test_layout_edits_stay_allowed(made, tmp_path):
    traced, plan = made
    doc = json.loads(plan.to_json())
    row = next(r for r in doc["graph"] if len(r) == 4 and r[1] == "aten.relu.default")
    row[2] = "RR -> RR"  # replicate one op: a rule's strategy; the edges around it change their steps on load
    assert Plan.load(_write(tmp_path, doc), traced=traced).nodes[row[0]].strategy == "RR -> RR"
