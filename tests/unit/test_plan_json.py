"""Plan JSON: schema validation naming the field, save/load round trip, determinism, fingerprint mismatches."""
import json

import jsonschema
import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.errors import PlanMismatchError, PlanValidationError
from parallelizer.plan_io import plan_schema
from parallelizer.planner import Plan

MESH = {"dp": 2}


def _traced(**config):
    model, inputs = zoo.gpt(n_layer=2, n_embd=32, n_head=2, vocab_size=64, block_size=16, batch=4,
                            device="meta", **config)
    return parallelizer.trace(model, inputs)


@pytest.fixture(scope="module")
def traced():
    return _traced()


@pytest.fixture(scope="module")
def plan(traced):
    return parallelizer.plan(traced, MESH, cluster="h100:1x2")


def test_json_validates_against_the_shipped_schema(plan):
    d = json.loads(plan.to_json())
    jsonschema.Draft202012Validator(plan_schema()).validate(d)
    assert set(d) == set(plan_schema()["properties"])  # schema and to_dict list the same fields
    assert d["fingerprint"]["summary"]["params"]["wte.weight"] == {"shape": [64, 32], "dtype": "float32"}
    assert d["cluster"]["spec"] == "h100:1x2" and d["model"]["blocks"][0]["name"] == "h.*"


def test_save_load_round_trip_and_determinism(traced, plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path, traced=traced, mesh=MESH)
    assert again.to_json() == plan.to_json() and again.mesh == plan.mesh
    assert parallelizer.plan(traced, MESH, cluster="h100:1x2").to_json() == plan.to_json()  # byte-identical
    assert path.read_text() == plan.to_json() + "\n"
    assert "<table>" in again._repr_html_()


def test_plan_for_other_shapes_or_mesh_raises_mismatch(plan):
    other = parallelizer.trace(*zoo.gpt(n_layer=2, n_embd=64, n_head=2, vocab_size=64, block_size=16, batch=4,
                                        device="meta"))
    with pytest.raises(PlanMismatchError) as info:
        parallelizer.check_plan(plan, other, MESH)
    assert "parameter h.0.c_fc.weight: plan has shape (128, 32), model has (256, 64)" in str(info.value)
    parallelizer.check_plan(plan, other, structure_only=True)  # same structure: a narrower config is fine
    with pytest.raises(PlanMismatchError, match=r"mesh: plan \(dp=2\), requested \(dp=2, tp=2\)"):
        parallelizer.check_plan(plan, None, {"dp": 2, "tp": 2})
    deeper = parallelizer.trace(*zoo.gpt(n_layer=3, n_embd=32, n_head=2, vocab_size=64, block_size=16, batch=4,
                                         device="meta"))
    with pytest.raises(PlanMismatchError, match=r"parameter h\.2\.c_fc\.weight: in the model, not in the plan"):
        parallelizer.check_plan(plan, deeper, structure_only=True)


def _corrupt(plan, tmp_path, edit):
    d = json.loads(plan.to_json())
    edit(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    return path


def test_malformed_plan_names_the_field(plan, tmp_path):
    def bad_shape(d):
        d["params"]["wte.weight"]["shape"][0] = "x"
    with pytest.raises(PlanValidationError) as info:
        Plan.load(_corrupt(plan, tmp_path, bad_shape))
    assert info.value.path == "params/wte.weight/shape/0" and "'x' is not of type 'integer'" in str(info.value)

    def bad_layout(d):
        next(iter(d["edges"]))["dst_layout"] = "Q(1)"
    with pytest.raises(PlanValidationError, match=r"invalid at edges/0/dst_layout"):
        Plan.load(_corrupt(plan, tmp_path, bad_layout))
    with pytest.raises(PlanValidationError, match=r"'cost' is a required property"):
        Plan.load(_corrupt(plan, tmp_path, lambda d: d.pop("cost")))
    with pytest.raises(PlanValidationError, match=r"format_version 1; this toolkit reads 2"):
        Plan.load(_corrupt(plan, tmp_path, lambda d: d.update(format_version=1)))
    with pytest.raises(PlanValidationError, match=r"not valid JSON"):
        Plan.from_json(plan.to_json()[:-5])
