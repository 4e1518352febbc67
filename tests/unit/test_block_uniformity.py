"""Repeated blocks of a pipeline plan read like a hand-written config (round 19, r19h): the per-stage solves
(`planner.stage_layouts`) break a tie between equal-cost strategies toward the strategy the block position took
in its first occurrence (DESIGN: ties break toward less memory, then fewer collectives, then the block's first
occurrence), and keep another strategy only where it is faster or leaner (`first_occurrence`)."""
import contextlib
import dataclasses
import io

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.planner.plan import NodePlan
from parallelizer.planner.stage_layouts import first_occurrence

GPT2_4 = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=4, seq_len=16)


def _members_at(plan, position):
    names = plan.model["blocks"][0]["nodes"]
    return [plan.nodes[m[position]].strategy for m in names]


@pytest.fixture(scope="module")
def pipeline_plan():
    traced = parallelizer.trace(*zoo.gpt2(device="meta", **GPT2_4))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, {"pp": 2, "tp": 2}, axis_roles={"tp": "tp"}, schedule="interleaved_1f1b",
                                 microbatches=2, global_batch=8, progress=False)


def test_tied_middle_stage_blocks_take_their_first_occurrences_strategy(pipeline_plan):
    """4 stages of one block each (layouts 0, 1, 1, 2): the middle stages' solve ties with stage 0's strategy at
    every position (on main one reshape took R -> R where stage 0 took S(2) -> S(1) at the same estimated time,
    0.19137 ms either way), so blocks 0-2 agree everywhere. Block 3 feeds the head: keeping block 0's strategies
    there costs 0.87% more (0.2184 vs 0.2203 ms per microbatch), so it may differ."""
    names = pipeline_plan.model["blocks"][0]["nodes"]
    assert [s.layout for s in pipeline_plan.pipeline.stages] == [0, 1, 1, 2]
    differ = [q for q in range(len(names[0])) if len(set(_members_at(pipeline_plan, q)[:3])) > 1]
    assert differ == [], [(q, _members_at(pipeline_plan, q)) for q in differ]


class _Graph:
    """The two facts `first_occurrence` reads of a stage graph: its nodes' block positions and parameters."""

    def __init__(self, positions):
        self.nodes = {n: _Info(pos) for n, pos in positions.items()}

    def param_of_placeholder(self, name):
        return None


@dataclasses.dataclass
class _Info:
    position: int | None
    block_group: str | None = "h.*"
    op: str = "call_function"


@dataclasses.dataclass
class _Plan:
    nodes: dict
    objective_s: float
    memory: int

    @property
    def solver(self):
        return dataclasses.make_dataclass("S", ["objective_s"])(self.objective_s)

    @property
    def cost(self):
        return dataclasses.make_dataclass("C", ["memory_bytes"])({"total": self.memory})


def _plan(strategy: str, objective_s: float, memory: int) -> _Plan:
    return _Plan({"a": NodePlan.from_strategy("aten.view", strategy)}, objective_s, memory)


@pytest.mark.parametrize("tied_s, tied_mem, keeps_first", [
    (1e-3, 100, True),                  # equal time and memory: the first occurrence's strategy
    (1e-3 + 5e-9, 100, True),           # within TIE_RESOLUTION_US (1e-2 us = 1e-8 s): a tie
    (1e-3 + 2e-8, 100, False),          # slower by 20 ns: the free solve is faster
    (1e-3, 100 + 2_000_000, False),     # 2 MB more (> MEMORY_TIE_QUANTUM_BYTES = 1 MB): less memory first
])
def test_first_occurrence_keeps_the_fixed_solve_only_on_a_tie(tied_s, tied_mem, keeps_first):
    graph = _Graph({"a": 7})
    free = _plan("R -> R", 1e-3, 100)
    tied = _plan("S(2) -> S(1)", tied_s, tied_mem)
    asked = []
    got = first_occurrence(graph, free, {("h.*", 7): "S(2) -> S(1)"}, lambda fixed: asked.append(fixed) or tied)
    assert asked == [{"a": "S(2) -> S(1)"}]
    assert (got is tied) == keeps_first


def test_first_occurrence_does_not_solve_again_when_blocks_agree():
    graph = _Graph({"a": 7})
    free = _plan("S(2) -> S(1)", 1e-3, 100)
    got = first_occurrence(graph, free, {("h.*", 7): "S(2) -> S(1)"}, lambda fixed: pytest.fail("solved again"))
    assert got is free
