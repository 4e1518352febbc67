"""Plan JSON: schema validation naming the field, save/load round trip, determinism, fingerprint mismatches,
and the checks on what format 3 derives on load (parallelizer/planner/plan_codec.py)."""
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
    assert set(d) | {"pipeline", "recompute", "compression", "hierarchical"} == set(plan_schema()["properties"])  # when used
    assert "params" not in d["fingerprint"]["summary"]  # derived from "params" on load
    assert plan.fingerprint["summary"]["params"]["wte.weight"] == {"shape": [64, 32], "dtype": "float32"}
    assert d["cluster"]["spec"] == "h100:1x2" and d["blocks"][0]["name"] == "h.*"
    # one entry per block pattern (12 per GPT block), positions stored once, no member differs
    assert d["params"]["h.*.c_fc.weight"] == {"aliases": [], "placeholders": ["p_h_*_c_fc_weight"], "shape": [128, 32],
                                             "dtype": "float32", "stored": plan.params["h.0.c_fc.weight"].stored,
                                             "is_buffer": False}
    assert len(d["blocks"][0]["positions"]) == len(plan.model["blocks"][0]["nodes"][0]) and d["blocks"][0]["exceptions"] == {}


def test_save_load_round_trip_and_determinism(traced, plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path, traced=traced, mesh=MESH)
    assert again.to_json() == plan.to_json() and again.mesh == plan.mesh
    # everything left out of the JSON comes back equal: nodes, params (local shapes), edges with their steps
    assert again.edges == plan.edges and again.nodes == plan.nodes and again.params == plan.params
    assert again.fingerprint == plan.fingerprint and again.model == plan.model
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
        d["graph"][-1][2] = "Q(1) -> None"
    with pytest.raises(PlanValidationError, match=rf"invalid at graph/{len(plan.to_dict()['graph']) - 1}"):
        Plan.load(_corrupt(plan, tmp_path, bad_layout))
    with pytest.raises(PlanValidationError, match=r"'cost' is a required property"):
        Plan.load(_corrupt(plan, tmp_path, lambda d: d.pop("cost")))
    with pytest.raises(PlanValidationError, match=r"format_version 2; this toolkit reads 3 and 4. Remedy: re-plan"):
        Plan.load(_corrupt(plan, tmp_path, lambda d: d.update(format_version=2)))
    with pytest.raises(PlanValidationError, match=r"not valid JSON"):
        Plan.from_json(plan.to_json()[:-5])


def _row(d, name):
    return next(i for i, r in enumerate(d["graph"]) if r[0] == name)


def test_derived_parts_are_checked_on_load(plan, tmp_path):
    """What the JSON leaves out is derived on load; an edit that makes it inconsistent names the field."""
    out = _row(plan.to_dict(), "output")

    def drop_input(d):
        d["graph"][out][2] = "-> None"

    def bad_ref(d):
        d["blocks"][0]["positions"][0][2][0][0] = "@99"

    def partial_input(d):  # a Replicate producer read as Partial: no collective makes R -> P
        row = d["blocks"][0]["positions"][0]
        row[1] = "P" + row[1][row[1].index(" "):]

    def lost_member(d):
        d["graph"] = [r for r in d["graph"] if r != ["h.*", 1]]

    def extra_op(d):
        d["fingerprint"]["summary"]["ops"]["aten.gelu.default"] += 1

    def bad_stored(d):
        d["params"]["wte.weight"]["stored"] = "S(2)"

    def bad_dtype(d):
        d["blocks"][0]["positions"][0][2][0][1] = "float33"

    cases = [(drop_input, rf"invalid at graph/{out}: strategy '-> None' of output has 0 input"),
             (bad_ref, r"invalid at blocks/0/positions/0: ref '@99' resolves to nothing"),
             (partial_input, r"invalid at blocks/0/positions/0: input 0 of layer_norm .*Partial"),
             (lost_member, r"invalid at graph: block members \['h.\*\[1\]'\] have no"),
             (extra_op, r"invalid at fingerprint/summary/ops"),
             (bad_stored, r"invalid at params/wte.weight/stored"),
             (bad_dtype, r"positions/0: input 0 of layer_norm .*'float33' is not a torch dtype")]
    for corrupt, message in cases:
        with pytest.raises(PlanValidationError, match=message):
            Plan.load(_corrupt(plan, tmp_path, corrupt))
