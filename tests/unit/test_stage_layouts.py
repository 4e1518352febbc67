"""Per-stage layouts of pipeline plans (issue 13, Build 1; `planner.stage_layouts`): the intra-stage ILP is solved
once per distinct stage (middle stages of the same structure share one solve, the embedding and head stages
get their own), a tied parameter keeps one stored layout on every stage holding it, the JSON stores each
distinct layout once (format 4: the stages' "layout", the blocks' "layouts") and round-trips byte-identical,
format 3 documents still load, and `show` prints which layout each stage uses."""
import contextlib
import io
import json

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.planner import Plan
from parallelizer.planner.plan_codec import dumps

GPT2_4 = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=4, seq_len=16)


@pytest.fixture(scope="module")
def pipeline_plan():
    traced = parallelizer.trace(*zoo.gpt2(device="meta", **GPT2_4))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        plan = parallelizer.plan(traced, {"pp": 2, "tp": 2}, axis_roles={"tp": "tp"}, schedule="interleaved_1f1b",
                                 microbatches=2, global_batch=8, progress=False)
    return traced, plan


def test_distinct_stages_are_solved_once_and_tied_parameters_agree(pipeline_plan):
    traced, plan = pipeline_plan
    # 4 stages of one block: the first has the embedding, the last the head; the two middle ones are alike
    assert [s.layout for s in plan.pipeline.stages] == [0, 1, 1, 2]
    wte = plan.params["transformer.wte.weight"]  # tied with lm_head: used by stage 0 and stage 3
    users = {plan.nodes[e.dst].op for e in plan.edges if e.src in wte.placeholders}
    assert users == {"aten.embedding.default", "aten.linear.default"}
    assert plan.nodes[wte.placeholders[0]].output == wte.stored
    assert len(plan.nodes) == len(traced.nodes) and plan.model["num_nodes"] == len(traced.nodes)


def test_json_stores_each_layout_once_and_round_trips_byte_identical(pipeline_plan):
    _, plan = pipeline_plan
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again.to_json() == text
    assert again.nodes == plan.nodes and again.edges == plan.edges and again.params == plan.params
    assert again.pipeline == plan.pipeline
    d = json.loads(text)
    assert d["format_version"] == 4 and [s["layout"] for s in d["pipeline"]["stages"]] == [0, 1, 1, 2]
    block = d["blocks"][0]
    assert block["exceptions"] == {}  # members differ only by their stage's layout, stored once per layout
    names = plan.model["blocks"][0]["nodes"]
    for layout, rows in block.get("layouts", {}).items():
        member = next(i for i, s in enumerate(plan.pipeline.stages) if s.layout == int(layout))
        for q, row in rows.items():
            assert plan.nodes[names[member][int(q)]].strategy == row[1]


def test_format_3_documents_load_with_every_stage_on_layout_0(pipeline_plan):
    _, plan = pipeline_plan
    d = json.loads(plan.to_json())
    variant = {m: s["layout"] for s in d["pipeline"]["stages"] for m in s["blocks"]}
    d["format_version"] = 3
    for s in d["pipeline"]["stages"]:
        del s["layout"]
    for b in d["blocks"]:  # format 3 wrote a member's rows that differ from positions as exceptions
        for m, member in enumerate(b["members"]):
            for q, row in b.get("layouts", {}).get(str(variant[member]), {}).items():
                b["exceptions"].setdefault(str(m), {})[q] = row
        b.pop("layouts", None)
    old = Plan.from_json(dumps(d))
    assert old.nodes == plan.nodes and old.edges == plan.edges
    assert [s.layout for s in old.pipeline.stages] == [0, 0, 0, 0]


def test_show_prints_each_stages_layout(pipeline_plan):
    _, plan = pipeline_plan
    table = plan.summary()
    assert "layout" in table and "L1 = stage 1" in table and "L2" in table, table


def test_received_values_arrive_in_their_producers_layout_and_their_re_layout_is_priced():
    """A stage's solve takes the values it receives in the layout the sending stage chose (`received`), with a
    gradient sent back: on a tensor-parallel stage (Megatron blocks read the residual stream replicated),
    receiving it batch-sharded costs an all-gather forward and its conjugate backward that receiving it
    replicated does not, and the plan's edges start from the received layout."""
    from parallelizer.planner.stage_layouts import stage_graphs
    from parallelizer.runtime.pipeline import cut_stages

    traced = parallelizer.trace(*zoo.gpt2(device="meta", **GPT2_4))
    cut = cut_stages(traced, 2)
    sg = stage_graphs(traced, cut)[1]
    sent = [n for n in cut.inputs[1] if n not in traced.input_names]
    assert sent, cut.inputs[1]

    def solve(layout):
        with contextlib.redirect_stdout(io.StringIO()):
            return parallelizer.plan(sg, {"tp": 2}, axis_roles={"tp": "tp"}, precision="fp32",
                                     received={n: layout for n in sent})
    sharded, replicated = solve("S(0)"), solve("R")
    for plan, layout in ((sharded, "S(0)"), (replicated, "R")):
        assert {plan.nodes[n].output for n in sent} == {layout}
        assert {e.src_layout for e in plan.edges if e.src in sent} == {layout}
    gathers = [e for e in sharded.edges if e.src in sent and e.steps]
    assert gathers and all(e.requires_grad for e in gathers)  # the gradient goes back through the re-layout
    assert sharded.cost.total_s > replicated.cost.total_s
    with pytest.raises(ValueError, match="received layout"):
        solve("S(5)")
