"""A saved pipeline plan edited by a reviewer (round 10 (e)): another schedule, microbatch count, cut or
placement either loads and runs as written or is refused at load with a PipelineError naming the field.

Before: `Plan.load` took every edit (a microbatch count that makes another global batch ran that batch); 1f1b with fewer microbatches than stages, interleaved_1f1b / zbv on one
stage per rank and an empty stage failed in every rank after the launch (torch's ValueError, our ValueError,
"optimizer got an empty parameter list" and a gloo crash), and an edited `pp_rank` was ignored silently (the
runtime places stages by the schedule). A cut whose blocks were moved without its nodes ran the counts
(`cut_stages`) whatever the names said. Runs of edited plans against one device:
tests/distributed/test_pipeline_findings.py.
"""
import contextlib
import io
import json

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.errors import PipelineError, PlanValidationError
from parallelizer.planner import Plan
from parallelizer.runtime.pipeline import cut_stages, plan_cut

GPT2 = dict(n_layer=4, n_embd=32, n_head=4, vocab_size=64, seq_len=8, device="meta")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(traced microbatch, the JSON dict of a pp=2 1f1b plan with 4 microbatches)."""
    traced = parallelizer.trace(*zoo.gpt2(batch=2, **GPT2))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 2}, schedule="1f1b", microbatches=4)
    return traced, json.loads(plan.to_json())


def _load(tmp_path, d):
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    return Plan.load(path)


def _edited(d, **changes):
    out = json.loads(json.dumps(d))
    for key, value in changes.items():
        out["pipeline"][key] = value
    return out


@pytest.mark.parametrize("changes, named", [
    ({"microbatches": 1}, "1f1b needs microbatches >= pp"),
    ({"schedule": "interleaved_1f1b"}, "interleaved_1f1b runs 2 stage(s) per pp rank"),
    ({"schedule": "zbv", "microbatches": 4}, "stages: 2 listed; zbv on pp=2 runs pp x 2 = 4"),
    ({"schedule": "bitpipe"}, "bitpipe runs 2 stage(s) per pp rank"),
])
def test_a_schedule_or_count_the_stages_cannot_run_is_refused_at_load(saved, tmp_path, changes, named):
    with pytest.raises(PipelineError, match="cannot run as written|schedule") as err:
        _load(tmp_path, _edited(saved[1], **changes))
    assert named in str(err.value), str(err.value)


def test_placement_and_empty_stages_are_refused_at_load(saved, tmp_path):
    d = _edited(saved[1])
    s0, s1 = d["pipeline"]["stages"]
    s0["pp_rank"], s1["pp_rank"] = 1, 0
    with pytest.raises(PipelineError, match="stages/0: pp_rank 1, ranks \\[0, 0\\]; 1f1b places stage 0 on pp rank 0"):
        _load(tmp_path, d)
    d = _edited(saved[1])
    s0, s1 = d["pipeline"]["stages"]
    s0["blocks"], s1["blocks"] = s0["blocks"] + s1["blocks"], []
    with pytest.raises(PipelineError, match="stages/1/blocks: empty"):
        _load(tmp_path, d)


def test_gpipe_loads_as_written_and_another_microbatch_count_is_refused(saved, tmp_path):
    plan = _load(tmp_path, _edited(saved[1], schedule="gpipe"))
    assert (plan.pipeline.schedule, plan.pipeline.microbatches) == ("gpipe", 4)
    # 8 microbatches of the traced 2 samples would be a batch of 16 for a plan priced (memory too) for 8: before,
    # `rehearse` ran 16 samples without a word
    with pytest.raises(PipelineError, match="global batch of 8 in microbatches of 2 per replica .dp=1.; 8 of them"):
        _load(tmp_path, _edited(saved[1], microbatches=8))


def test_a_moved_cut_must_name_its_nodes(saved, tmp_path):
    traced, d = saved
    d = _edited(d)
    s0, s1 = d["pipeline"]["stages"]
    s0["blocks"].append(s1["blocks"].pop(0))  # blocks (3, 1), first / last nodes still those of (2, 2)
    plan = _load(tmp_path, d)
    with pytest.raises(PipelineError, match="stage 0: first_node .*; its blocks give") as err:
        plan_cut(traced, plan.pipeline.stages)
    assert f"stage 0: first_node {s0['first_node']}, last_node {s0['last_node']}" in str(err.value)
    cut = cut_stages(traced, 2, (3, 1))  # the nodes three blocks and one give: written, the edit is accepted
    nodes = [[n for n, k in cut.stage_of.items() if k == j] for j in (0, 1)]
    s0["last_node"], s1["first_node"] = nodes[0][-1], nodes[1][0]
    assert plan_cut(traced, _load(tmp_path, d).pipeline.stages).stage_of == cut.stage_of
    d["pipeline"]["stages"][0]["blocks"] = ["transformer.h.1", "transformer.h.0", "transformer.h.2"]
    with pytest.raises(PipelineError, match="holds the next consecutive run"):
        plan_cut(traced, _load(tmp_path, d).pipeline.stages)


def test_a_stage_layout_edit_names_what_the_layout_is(saved, tmp_path):
    d = _edited(saved[1])
    s0, s1 = d["pipeline"]["stages"]
    assert s0["layout"] != s1["layout"]  # first and last stage: solved apart (embedding / head)
    block = d["blocks"][0]  # as a model whose stages' blocks differ stores them (LongSkip: 4 layouts)
    block.setdefault("layouts", {})[str(s1["layout"])] = {"0": block["positions"][0]}
    s0["layout"] = s1["layout"]  # the reviewer's edit: stage 0 "uses" stage 1's layout
    with pytest.raises(PlanValidationError, match="runs its pipeline stage's `layout`.*re-plan to change them"):
        _load(tmp_path, d)  # before: only "the first member's layout is stored in positions, not in layouts"


def test_loading_with_the_model_checks_a_hand_edited_cut(saved, tmp_path):
    """`Plan.load(path, traced=...)` (README: how to price an edit with estimate_step_time) checks the cut as the
    ranks do. Round 23 new-user trial: a GPT-3-13B pipeline plan with one block moved from stage 1 to stage 0 in
    `blocks` only (or in `first_node` / `last_node` only) loaded with the model, and failed only at the launch."""
    traced, d = saved
    blocks_only = _edited(d)
    s0, s1 = blocks_only["pipeline"]["stages"]
    s0["blocks"].append(s1["blocks"].pop(0))
    nodes_only = _edited(d)
    cut = cut_stages(traced, 2, (3, 1))
    nodes = [[n for n, k in cut.stage_of.items() if k == j] for j in (0, 1)]
    t0, t1 = nodes_only["pipeline"]["stages"]
    t0["last_node"], t1["first_node"] = nodes[0][-1], nodes[1][0]
    for edited in (blocks_only, nodes_only):
        path = tmp_path / "edited.json"
        path.write_text(json.dumps(edited))
        Plan.load(path)  # without the model: nothing to check the nodes against
        with pytest.raises(PipelineError, match="stage 0: first_node .*; its blocks give"):
            Plan.load(path, traced=traced)
    both = _edited(blocks_only)
    both["pipeline"]["stages"][0]["last_node"], both["pipeline"]["stages"][1]["first_node"] = nodes[0][-1], nodes[1][0]
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(both))
    assert [len(s.blocks) for s in Plan.load(path, traced=traced).pipeline.stages] == [3, 1]  # a consistent edit loads


def test_show_says_what_runs_when_the_pipeline_section_and_the_search_record_differ(saved, tmp_path):
    """`show`'s search rows come from the search's record (`model.search`); the pipeline section is what loads
    and runs. Round 23 new-user trial (GPT-3-13B): an edit of `model.search.schedule` showed "chosen ... zbv"
    above stages that ran dualpipev, and an edit of `pipeline.schedule` left the search's choice as the only
    schedule named in the search rows."""
    from parallelizer.planner.plan_text import search_rows
    d = saved[1]
    assert d["model"]["search"]["schedule"] == "1f1b"
    assert "runs" not in dict(search_rows(_load(tmp_path, d)))  # as planned: nothing to say
    runs = dict(search_rows(_load(tmp_path, _edited(d, schedule="gpipe"))))["runs"]
    assert runs.startswith("(pp=2, dp=1), gpipe, 4 microbatch(es): the plan's pipeline section") or \
        ", gpipe, 4 microbatch(es): the plan's pipeline section" in runs, runs
    record = json.loads(json.dumps(d))
    record["model"]["search"]["schedule"] = "zbv"
    rows = dict(search_rows(_load(tmp_path, record)))
    assert ", 1f1b, 4 microbatch(es): the plan's pipeline section" in rows["runs"], rows["runs"]


def test_a_pipeline_mesh_edited_by_hand_is_refused_naming_it(saved, tmp_path):
    """Round 26 (`planner.priced_for`): the full mesh a pipeline plan was searched and priced on is not an edit
    like the schedule, the microbatches or the cut: an axis added loaded with the search's estimate before."""
    d = json.loads(json.dumps(saved[1]))
    assert d["pipeline"]["mesh"] == {"axis_names": ["pp"], "shape": [2]}
    d["pipeline"]["mesh"] = {"axis_names": ["pp", "dp"], "shape": [2, 1]}  # the same 2 devices
    with pytest.raises(PlanValidationError, match="edited after it was priced: pipeline/mesh: now") as err:
        _load(tmp_path, d)
    assert err.value.path == "pipeline/mesh"
    _load(tmp_path, _edited(saved[1], schedule="gpipe"))  # a schedule edit stays allowed
