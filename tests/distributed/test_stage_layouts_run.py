"""A pipeline plan whose stages use different intra-stage layouts runs and matches one device (issue 13, Build 1;
`planner.stage_layouts`): transformers GPT-2 with 4 layers and a tied embedding / lm_head on pp=2 x tp=2
(4 gloo ranks, 1F1B, 2 microbatches), stage 0 solved as Megatron tensor parallelism over "tp" and stage 1
forced to shard the batch and the parameters over the same axis (FSDP); the activations crossing the cut
are re-laid out by the receiving stage. Loss and every gradient after one step, parameters after 3 AdamW
steps, and gradients accumulated over two `step` calls match the single-device model within 1e-5."""
import contextlib
import io

import pytest

from parallelizer import zoo
from parallelizer.config import PlanConfig
from parallelizer.core.mesh import MeshSpec
from parallelizer.planner.api import resolve_cluster
from parallelizer.planner.stage_layouts import plan_stages
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from parallelizer.runtime.pipeline import cut_stages
from parallelizer.tracer import trace
from pipeline_workers import run_pipeline

pytestmark = pytest.mark.distributed

GPT2_4 = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=8, seq_len=16)
MICROBATCHES = 2


def test_stages_with_different_layouts_match_single_device():
    traced = trace(*zoo.gpt2(device="meta", **{**GPT2_4, "batch": GPT2_4["batch"] // MICROBATCHES}))
    cut = cut_stages(traced, 2)
    free = dict(memory_budget_bytes=10 ** 18, memory_reserve_bytes=0)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        plan, layouts = plan_stages(traced, cut, MeshSpec(("tp",), (2,)), resolve_cluster("h100:1x2", 2)[0],
                                    PlanConfig(axis_roles={"tp": "tp"}, **free),
                                    {1: PlanConfig(axis_roles={"tp": "fsdp"}, **free)})
    assert layouts == (0, 1)
    group = traced.blocks[0]
    first, second = group.nodes[0], group.nodes[-1]  # transformer.h.0 (stage 0) and h.3 (stage 1)
    differ = [q for q, (a, b) in enumerate(zip(first, second)) if plan.nodes[a] != plan.nodes[b]]
    assert len(differ) > len(first) // 4, differ  # not one layout: most positions differ
    # h.0 (tp role) uses its stored c_fc shard in place; h.3 (fsdp role) gathers its shard for use (both are stored
    # S(1) since round 15's pricing; before, their stored layouts differed too)
    steps = {i: [s.kind for e in plan.edges if e.src in traced.parameters[f"transformer.h.{i}.mlp.c_fc.weight"].placeholders
                 for s in e.steps] for i in (0, 3)}
    assert "all_gather" not in steps[0] and "all_gather" in steps[3], steps
    crossing = [e for e in plan.edges if cut.stage_of.get(e.src, 0) == 0 and cut.stage_of.get(e.dst) == 1 and e.steps]
    assert crossing, "no activation is re-laid out at the cut"
    reports = spawn(run_pipeline, 4, GPT2_4, spec_from_plan(plan), 2, 2, "1f1b", MICROBATCHES, timeout_s=300)
    for rank, r in enumerate(reports):
        assert r["loss"] <= 1e-5 and r["grad"] <= 1e-5 and r["params"] <= 1e-5, (rank, r)
        assert r["accumulated"] <= 1e-5, (rank, r["accumulated"])
