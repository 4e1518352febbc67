"""Round 24 (r24a): the pipeline search's memos return what the unmemoised computation returns, so the pick and
the plan JSON do not move. `stage_sync.stage_syncs` prices each distinct (gradient bytes, segments produced)
stage once and each distinct bucket size once: the 1T GPT's search (a100:384x8) priced 4.1M bucket all-reduces
before, a handful of distinct ones after. The reference here prices every stage alone (a call of one stage shares
nothing), and the searched plan with the memo equals, byte for byte, the plan searched with the reference in its
place, on a grid where every candidate is partitioned (`search="exhaustive"`: the brute-force answer)."""
import itertools

import pytest
import torch

import parallelizer
from cost_model.communication import step_collective_s
from cost_model.topology import MeshTopology, dgx_a100
from parallelizer import zoo
from parallelizer.planner import candidates
from parallelizer.planner.stage_sync import ready_fractions, stage_syncs
from parallelizer.rewriter.grad_sync import bucket_sizes

CLUSTER = dgx_a100(2)  # 16 devices


def _each_stage_alone(dp, grads_bytes, topo, overlap, produced=None):
    """`stage_syncs` of the module docstring, every stage priced by its own call (nothing shared)."""
    out = [stage_syncs(dp, [g], topo, overlap, None if produced is None else [produced[k]])
           for k, g in enumerate(grads_bytes)]
    return tuple(s[0][0] for s in out), tuple(s[1][0] for s in out)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("dp", [1, 4])
def test_stage_syncs_equal_the_closed_form_of_each_stage(dp, overlap):
    """Stages of equal and of different bytes and segments, a stage of no gradients: the memoised call equals,
    stage by stage, the buckets' prices and ready fractions computed from their definitions."""
    topo = MeshTopology(CLUSTER, (2, dp, 8 // dp), ("pp", "dp", "tp"))
    grads = [3.1e8, 3.1e8, 5.0e7, 0.0, 3.1e8, 3.1e8]
    produced = [[(2.0, 3.0e8), (0.5, 1.0e7)], [(2.0, 3.0e8), (0.5, 1.0e7)], [(1.0, 5.0e7)], [],
                [(2.0, 1.55e8), (2.0, 1.55e8)], [(2.0, 3.0e8), (0.5, 1.0e7)]]
    secs, ready = stage_syncs(dp, grads, topo, overlap, produced)
    for k, g in enumerate(grads):
        sizes = [] if dp == 1 or not g else bucket_sizes(g) if overlap else [g]
        assert secs[k] == tuple(step_collective_s("all_reduce", b, topo, ("dp",)) for b in sizes)
        assert ready[k] == ready_fractions(list(itertools.accumulate(sizes)), produced[k])
    assert (secs, ready) == _each_stage_alone(dp, grads, topo, overlap, produced)
    if dp > 1 and overlap:  # 3.1e8 B: the 1 MiB first bucket, 11 of 25 MiB and the rest
        assert len(secs[0]) == 13 and secs[3] == () and secs[2] != secs[0] and ready[4] != ready[0]


def test_each_distinct_bucket_is_priced_once(monkeypatch):
    """128 stages of 3.1e8 gradient bytes each on dp=4: 1664 buckets of three distinct sizes (1 MiB, 25 MiB, the
    rest), priced 3 times (1664 before round 24)."""
    from parallelizer.planner import stage_sync
    calls = []
    monkeypatch.setattr(stage_sync, "step_collective_s", lambda *a, **k: calls.append(a[1]) or step_collective_s(*a, **k))
    topo = MeshTopology(CLUSTER, (1, 4, 4), ("pp", "dp", "tp"))
    secs, _ = stage_syncs(4, [3.1e8] * 128, topo, True, [[(2.0, 3.1e8)]] * 128)
    assert sum(map(len, secs)) == 1664 and sorted(calls) == sorted(set(bucket_sizes(3.1e8)))


@pytest.fixture(scope="module")
def gpt():
    m, inp = zoo.gpt(n_layer=4, n_embd=128, n_head=4, block_size=64, vocab_size=256, batch=1, with_targets=True,
                     device="meta")
    return parallelizer.trace(m.to(torch.bfloat16), inp)


def test_the_memoised_search_picks_the_plan_of_each_stage_priced_alone(gpt, monkeypatch):
    """Every candidate (tp=2: pp, dp, microbatches, schedule) partitioned and its partitions simulated where their
    bound allows (the exhaustive grid), once with the memo and once with every stage's sync priced by its own call:
    the same plan JSON."""
    memo = parallelizer.plan_pipeline(gpt, CLUSTER, global_batch=32, precision="bf16", search="exhaustive", tp=2,
                                      progress=False)
    monkeypatch.setattr(candidates, "stage_syncs", _each_stage_alone)
    alone = parallelizer.plan_pipeline(gpt, CLUSTER, global_batch=32, precision="bf16", search="exhaustive", tp=2,
                                       progress=False)
    assert memo.dp > 1 and memo.search.evaluated == alone.search.evaluated > 10
    assert memo.to_json() == alone.to_json()


def test_graph_flops_counted_once_per_op_signature_equal_every_op_counted(gpt, monkeypatch):
    """`cost_model.graph_flops` counts each distinct op signature once (the 4 blocks share theirs): the same
    totals as FlopCounterMode run on every op, with fewer runs."""
    from cost_model import compute
    from cost_model._fx import node_values, op_nodes
    fwd = bwd = 0
    for node in op_nodes(gpt.graph_module):
        args, kwargs, out = node_values(node)
        flops = compute.op_flops(node.target, args, kwargs, out)
        fwd += flops
        bwd += 2 * flops if flops and compute._has_backward(args, kwargs, out) else 0
    runs = []
    monkeypatch.setattr(compute, "op_flops", lambda *a: runs.append(a[0]) or compute._flops_and_ops(*a, want_ops=False)[0])
    assert compute.graph_flops(gpt.graph_module) == (fwd, bwd) and fwd > 0 and bwd > 0
    assert len(runs) < len(list(op_nodes(gpt.graph_module))) / 2
