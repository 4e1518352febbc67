"""Collectives inside sharded ops (`planner.op_comm`) and their price in `Pricer.node_cost`."""
import pytest
import torch
from torch import nn

import parallelizer
from cost_model.communication import collective_time_s
from parallelizer.config import PlanConfig
from parallelizer.core import Layout, MeshSpec
from parallelizer.planner.api import build
from parallelizer.planner.op_comm import op_collectives

aten = torch.ops.aten


def _node(target, *args):
    g = torch.fx.Graph()
    ins = [g.placeholder(f"x{i}") for i in range(2)]
    return g.call_function(target, (*ins, *args))


def test_vocab_parallel_cross_entropy_all_reduces_three_row_vectors_in_three_calls():
    ce = _node(aten.cross_entropy_loss.default)  # reduction "mean" (default)
    # logits (N, C) classes sharded on axis 1 ("tp"), rows on axis 0 ("dp"): local (256, 512), target (256,)
    mesh, rr, shapes = MeshSpec(("dp", "tp"), (2, 2)), Layout.parse("RR"), [(512, 1024), (512,)]
    got = op_collectives(ce, (Layout.parse("S(0)S(1)"), Layout.parse("S(0)R")), rr, shapes, (), mesh, 4)
    # three calls of one row vector each, as `localize.sharded_cross_entropy` runs them (max, sum of exp, picked)
    assert sorted(got) == sorted([("all_reduce", 256 * 4, 1, False)] * 3 + [("all_reduce", 4, 0, False)])
    summed = _node(aten.cross_entropy_loss.default, None, 2)  # reduction "sum": no denominator
    assert op_collectives(summed, (Layout.parse("S(0)R"), Layout.parse("S(0)R")), rr, shapes, (), mesh, 4) == []
    assert op_collectives(ce, (rr, rr), rr, shapes, (), mesh, 4) == []


def test_sync_batch_norm_all_reduces_statistics_forward_and_their_gradients_backward():
    g = torch.fx.Graph()
    x, w, b, rm, rv = (g.placeholder(n) for n in "xwbmv")
    bn = g.call_function(aten.batch_norm.default, (x, w, b, rm, rv, True, 0.1, 1e-5, False))
    mesh, layouts = MeshSpec(("dp",), (2,)), (Layout.parse("S(0)"),) + (Layout.parse("R"),) * 4
    shapes = [(16, 16, 4, 4)] + [(16,)] * 4
    got = op_collectives(bn, layouts, Layout.parse("S(0)"), shapes, (16, 16, 4, 4), mesh, 4)
    assert sorted(got) == sorted([("all_reduce", 4, 0, False)] + [("all_reduce", 64, 0, False)] * 2
                                 + [("all_reduce", 64, 0, True)] * 2)
    eval_bn = g.call_function(aten.batch_norm.default, (x, w, b, rm, rv, False, 0.1, 1e-5, False))
    assert op_collectives(eval_bn, layouts, Layout.parse("S(0)"), shapes, (16, 16, 4, 4), mesh, 4) == []


def test_instance_norm_updating_running_statistics_on_a_batch_shard_all_reduces_them_forward_only():
    """`localize.sync_instance_norm` (round 10) all-reduces the batch sums of the per-instance means and variances
    (2 x C) before the buffers' update; the priced collectives must be exactly those (DESIGN.md rule 1)."""
    g = torch.fx.Graph()
    x, w, b, rm, rv = (g.placeholder(n) for n in "xwbmv")
    tracked = g.call_function(aten.instance_norm.default, (x, w, b, rm, rv, True, 0.1, 1e-5, False))
    mesh, layouts = MeshSpec(("dp", "tp"), (2, 2)), (Layout.parse("S(0)R"),) + (Layout.parse("RR"),) * 4
    shapes, out = [(8, 6, 4, 4)] + [(6,)] * 4, (8, 6, 4, 4)
    assert op_collectives(tracked, layouts, Layout.parse("S(0)R"), shapes, out, mesh, 4) == [("all_reduce", 2 * 6 * 4, 0, False)]
    plain = g.call_function(aten.instance_norm.default, (x, w, b, None, None, True, 0.1, 1e-5, False))
    assert op_collectives(plain, layouts[:3], Layout.parse("S(0)R"), shapes[:3], out, mesh, 4) == []
    rr = (Layout.parse("RR"),) * 5
    assert op_collectives(tracked, rr, Layout.parse("RR"), shapes, out, mesh, 4) == []


@pytest.mark.parametrize("src, dst, row_elems, even_src, even_dst", [
    ((10, 7), (70,), 1, (8, 7), (56,)), ((70,), (10, 7), 1, (56,), (8, 7)), ((10, 7, 3), (70, 3), 3, (8, 7, 3), (56, 3))])
def test_view_of_an_uneven_shard_prices_its_recut_as_an_all_to_all_each_way(src, dst, row_elems, even_src, even_dst):
    """(10, 7) over 4 ranks holds rows (3, 3, 3, 1): blocks of (21, 21, 21, 7) elements, while Shard(0) of 70 is
    (18, 18, 18, 16). Member j keeps the overlap of its old and new block and sends the rest: 3, 6, 9, 0 rows
    (the split sends 0, 3, 6, 9); the busiest sends 9. The all-to-all's buffer is 9 rows x 4/3 (its (n-1)/n is
    sent, `cost_model.communication`)."""
    view = _node(aten.view.default, list(dst))
    mesh, s0 = MeshSpec(("dp",), (4,)), Layout.parse("S(0)")
    nbytes = 9 * row_elems * 4 * 4 // 3
    got = op_collectives(view, (s0,), s0, [src], dst, mesh, 4)
    assert got == [("all_to_all", nbytes, 0, False), ("all_to_all", nbytes, 0, True)]
    assert op_collectives(view, (s0,), s0, [even_src], even_dst, mesh, 4) == []  # blocks line up: no re-cut
    assert op_collectives(view, (Layout.parse("R"),), Layout.parse("R"), [src], dst, mesh, 4) == []


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 1024, bias=False)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.proj(x), y)


def test_node_cost_adds_the_inner_collectives_of_a_vocab_parallel_cross_entropy(monkeypatch):
    traced = parallelizer.trace(_Head(), (torch.randn(128, 64), torch.randint(0, 1024, (128,))))
    problem, pricer = build(traced, MeshSpec(("tp",), (2,)), cluster="h100:1x2", config=PlanConfig(precision="fp32"))
    name = next(n for n, i in traced.nodes.items() if "cross_entropy" in str(i.target))
    info, space = traced.nodes[name], problem.spaces[name]
    by_input = {str(s.inputs[0]): s for s in space.strategies}
    vocab, rows = by_input["S(1)"], by_input["S(0)"]
    with_comm = {k: pricer.node_cost(traced, info, space, s) for k, s in (("vocab", vocab), ("rows", rows))}
    monkeypatch.setattr("parallelizer.planner.costs.op_collectives", lambda *a: [])
    alone = {k: pricer.node_cost(traced, info, space, s) for k, s in (("vocab", vocab), ("rows", rows))}
    sync = pricer.device.collective_sync_s
    three_rows = 3 * (collective_time_s("all_reduce", 128 * 4, pricer.topo, ("tp",)) + sync)  # 3 calls of (128,), fp32
    denominator = collective_time_s("all_reduce", 4, pricer.topo, ("tp",)) + sync
    assert with_comm["vocab"].fwd_s == pytest.approx(alone["vocab"].fwd_s + three_rows, rel=1e-12)
    assert with_comm["rows"].fwd_s == pytest.approx(alone["rows"].fwd_s + denominator, rel=1e-12)
    assert [c.bwd_s for c in with_comm.values()] == [c.bwd_s for c in alone.values()]  # no backward collective
