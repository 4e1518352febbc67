"""parallelizer.pipeline_memory: predicted bytes per pipeline rank of a pipeline Plan, against closed forms
(stage parameters x bytes per parameter; in-flight microbatches per schedule)."""

import contextlib
import dataclasses
import io
import math

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.pipeline_memory import pipeline_rank_memory
from parallelizer.planner.schedules import inflight_microbatches

E, V, P, M = 32, 128, 64, 4


@pytest.fixture(scope="module")
def gpt2():
    model, args, kwargs = zoo.gpt2(n_layer=2, n_embd=E, n_head=2, vocab_size=V, batch=2, seq_len=16, labels=True)
    return model, parallelizer.trace(model, args, kwargs)


def _plan(traced, mesh, **options):
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, mesh, precision="fp32", **options)


def test_stage_state_and_inflight_activations(gpt2):
    model, traced = gpt2
    one_f = pipeline_rank_memory(_plan(traced, {"pp": 2}, schedule="1f1b", microbatches=M), traced)
    gpipe = pipeline_rank_memory(_plan(traced, {"pp": 2}, schedule="gpipe", microbatches=M), traced)
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    # fp32 + AdamW: 4 + 4 + 8 B/param; stage 0: wte, wpe, h.0; stage 1: h.1, ln_f, lm_head (= wte, tied)
    for rank, numel in ((0, V * E + P * E + block), (1, block + 2 * E + V * E)):
        for mem in (one_f[rank], gpipe[rank]):
            assert (mem["params"], mem["grads"], mem["optimizer"]) == (4 * numel, 4 * numel, 8 * numel)
    # 1F1B keeps pp - r microbatches in flight on rank r, GPipe all M (Narayanan et al. SC'21, Sec. 2.2)
    assert gpipe[0]["activations"] == M / 2 * one_f[0]["activations"]
    assert gpipe[1]["activations"] == M * one_f[1]["activations"]
    assert all(m["total"] == sum(m[k] for k in ("params", "grads", "optimizer", "activations", "outputs", "buffers"))
               for m in one_f)
    # the last stage returns what the step reads of (loss, logits): the model's own loss, 4 bytes (round 16;
    # before, one microbatch of both whole, 4 + 2 x 16 x V x 4 bytes, which `pm.step` never returned)
    assert [m["outputs"] for m in one_f] == [0, 4]


def test_stage_activations_cover_the_whole_graph_once(gpt2):
    _, traced = gpt2
    plan = _plan(traced, {"pp": 2}, schedule="gpipe", microbatches=M)
    ranks = pipeline_rank_memory(plan, traced)
    per_mb = sum(m["activations"] for m in ranks) / M
    whole = _plan(traced, {"dp": 1}).cost.memory_bytes["activations"]  # every op on one device, one microbatch
    # each stage counts its own copy of a received value that both stages save (the boundary hidden state)
    boundary = 2 * 16 * E * 4
    assert whole <= per_mb <= whole + 2 * boundary
    # the planner's search priced the same bytes per rank (what `show` prints for the plan)
    searched = plan.pipeline.estimate.rank_memory_bytes
    assert [{k: m[k] for k in s} for m, s in zip(ranks, searched)] == [dict(s) for s in searched]


def test_plan_without_pipeline_is_its_cost(gpt2):
    _, traced = gpt2
    plan = _plan(traced, {"dp": 2})
    (mem,) = pipeline_rank_memory(plan, traced)
    assert {k: mem[k] for k in ("params", "activations")} == \
        {k: plan.cost.memory_bytes[k] for k in ("params", "activations")}


def test_bitpipe_holds_every_stage_twice_and_replays_its_actions():
    model, args, kwargs = zoo.gpt2(n_layer=4, n_embd=E, n_head=2, vocab_size=V, batch=2, seq_len=16, labels=True)
    traced = parallelizer.trace(model, args, kwargs)
    inter = _plan(traced, {"pp": 2}, schedule="interleaved_1f1b", microbatches=M)
    bit = dataclasses.replace(inter, pipeline=dataclasses.replace(inter.pipeline, schedule="bitpipe"))
    looped, mirrored = pipeline_rank_memory(inter, traced), pipeline_rank_memory(bit, traced)
    # pp=2: each rank holds the down copies of 2 stages and the up copies of the other 2, i.e. all 4 stages
    # (two weight copies of 2 / pp of the model), so its state is the sum of both interleaved ranks'
    for rank in (0, 1):
        for key in ("params", "grads", "optimizer", "buffers"):
            assert mirrored[rank][key] == looped[0][key] + looped[1][key], (rank, key)
    # activations: the peak of the action-list replay; with pp=2, m=4 each rank runs the forwards of 1
    # microbatch per pipeline through its chunks before the first backward (rank 0: 0F0 5F1 6F1 3F0 3B0 6B1
    # 5B1 0B0 0F2 ...), i.e. A_0 + A_1 + A_2 + A_3, one microbatch through the whole model; plus (round 25,
    # r25i) the receive buffers the runner posts at the step's start, each held until its action runs. Rank 0's
    # cross-rank receives per unit of 2 microbatches: 5F1 (stage 1's inputs, V_1), 3F0 (V_3), 6B1 (the gradients
    # of stage 3's inputs, G_2), 0B0 (G_0); rank 1's mirror: 1F0, 7F1, 2B0, 4B1, the same sizes. Peak after 3F0:
    # A_0..A_3 + both units' buffers - V_1 - V_3 = per_mb + V_1 + V_3 + 2 (G_0 + G_2) (A_2 + A_3 > V_3 here)
    per_mb = sum(looped[r]["activations"] / inflight_microbatches("interleaved_1f1b", 2, M, r) for r in (0, 1))
    V_, G_ = _boundary_sizes(traced, 4)
    assert min(V_[1:]) > 0 and min(G_[:-1]) > 0
    for rank in (0, 1):
        assert mirrored[rank]["activations"] == pytest.approx(per_mb + V_[1] + V_[3] + 2 * (G_[0] + G_[2]), abs=2)


def _boundary_sizes(traced, num_stages):
    """Per model stage k, from the traced graph's metadata (not the runner's allocation): bytes of the values k
    receives, and of the gradients k receives back from k + 1 (k + 1's received floating values, model inputs
    passed through excluded: they carry no gradient)."""
    from parallelizer.runtime.pipeline import cut_stages

    cut = cut_stages(traced, num_stages)
    meta = {n: traced.node(n).outputs[0] for k in range(num_stages) for n in cut.inputs[k]}
    size = {n: math.prod(m.shape) * m.dtype.itemsize for n, m in meta.items()}
    values = [sum(size[n] for n in cut.inputs[k]) for k in range(num_stages)]
    grads = [sum(size[n] for n in cut.inputs[k + 1] if meta[n].dtype.is_floating_point
                 and n not in traced.input_names) for k in range(num_stages - 1)] + [0]
    return values, grads
