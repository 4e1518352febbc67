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
    got = op_collectives(ce, (Layout.parse("S(0)S(1)"), Layout.parse("S(0)R")), rr, shapes, (), mesh, torch.float32)
    # three calls of one row vector each, as `localize.sharded_cross_entropy` runs them (max, sum of exp, picked)
    assert sorted(got) == sorted([("all_reduce", 256 * 4, 1, False)] * 3 + [("all_reduce", 4, 0, False)])
    summed = _node(aten.cross_entropy_loss.default, None, 2)  # reduction "sum": no denominator
    assert op_collectives(summed, (Layout.parse("S(0)R"), Layout.parse("S(0)R")), rr, shapes, (), mesh, torch.float32) == []
    assert op_collectives(ce, (rr, rr), rr, shapes, (), mesh, torch.float32) == []


def test_sync_batch_norm_all_reduces_statistics_forward_and_their_gradients_backward():
    g = torch.fx.Graph()
    x, w, b, rm, rv = (g.placeholder(n) for n in "xwbmv")
    bn = g.call_function(aten.batch_norm.default, (x, w, b, rm, rv, True, 0.1, 1e-5, False))
    mesh, layouts = MeshSpec(("dp",), (2,)), (Layout.parse("S(0)"),) + (Layout.parse("R"),) * 4
    shapes = [(16, 16, 4, 4)] + [(16,)] * 4
    got = op_collectives(bn, layouts, Layout.parse("S(0)"), shapes, (16, 16, 4, 4), mesh, torch.float32)
    assert sorted(got) == sorted([("all_reduce", 4, 0, False)] + [("all_reduce", 64, 0, False)] * 2
                                 + [("all_reduce", 64, 0, True)] * 2)
    eval_bn = g.call_function(aten.batch_norm.default, (x, w, b, rm, rv, False, 0.1, 1e-5, False))
    assert op_collectives(eval_bn, layouts, Layout.parse("S(0)"), shapes, (16, 16, 4, 4), mesh, torch.float32) == []


def test_instance_norm_updating_running_statistics_on_a_batch_shard_all_reduces_them_forward_only():
    """`localize.sync_instance_norm` (round 10) all-reduces the batch sums of the per-instance means and variances
    (2 x C) before the buffers' update; the priced collectives must be exactly those (DESIGN.md rule 1)."""
    g = torch.fx.Graph()
    x, w, b, rm, rv = (g.placeholder(n) for n in "xwbmv")
    tracked = g.call_function(aten.instance_norm.default, (x, w, b, rm, rv, True, 0.1, 1e-5, False))
    mesh, layouts = MeshSpec(("dp", "tp"), (2, 2)), (Layout.parse("S(0)R"),) + (Layout.parse("RR"),) * 4
    shapes, out = [(8, 6, 4, 4)] + [(6,)] * 4, (8, 6, 4, 4)
    assert op_collectives(tracked, layouts, Layout.parse("S(0)R"), shapes, out, mesh, torch.float32) == [("all_reduce", 2 * 6 * 4, 0, False)]
    plain = g.call_function(aten.instance_norm.default, (x, w, b, None, None, True, 0.1, 1e-5, False))
    assert op_collectives(plain, layouts[:3], Layout.parse("S(0)R"), shapes[:3], out, mesh, torch.float32) == []
    rr = (Layout.parse("RR"),) * 5
    assert op_collectives(tracked, rr, Layout.parse("RR"), shapes, out, mesh, torch.float32) == []


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
    got = op_collectives(view, (s0,), s0, [src], dst, mesh, torch.float32)
    assert got == [("all_to_all", nbytes, 0, False), ("all_to_all", nbytes, 0, True)]
    assert op_collectives(view, (s0,), s0, [even_src], even_dst, mesh, torch.float32) == []  # blocks line up: no re-cut
    assert op_collectives(view, (Layout.parse("R"),), Layout.parse("R"), [src], dst, mesh, torch.float32) == []


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


# --- the width of the statistics' all-reduces: priced as the runtime sums them (round 25) -------------------------

class _Backend:
    """Stands in for the functional collectives in ONE process: records the bytes of every tensor the runtime hands
    the backend (the values returned are the rank's own: only the bytes are read) and the kind of reduction."""

    def __init__(self):
        self.moved = []
        self.AsyncCollectiveTensor = type(None)  # nothing returned is one: `collectives._wait` returns it as is

    def all_reduce(self, x, op, name):
        self.moved.append(x.numel() * x.element_size())
        return x


@pytest.fixture
def backend(monkeypatch):
    from parallelizer.rewriter import collectives
    fake = _Backend()
    monkeypatch.setattr(collectives, "_resolve", lambda group, op, hierarchy=None: collectives._GroupView("g", (0, 1), 0))
    monkeypatch.setattr(collectives, "funcol", fake)
    return fake


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_sync_batch_norm_statistics_are_priced_at_the_bytes_the_runtime_all_reduces(backend, dtype):
    # a 16-bit batch norm reduces its count, sums and variances in float32 (`localize.sync_batch_norm`, as torch's
    # kernels accumulate); before round 25 `op_comm` priced them at the input's 2 B per element, half what moves
    from parallelizer.rewriter.localize import sync_batch_norm
    x = torch.randn(8, 6, 4, 4).to(dtype).requires_grad_()
    params = [torch.ones(6, dtype=dtype, requires_grad=True), torch.zeros(6, dtype=dtype, requires_grad=True)]
    sync_batch_norm(x, *params, torch.zeros(6, dtype=dtype), torch.ones(6, dtype=dtype), True, 0.1, 1e-5,
                    [[0, 1]]).float().square().sum().backward()
    g = torch.fx.Graph()
    bn = g.call_function(aten.batch_norm.default, (*(g.placeholder(n) for n in "xwbmv"), True, 0.1, 1e-5, False))
    layouts = (Layout.parse("S(0)"),) + (Layout.parse("R"),) * 4
    priced = op_collectives(bn, layouts, Layout.parse("S(0)"), [(16, 6, 4, 4)] + [(6,)] * 4, (16, 6, 4, 4),
                            MeshSpec(("dp",), (2,)), dtype)
    assert sorted(b for _, b, _, _ in priced) == sorted(backend.moved) == [4, 24, 24, 24, 24]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_vocab_parallel_cross_entropy_is_priced_at_the_bytes_the_runtime_all_reduces(backend, dtype):
    # the row max travels as float32's order image, the sum of exponentials, the target logit and the mean's
    # denominator in float32 (`vocab_parallel`, `localize._mean_denominator`): 4 B per row for 16-bit logits too
    from parallelizer.rewriter.localize import sharded_cross_entropy
    logits = torch.randn(8, 10).to(dtype)  # rows 8 of 16 (dp), classes 0..9 of 20 (tp)
    sharded_cross_entropy(logits, torch.randint(0, 20, (8,)), None, 1, -100, 0.0, [[0, 1]], [[0, 1]], 0, 20)
    ce = _node(aten.cross_entropy_loss.default)
    priced = op_collectives(ce, (Layout.parse("S(0)S(1)"), Layout.parse("S(0)R")), Layout.parse("RR"),
                            [(16, 20), (16,)], (), MeshSpec(("dp", "tp"), (2, 2)), dtype)
    assert sorted(b for _, b, _, _ in priced) == sorted(backend.moved) == [4, 32, 32, 32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_instance_norm_running_statistics_are_priced_at_the_bytes_the_runtime_all_reduces(backend, dtype):
    from parallelizer.rewriter.localize import sync_instance_norm
    sync_instance_norm(torch.randn(4, 6, 4, 4).to(dtype), None, None, torch.zeros(6, dtype=dtype),
                       torch.ones(6, dtype=dtype), True, 0.1, 1e-5, False, 8, [[0, 1]])
    g = torch.fx.Graph()
    tracked = g.call_function(aten.instance_norm.default, (*(g.placeholder(n) for n in "xwbmv"), True, 0.1, 1e-5, False))
    priced = op_collectives(tracked, (Layout.parse("S(0)"),) + (Layout.parse("R"),) * 4, Layout.parse("S(0)"),
                            [(8, 6, 4, 4)] + [(6,)] * 4, (8, 6, 4, 4), MeshSpec(("dp",), (2,)), dtype)
    assert [b for _, b, _, _ in priced] == backend.moved == [2 * 6 * 4]


class _Doubling(_Backend):
    """Two ranks holding the same shard: every sum doubles (the bytes are recorded as `_Backend` does)."""

    def all_reduce(self, x, op, name):
        super().all_reduce(x, op, name)
        return x * 2 if op == "sum" else x


def test_a_batch_sharded_nll_loss_mean_counts_in_float32_and_prices_its_denominator(monkeypatch):
    # `localize.sharded_nll_loss` all-reduced its mean's denominator in the log-probabilities' dtype: a float16
    # count of 2 x 40000 targets was inf and the loss 0 where one device's is finite; `op_comm` did not price that
    # all-reduce at all (round 25)
    from parallelizer.rewriter import collectives
    from parallelizer.rewriter.localize import sharded_nll_loss
    fake = _Doubling()
    monkeypatch.setattr(collectives, "_resolve", lambda group, op, hierarchy=None: collectives._GroupView("g", (0, 1), 0))
    monkeypatch.setattr(collectives, "funcol", fake)
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(40000, 5), 1).half()
    target = torch.randint(0, 5, (40000,))
    partial = sharded_nll_loss(logp, target, None, 1, -100, [[0, 1]])  # this rank's share of the mean
    one_device = nn.functional.nll_loss(torch.cat([logp, logp]).float(), torch.cat([target, target]))
    torch.testing.assert_close(2 * partial.float(), one_device, rtol=1e-3, atol=1e-5)  # float16's tolerance
    g = torch.fx.Graph()
    nll = g.call_function(aten.nll_loss_nd.default, (g.placeholder("x"), g.placeholder("t"), None, 1, -100))
    priced = op_collectives(nll, (Layout.parse("S(0)"), Layout.parse("S(0)")), Layout.parse("P"),
                            [(80000, 5), (80000,)], (), MeshSpec(("dp",), (2,)), torch.float16)
    assert [b for _, b, _, _ in priced] == fake.moved == [4]


class _Splice(nn.Module):
    """A VLM's splice: each sample's image-token positions take its 2 rows of features (`masked_scatter`)."""

    def forward(self, h, mask, feats):
        return h.masked_scatter(mask, feats).square().mean()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_batch_sharded_masked_scatter_prices_the_mismatch_flag_the_runtime_all_reduces(backend, dtype):
    # `localize.checked_masked_scatter` all-reduces one float32 flag per batch axis each forward so that every rank
    # raises together on a mismatched count; `op_comm` priced nothing for it before round 26 (r25h's leftover 2)
    from parallelizer.rewriter.localize import checked_masked_scatter
    h, mask = torch.randn(2, 4, 3).to(dtype), torch.zeros(2, 4, 3, dtype=torch.bool)
    mask[:, 1] = True  # each sample selects 3 elements; its share of the source: one row of 3
    checked_masked_scatter(h, mask, torch.randn(2, 3).to(dtype), [[0, 1], [0, 2]])  # batch over dp and tp
    g = torch.fx.Graph()
    ms = g.call_function(aten.masked_scatter.default, tuple(g.placeholder(n) for n in "hms"))
    s0, mesh = Layout.parse("S(0)S(0)"), MeshSpec(("dp", "tp"), (2, 2))
    priced = op_collectives(ms, (s0, s0, s0), s0, [(8, 4, 3), (8, 4, 3), (8, 3)], (8, 4, 3), mesh, dtype)
    assert sorted(priced) == [("all_reduce", 4, 0, False), ("all_reduce", 4, 1, False)]
    assert [b for _, b, _, _ in priced] == backend.moved == [4, 4]
    rr = Layout.parse("RR")  # replicated: the op runs whole, nothing checked, nothing priced
    assert op_collectives(ms, (rr, rr, rr), rr, [(8, 4, 3), (8, 4, 3), (8, 3)], (8, 4, 3), mesh, dtype) == []


def test_node_cost_adds_the_masked_scatter_check_on_a_batch_shard(monkeypatch):
    mask = torch.zeros(8, 4, 3, dtype=torch.bool)
    mask[:, 1:3] = True
    traced = parallelizer.trace(_Splice(), (torch.randn(8, 4, 3), mask, torch.randn(16, 3)))
    problem, pricer = build(traced, MeshSpec(("dp",), (2,)), cluster="h100:1x2", config=PlanConfig(precision="fp32"))
    name = next(n for n, i in traced.nodes.items() if "masked_scatter" in str(i.target))
    info, space = traced.nodes[name], problem.spaces[name]
    sharded = next(s for s in space.strategies if str(s.inputs[0]) == "S(0)")
    with_check = pricer.node_cost(traced, info, space, sharded)
    monkeypatch.setattr("parallelizer.planner.costs.op_collectives", lambda *a: [])
    alone = pricer.node_cost(traced, info, space, sharded)
    flag = collective_time_s("all_reduce", 4, pricer.topo, ("dp",)) + pricer.device.collective_sync_s
    assert with_check.fwd_s == pytest.approx(alone.fwd_s + flag, rel=1e-12) and with_check.bwd_s == alone.bwd_s


def test_a_size_1_mesh_axis_prices_no_inner_collective():
    """A layout may shard along a mesh axis of one device ("S(0)S(0)" on (dp=2, tp=1)); the runtime's local forms
    communicate only over axes of more than one device (`localize.Context.sharded_axes`), so such a strategy runs
    the program of "S(0)" on (dp=2). Before round 26 `op_comm` listed a collective on the size-1 axis too, which
    `step_collective_s` prices at the device's sync wait (4.7 ms per call on a calibrated 4-rank CPU profile)."""
    g = torch.fx.Graph()
    x, t, w, b, rm, rv = (g.placeholder(n) for n in ("x", "t", "w", "b", "rm", "rv"))
    ops = {"batch_norm": (g.call_function(aten.batch_norm.default, (x, w, b, rm, rv, True, 0.1, 1e-5, False)),
                          [(8, 6, 4, 4)] + [(6,)] * 4, (8, 6, 4, 4), 5),
           "instance_norm": (g.call_function(aten.instance_norm.default, (x, w, b, rm, rv, True, 0.1, 1e-5, False)),
                             [(8, 6, 4, 4)] + [(6,)] * 4, (8, 6, 4, 4), 5),
           "nll_loss_nd": (g.call_function(aten.nll_loss_nd.default, (x, t, None, 1, -100)), [(8, 6), (8,)], (), 2),
           "cross_entropy": (g.call_function(aten.cross_entropy_loss.default, (x, t)), [(8, 6), (8,)], (), 2),
           "masked_scatter": (g.call_function(aten.masked_scatter.default, (x, t, w)), [(8, 4, 3), (8, 4, 3), (8, 3)],
                              (8, 4, 3), 3)}
    for name, (node, shapes, out, n) in ops.items():
        two = op_collectives(node, (Layout.parse("S(0)S(0)"),) + (Layout.parse("RR"),) * (n - 1), Layout.parse("S(0)S(0)"),
                             shapes, out, MeshSpec(("dp", "tp"), (2, 1)), torch.float32)
        one = op_collectives(node, (Layout.parse("S(0)"),) + (Layout.parse("R"),) * (n - 1), Layout.parse("S(0)"),
                             shapes, out, MeshSpec(("dp",), (2,)), torch.float32)
        assert two == one and one, (name, two, one)
    vocab = op_collectives(ops["cross_entropy"][0], (Layout.parse("RS(1)"), Layout.parse("RR")), Layout.parse("RR"),
                           [(8, 6), (8,)], (), MeshSpec(("dp", "tp"), (2, 1)), torch.float32)
    assert vocab == []  # classes "sharded" over one device: no row statistics to all-reduce
