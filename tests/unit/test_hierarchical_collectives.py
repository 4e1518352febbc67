"""Hierarchical (two-level) collectives, priced (issue 15, build item 4): closed forms of the flat ring and the
two-level algorithm over a group spanning nodes, the planner's choice per collective (the cheaper estimate,
ties flat) as byte ranges, and the plan's record of it (JSON and `show`)."""
import contextlib
import io
import math

import pytest
import torch

import parallelizer
from cost_model import (Cluster, Link, MeshTopology, collective_algorithm, collective_time_s, dgx_h100,
                        flat_collective_time_s, get_cluster, hierarchical_byte_ranges)
from cost_model.hardware import H100_SXM
from parallelizer import zoo
from parallelizer.plan_io import plan_text
from parallelizer.rewriter import rewrite
from parallelizer.rewriter.hierarchical import hierarchy_arg, split_group, sub_groups, uses_hierarchy
from parallelizer.rewriter.spec import hierarchical_sub_groups, spec_from_plan

MB = 1 << 20


def _flat_all_reduce(n, link, nbytes):
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bandwidth_bytes_per_s


def _two_level_all_reduce(g, m, intra, inter, nbytes):
    return (2 * ((g - 1) * intra.latency_s + (g - 1) / g * nbytes / intra.bandwidth_bytes_per_s)
            + _flat_all_reduce(m, inter, nbytes / g))


@pytest.mark.parametrize("nbytes", [4096, 64 * MB])
def test_ib_spanning_dp16_on_two_dgx_nodes_is_two_level_single_node_flat(nbytes):
    cluster = get_cluster("h100:2x8")
    intra, inter = cluster.intra_node_link, cluster.inter_node_link
    topo = MeshTopology(cluster, (16,), ("dp",))
    flat, two = _flat_all_reduce(16, inter, nbytes), _two_level_all_reduce(8, 2, intra, inter, nbytes)
    assert two < flat
    assert collective_algorithm("all_reduce", nbytes, topo, "dp") == "hierarchical"
    assert collective_time_s("all_reduce", nbytes, topo, "dp") == pytest.approx(two)
    for kind in ("all_gather", "reduce_scatter"):  # inter-node phase on nbytes/8, then NVLink (or the mirror)
        expected = flat_collective_time_s(kind, nbytes / 8, 2, inter) + flat_collective_time_s(kind, nbytes, 8, intra)
        assert collective_time_s(kind, nbytes, topo, "dp") == pytest.approx(expected)
        assert expected < flat_collective_time_s(kind, nbytes, 16, inter)
    assert hierarchical_byte_ranges("all_reduce", topo, "dp") == ((0.0, math.inf),)
    one_node = MeshTopology(get_cluster("h100:1x8"), (8,), ("dp",))
    assert collective_algorithm("all_reduce", nbytes, one_node, "dp") == "flat"
    assert hierarchical_byte_ranges("all_reduce", one_node, "dp") == ()
    assert collective_time_s("all_reduce", nbytes, one_node, "dp") == pytest.approx(
        _flat_all_reduce(8, one_node.cluster.intra_node_link, nbytes))


def test_slow_wide_intra_link_makes_flat_win_above_a_closed_form_size():
    # intra: low latency, low bandwidth (a PCIe-like link); inter: the reverse. Two-level saves latency steps,
    # flat saves bytes on the slow link: two-level wins below S* = (A_flat - A_two) / (B_two - B_flat).
    intra, inter = Link("pcie", 1e-6, 10e9), Link("ib", 20e-6, 50e9)
    topo = MeshTopology(Cluster(H100_SXM, 2, 8, intra, inter), (16,), ("dp",))
    a_flat, b_flat = 30 * 20e-6, 2 * 15 / 16 / 50e9
    a_two, b_two = 14 * 1e-6 + 2 * 20e-6, 2 * 7 / 8 / 10e9 + 1 / 8 / 50e9
    root = (a_flat - a_two) / (b_two - b_flat)
    ((lo, hi),) = hierarchical_byte_ranges("all_reduce", topo, "dp")
    assert lo == 0.0 and hi == pytest.approx(root, rel=1e-9) and hi < root  # the crossing itself is a tie: flat
    for nbytes, algorithm in ((root / 2, "hierarchical"), (2 * root, "flat")):
        assert collective_algorithm("all_reduce", nbytes, topo, "dp") == algorithm
        assert collective_time_s("all_reduce", nbytes, topo, "dp") == pytest.approx(
            min(_flat_all_reduce(16, inter, nbytes), _two_level_all_reduce(8, 2, intra, inter, nbytes)))


def test_ties_one_rank_per_node_and_other_kinds_stay_flat():
    free = Link("free", 0.0, 10e9)  # no latency, same bandwidth: both algorithms cost the same -> flat
    tie = MeshTopology(Cluster(H100_SXM, 2, 2, free, free), (4,), ("dp",))
    assert hierarchical_byte_ranges("all_reduce", tie, "dp") == ()
    assert collective_time_s("all_reduce", MB, tie, "dp") == pytest.approx(flat_collective_time_s("all_reduce", MB, 4, free))
    across = MeshTopology(dgx_h100(2, devices_per_node=2), (2, 2), ("dp", "tp"))  # dp: ranks {0, 2}, {1, 3}
    assert across.axis_info("dp").ranks_per_node == 1 and hierarchical_byte_ranges("all_reduce", across, "dp") == ()
    spanning = MeshTopology(dgx_h100(2), (16,), ("dp",))
    assert hierarchical_byte_ranges("all_to_all", spanning, "dp") == ()


def test_choice_follows_size_fits_piecewise():
    # A calibrated-style inter link whose all_reduce is slow for small messages: each piece solved exactly.
    inter = Link("inter", 5e-6, 20e9, size_fits={"all_reduce": ((64e3, 200e-6, 1e9), (1e12, 5e-6, 20e9))})
    intra = Link("intra", 2e-6, 100e9, size_fits={"reduce_scatter": ((1e6, 1e-6, 200e9), (1e12, 50e-6, 2e9))})
    topo = MeshTopology(Cluster(H100_SXM, 2, 4, intra, inter), (8,), ("dp",))
    ranges = hierarchical_byte_ranges("all_reduce", topo, "dp")
    assert ranges and all(lo < hi for lo, hi in ranges)
    for nbytes in [2.0 ** k for k in range(6, 36)] + [1e6, 1e6 + 1, 256e3, 256e3 + 1]:
        two = (flat_collective_time_s("reduce_scatter", nbytes, 4, intra)
               + flat_collective_time_s("all_reduce", nbytes / 4, 2, inter)
               + flat_collective_time_s("all_gather", nbytes, 4, intra))
        flat = flat_collective_time_s("all_reduce", nbytes, 8, inter)
        want = "hierarchical" if two < flat * (1 - 1e-9) else "flat"
        if abs(two - flat) > 1e-9 * flat:  # away from a crossing point
            assert collective_algorithm("all_reduce", nbytes, topo, "dp") == want, nbytes
        assert collective_time_s("all_reduce", nbytes, topo, "dp") == pytest.approx(min(two, flat), rel=1e-9)


def test_sub_groups_and_rule():
    assert split_group([0, 1, 2, 3], 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert split_group([0, 2], 2) == ([], [])      # one member per node
    assert split_group([0, 1], 2) == ([], [])      # one node
    assert split_group([1, 2, 3], 2) == ([], [])   # uneven: 1 + 2
    assert sub_groups([[0, 1, 4, 5], [2, 3, 6, 7]], 4) == [[0, 1], [4, 5], [0, 4], [1, 5], [2, 3], [6, 7], [2, 6], [3, 7]]
    rule = hierarchy_arg(2, {"all_reduce": [[4096, None]], "all_gather": [[0, 100]]})
    assert rule == (2, (("all_gather", ((0.0, 100.0),)), ("all_reduce", ((4096.0, math.inf),))))
    assert uses_hierarchy(rule, "all_reduce", 8192) and not uses_hierarchy(rule, "all_reduce", 4096)
    assert uses_hierarchy(rule, "all_gather", 100) and not uses_hierarchy(rule, "all_gather", 101)
    assert not uses_hierarchy(rule, "reduce_scatter", 99)
    assert not uses_hierarchy(None, "all_reduce", 8192)
    with pytest.raises(ValueError, match="0 <= lo < hi"):
        hierarchy_arg(2, {"all_reduce": [[10, 5]]})


def _plan(mesh, cluster, roles, traced=None):
    traced = traced or parallelizer.trace(*zoo.mlp(batch=16))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, mesh, cluster=cluster, axis_roles=roles)


def test_plan_records_and_shows_hierarchical_collectives():
    spanning = _plan({"dp": 16}, "h100:2x8", {"dp": "ddp"})
    assert spanning.hierarchical == {"dp": {"devices_per_node": 8, "ranks_per_node": 8, "num_nodes": 2, "bytes": {
        "all_reduce": [[0.0, None]], "all_gather": [[0.0, None]], "reduce_scatter": [[0.0, None]]}}}
    again = parallelizer.Plan.from_json(spanning.to_json())
    assert again.hierarchical == spanning.hierarchical and again.to_json() == spanning.to_json()
    syncs = len(spanning.steps("grad_all_reduce"))
    assert syncs > 0
    text = plan_text(spanning)
    assert f"dp         all_reduce      2 nodes x 8  (0 B, inf)           {syncs}" in text
    assert _plan({"dp": 8}, "h100:1x8", {"dp": "ddp"}).hierarchical == {}
    flat = _plan({"dp": 2, "tp": 2}, "h100:2x2", {"dp": "ddp", "tp": "tp"})  # dp spans nodes, one rank on each
    assert flat.hierarchical == {} and '"hierarchical"' not in flat.to_json()
    assert "(all)      flat" in plan_text(flat)


def test_rewriter_passes_the_rule_to_every_collective_on_the_axis_and_groups_are_listed():
    traced = parallelizer.trace(*zoo.mlp(batch=16))
    plan = _plan({"tp": 4}, "h100:2x2", {"tp": "tp"}, traced)
    spec = spec_from_plan(plan)
    rule = (2, (("all_gather", ((0.0, math.inf),)), ("all_reduce", ((0.0, math.inf),)),
                ("reduce_scatter", ((0.0, math.inf),))))
    assert spec.hierarchy == {"tp": rule}
    assert hierarchical_sub_groups(spec) == [[0, 1], [2, 3], [0, 2], [1, 3]]
    gm = rewrite(traced, spec, rank=2).graph_module
    steps = [n for n in gm.graph.nodes if n.meta.get("step") is not None and n.op == "call_function"
             and n.target is not torch.ops.aten.div.Scalar]
    assert steps and all(n.args[-1] == rule for n in steps), [n.format_node() for n in steps]
    assert any(n.meta["step"].kind == "all_reduce" for n in steps)  # the tensor-parallel Partial -> Replicate
    flat = rewrite(traced, spec_from_plan(_plan({"tp": 4}, "h100:1x4", {"tp": "tp"}, traced)), rank=2).graph_module
    assert all(n.args[-1] != rule for n in flat.graph.nodes if n.meta.get("step") is not None)
