"""The memory-lean intra-stage layout (`ilp.solve_lean`; round 14, r14d) runs and matches one device: transformers
GPT-2 (fp32, dropout 0) with its layer norms, residual adds and the tensors between the tp matmuls sharded
(sequence-parallel-like), on tp=2 (2 gloo ranks: loss, every gradient, parameters after 3 AdamW steps, by
`rehearse_many`) and as the stage the pipeline search gave the lean layout under a budget that binds, on
pp=2 x tp=2 (4 gloo ranks, 1F1B, 2 microbatches; loss, gradients, parameters after 3 steps and gradients
accumulated over two `step` calls), within 1e-5."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.planner.api import plan as solve_plan
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from parallelizer.runtime.rehearsal import rehearse_many
from pipeline_workers import run_pipeline

pytestmark = pytest.mark.distributed

GPT2_TP = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, batch=4, seq_len=64, dropout=0.0)
GPT2_PP = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=8, seq_len=64, dropout=0.0)
MICROBATCHES = 2


def test_lean_layout_on_tp2_matches_single_device():
    traced = parallelizer.trace(*zoo.gpt2(**GPT2_TP))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        lean = solve_plan(traced, {"tp": 2}, cluster="h100:1x2", axis_roles={"tp": "tp"}, precision="fp32", lean=True)
        fast = solve_plan(traced, {"tp": 2}, cluster="h100:1x2", axis_roles={"tp": "tp"}, precision="fp32")
    # 2.17 vs 2.47 MB (0.88; 0.8 before round 15, whose once-per-key pricing of shared gathers made the time layout leaner)
    assert lean.cost.memory_bytes["activations"] < fast.cost.memory_bytes["activations"]
    norms = {n.inputs[0] for n in lean.nodes.values() if n.op == "aten.layer_norm.default"}
    assert "R" not in norms, norms  # sharded between the matmuls, not replicated
    (report,) = rehearse_many([(zoo.gpt2, GPT2_TP, lean)])
    assert report.tolerance_ratio <= 1.0 and max(report.loss, report.grad, report.params) <= 1e-5, report


def test_lean_stage_of_a_pipeline_plan_matches_single_device():
    traced = parallelizer.trace(*zoo.gpt2(device="meta", **{**GPT2_PP, "batch": GPT2_PP["batch"] // MICROBATCHES}))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 2, "tp": 2}, axis_roles={"tp": "tp"}, schedule="1f1b",
                                 microbatches=MICROBATCHES, global_batch=GPT2_PP["batch"], progress=False,
                                 recompute="none", precision="fp32", memory_budget_bytes=5_600_000,
                                 memory_reserve_bytes=0, cluster="h100:1x4")
    assert plan.model["search"]["lean_stages"] == [0] and plan.pipeline.blocks_per_stage == (2, 2)
    reports = spawn(run_pipeline, 4, GPT2_PP, spec_from_plan(plan), 2, 2, "1f1b", MICROBATCHES, timeout_s=300)
    for rank, r in enumerate(reports):
        assert r["loss"] <= 1e-5 and r["grad"] <= 1e-5 and r["params"] <= 1e-5, (rank, r)
        assert r["accumulated"] <= 1e-5, (rank, r["accumulated"])


def test_lean_layouts_hold_what_is_priced():
    """What the lean programs hold (saved tensors, parameters, gradients, AdamW state; `benchmarks.bench_memory`'s
    method) is what the plan prices: a vocab-parallel cross-entropy's saved tensors (since round 22 the local softmax
    and two row vectors, `rewriter.vocab_parallel`; round 14: its shifted logits and row sums besides the exp, 6.6%
    under-priced before), and a local slice saved for backward keeps a
    storage of its own (it kept its whole replicated source alive: 1.1% under on the lean pipeline stage)."""
    from benchmarks._memory_workers import measure_pipeline_rank, measure_rank
    from benchmarks.bench_memory import CATEGORIES, MODELS, PIPELINE_MODELS
    from parallelizer.pipeline_memory import pipeline_rank_memory

    fn, kwargs = MODELS["gpt2"]  # 2 layers, labels inside: logits and loss in the graph
    traced = parallelizer.trace(*fn(**kwargs))
    with contextlib.redirect_stdout(io.StringIO()):
        lean = solve_plan(traced, {"tp": 2}, cluster="h100:1x2", axis_roles={"tp": "tp"}, precision="fp32", lean=True)
    held = spawn(measure_rank, 2, [(fn, kwargs, spec_from_plan(lean))], timeout_s=300)
    priced = sum(int(lean.cost.memory_bytes.get(k, 0)) for k in CATEGORIES)
    for (rank,) in held:
        assert abs(priced - sum(rank.values())) <= 1e-3 * sum(rank.values()), (priced, rank)
    fn, kwargs, _ = PIPELINE_MODELS["gpt2 (4 layers)"]
    traced = parallelizer.trace(*fn(batch=2, **kwargs))
    with contextlib.redirect_stdout(io.StringIO()):
        free = parallelizer.plan(traced, {"pp": 2, "tp": 2}, axis_roles={"tp": "tp"}, precision="fp32", schedule="1f1b",
                                 microbatches=4, recompute="none")
        budget = int(0.95 * max(m["total"] for m in free.pipeline.estimate.rank_memory_bytes))  # lean: 0.92
        plan = parallelizer.plan(traced, {"pp": 2, "tp": 2}, axis_roles={"tp": "tp"}, precision="fp32", schedule="1f1b",
                                 microbatches=4, recompute="none", memory_budget_bytes=budget, memory_reserve_bytes=0)
    assert plan.model["search"]["lean_stages"] == [0]
    predicted = pipeline_rank_memory(plan, traced)
    held = spawn(measure_pipeline_rank, 4, [(fn, dict(kwargs, batch=8), spec_from_plan(plan), plan.pipeline.to_dict())],
                 timeout_s=300)
    for g, (rank,) in enumerate(held):
        p = sum(predicted[g // 2][k] for k in CATEGORIES)
        assert abs(p - sum(rank.values())) <= 1e-3 * sum(rank.values()), (g, p, rank)
