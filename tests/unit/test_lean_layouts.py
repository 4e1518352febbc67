"""Memory-lean intra-stage layouts (`ilp.solve_lean`, chosen per pipeline stage by `planner.search` where memory
binds; round 14, r14d).

- Closed forms: the lean layout of a GPT-2 layer (eager attention, GELU, dropout 0.1 everywhere, bf16 (an fp32 trace
  planned "bf16", priced with every activation bf16 as Megatron's recipe runs it (round 25: the plan itself prices
  autocast's dtypes); a bf16-traced model's row-parallel products run widened to fp32 and
  save fp32 inputs since round 24, r24b, which Megatron's layout does not), s 2048,
  b 1, h 4096, a 32, as `benchmarks/published/activation_memory.py`) saves exactly the tensor + sequence parallel
  rows of Korthikanti et al. 2022, Table 2, per layer on tp = t: s b h (34 + 5 a s / h) / t without
  recomputation, 34 s b h / t with selective recomputation, 2 s b h / t with full; plus the two layer norms'
  fp32 mean / rstd (16 s b bytes, which Table 2 leaves out), sharded with them: 16 s b / t (none, selective).
  The time-optimal layout keeps part of the block replicated at t = 8 (selective: 7.75 s b h since round 15's
  once-per-key pricing of shared gathers, 11.25 before).
- The partition DP takes a mode's own state and end parts (`ChainCosts.mode_block_state_bytes`, `mode_ends`).
- The pipeline search gives the lean layout to the stage that needs it under a budget that binds (and to none
  when it does not), and the plan's priced memory per pipeline rank is what the emitted program holds
  (`pipeline_memory.pipeline_rank_memory`, which `benchmarks/bench_memory.py` checks against gloo ranks).
"""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer import zoo
from parallelizer.planner import costs
from parallelizer.planner.autocast_dtypes import uniform_dtypes
from parallelizer.pipeline_memory import pipeline_rank_memory
from parallelizer.planner.api import plan as solve_plan
from parallelizer.planner.partition import ChainCosts, partition_chain

S, B, H, A = 2048, 1, 4096, 32
SBH = S * B * H


@pytest.fixture(scope="module")
def layers():
    def traced(n):
        model, inputs = zoo.gpt2(n_layer=n, n_embd=H, n_head=A, vocab_size=1024, n_positions=S, batch=B, seq_len=S,
                                 device="meta", dropout=0.1, activation_function="gelu", attn_implementation="eager")
        return parallelizer.trace(model, inputs)  # fp32, planned "bf16": autocast-priced, nothing widened (r24b)
    return traced(2), traced(3)


def _per_layer(layers, t: int, mode: str, lean: bool) -> int:
    acts = []
    for tg in layers:
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            p = solve_plan(tg, {"tp": t}, cluster=f"h100:1x{t}", axis_roles={"tp": "tp"}, precision="bf16",
                           recompute=mode, lean=lean)
        acts.append(p.cost.memory_bytes["activations"])
    return acts[1] - acts[0]


@pytest.mark.parametrize("t", [4, 8])
def test_lean_layout_saves_korthikanti_tensor_plus_sequence_parallel_rows(layers, t, monkeypatch):
    # Megatron's recipe, whose rows Table 2 counts: every activation bf16 (`autocast_dtypes.uniform_dtypes`); the
    # fp32 model planned "bf16" is priced in autocast's dtypes since round 25 (fp32 residual stream and norms:
    # 314.6 MB per layer at t = 4 instead of 239.1)
    monkeypatch.setattr(costs, "autocast_dtypes", lambda gm, device, received=None: uniform_dtypes(gm))
    stats = 16 * S * B // t  # the two layer norms' fp32 mean and rstd, sharded as their inputs
    expected = {"none": SBH * (34 + 5 * A * S // H) // t + stats, "selective": SBH * 34 // t + stats,
                "full": SBH * 2 // t}
    for mode, bytes_ in expected.items():
        assert _per_layer(layers, t, mode, lean=True) == bytes_, (t, mode)


def test_time_optimal_layout_keeps_part_of_the_block_replicated_at_tp_8(layers):
    # the ILP for time alone (memory only a constraint): what the pipeline search had to work with before; since
    # round 15 (a gather shared by several uses priced once) 7.75 s b h per layer, 11.25 before, lean 4.25
    assert _per_layer(layers, 8, "selective", lean=False) > 1.5 * SBH * 34 / 8


def test_partition_takes_each_modes_own_state_and_ends():
    # two modes: "fast" (1 s per block, state 10 per block) and "lean" (1.5 s, state 4 per block); limit 25 per
    # stage, 2 stages over 4 blocks: fast fits 2 blocks (20) but not 3 (30); an even cut in fast mode is best
    chain = ChainCosts((1.0,) * 4, (10.0,) * 4, (0.0,) * 4, modes=("fast", "lean"),
                       mode_block_s=((1.0,) * 4, (1.5,) * 4), mode_block_act_bytes=((0.0,) * 4, (0.0,) * 4),
                       mode_block_state_bytes=((10.0,) * 4, (4.0,) * 4),
                       mode_ends=((0.0, 3.0, 0.0, 0.0, 6.0, 0.0), (0.0, 3.0, 0.0, 0.0, 1.0, 0.0)))
    part = partition_chain(chain, 2, limit_bytes=25.0)
    # cut 2 | 2: the last stage (post: 3 s, 6 bytes fast / 1 lean) fast needs 26 > 25 bytes, lean 9: 6 s;
    # cut 3 | 1: stage 0 fast needs 30, lean 12 bytes: 4.5 s; stage 1 fast: 16 bytes, 4 s: max 4.5 s, the best
    assert part.cuts == (0, 3, 4) and part.modes == (1, 0), part
    assert part.max_stage_s == pytest.approx(4.5)
    assert chain.stage_memory_bytes(1, 2, 3, 4, mode=0) == (16.0, 0.0)
    assert chain.stage_memory_bytes(1, 2, 2, 4, mode=1) == (9.0, 0.0)


GPT2_SMALL = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=4, seq_len=64, dropout=0.0)


def _pipeline(budget_bytes: int):
    traced = parallelizer.trace(*zoo.gpt2(device="meta", **GPT2_SMALL))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"pp": 2, "tp": 2}, axis_roles={"tp": "tp"}, schedule="1f1b", microbatches=2,
                                 global_batch=8, progress=False, recompute="none", precision="fp32",
                                 memory_budget_bytes=budget_bytes, memory_reserve_bytes=0, cluster="h100:1x4")
    return traced, plan


def test_search_gives_the_lean_layout_only_where_memory_binds():
    _, free = _pipeline(10 ** 9)
    assert free.model["search"]["lean_stages"] == []
    traced, plan = _pipeline(5_600_000)  # stage 0 keeps 2 microbatches of 2 blocks: 5.71 MB in the time layout, 5.18 lean
    assert plan.model["search"]["lean_stages"] == [0]
    assert plan.pipeline.blocks_per_stage == (2, 2)
    # the lean stage's layer norms are sharded (batch or sequence), the time-optimal stage's replicated
    by_stage: dict[bool, set] = {}
    for name, node in plan.nodes.items():
        if node.op == "aten.layer_norm.default":
            by_stage.setdefault(traced.nodes[name].block in plan.pipeline.stages[0].blocks, set()).add(node.inputs[0])
    assert "R" not in by_stage[True] and by_stage[False] == {"R"}, by_stage
    priced = plan.pipeline.estimate.rank_memory_bytes
    held = pipeline_rank_memory(plan, traced)
    for r in range(2):
        assert max(m["total"] for m in priced) <= 5_600_000
        assert priced[r]["activations"] == held[r]["activations"], r
        assert priced[r]["total"] == held[r]["total"], r
