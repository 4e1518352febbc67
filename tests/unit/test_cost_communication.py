"""cost_model.communication: DTensor-style relations and alpha-beta closed forms."""

import math

import pytest

from cost_model import (COLLECTIVE_KINDS, Cluster, Link, MeshTopology, collective_time_s, dgx_a100, dgx_h100, dgx_h200,
                        flat_collective_time_s)
from cost_model.hardware import H100_SXM

MB = 1 << 20


@pytest.fixture
def topo():
    # 2 DGX H100 nodes; mesh (pp=1, dp=2, tp=8): tp inside a node, dp across nodes.
    return MeshTopology(dgx_h100(2), (1, 2, 8), ("pp", "dp", "tp"))


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_noop_collectives_cost_zero(topo, kind):
    assert collective_time_s(kind, 64 * MB, topo, "pp") == 0.0  # size-1 axis
    assert collective_time_s(kind, 0, topo, ("dp", "tp")) == 0.0  # no bytes


@pytest.mark.parametrize("axes", ["tp", "dp", ("dp", "tp")])
@pytest.mark.parametrize("nbytes", [1024, 64 * MB])
def test_all_reduce_not_dearer_than_reduce_scatter_plus_all_gather(topo, axes, nbytes):
    all_reduce = collective_time_s("all_reduce", nbytes, topo, axes)
    split = collective_time_s("reduce_scatter", nbytes, topo, axes) + collective_time_s("all_gather", nbytes, topo, axes)
    assert all_reduce <= split * (1 + 1e-12)


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_cost_grows_with_bytes_and_group_size(kind):
    small = MeshTopology(dgx_h100(1), (4, 2), ("a", "b"))
    times = [collective_time_s(kind, n, small, "a") for n in (MB, 8 * MB, 64 * MB)]
    assert times == sorted(times) and times[0] < times[-1]
    if kind != "send_recv":  # a point-to-point hop does not depend on group size
        assert collective_time_s(kind, 8 * MB, small, "b") < collective_time_s(kind, 8 * MB, small, "a")


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_cross_node_axis_costs_more_than_intra_node(kind):
    inner = MeshTopology(dgx_h100(2), (2, 8), ("dp", "tp"))  # tp: 8 ranks in one node
    outer = MeshTopology(dgx_h100(8), (8, 8), ("dp", "tp"))  # dp: 8 ranks on 8 nodes
    assert collective_time_s(kind, 16 * MB, outer, "dp") > collective_time_s(kind, 16 * MB, inner, "tp")


def test_flat_ring_all_reduce_closed_form():
    link = Link("l", latency_s=5e-6, bandwidth_bytes_per_s=100e9)
    topo = MeshTopology(Cluster(H100_SXM, 1, 8, link, link), (8,), ("tp",))
    n, nbytes = 8, 32 * MB
    expected = 2 * (n - 1) * 5e-6 + 2 * (n - 1) / n * nbytes / 100e9
    assert collective_time_s("all_reduce", nbytes, topo, "tp") == pytest.approx(expected)
    assert collective_time_s("all_gather", nbytes, topo, "tp") == pytest.approx((n - 1) * 5e-6 + 7 / 8 * nbytes / 100e9)


def test_two_level_all_reduce_closed_form():
    cluster = dgx_h100(4)
    topo = MeshTopology(cluster, (32,), ("dp",))
    intra, inter = cluster.intra_node_link, cluster.inter_node_link
    g, m, nbytes = 8, 4, 256 * MB
    expected = (2 * ((g - 1) * intra.latency_s + (g - 1) / g * nbytes / intra.bandwidth_bytes_per_s)
                + 2 * (m - 1) * inter.latency_s + 2 * (m - 1) / m * (nbytes / g) / inter.bandwidth_bytes_per_s)
    assert collective_time_s("all_reduce", nbytes, topo, "dp") == pytest.approx(expected)


def test_tree_wins_small_messages_ring_wins_large():
    topo = MeshTopology(dgx_h100(1), (8,), ("tp",))
    assert collective_time_s("all_reduce", 1024, topo, "tp", "tree") < collective_time_s("all_reduce", 1024, topo, "tp")
    big = 1 << 30
    assert collective_time_s("all_reduce", big, topo, "tp", "ring") < collective_time_s("all_reduce", big, topo, "tp", "tree")
    link = topo.cluster.intra_node_link
    assert flat_collective_time_s("all_reduce", 1024, 8, link, "tree") == pytest.approx(
        2 * math.log2(8) * link.latency_s + 2 * 1024 / link.bandwidth_bytes_per_s)
    # Collectives NCCL implements only as rings are priced identically for either algorithm.
    assert collective_time_s("all_gather", big, topo, "tp", "tree") == collective_time_s("all_gather", big, topo, "tp")


def test_bad_arguments_raise_with_valid_values(topo):
    with pytest.raises(ValueError, match="unknown collective kind 'allreduce'"):
        collective_time_s("allreduce", 1, topo, "dp")
    with pytest.raises(ValueError, match="use one of \\('ring', 'tree'\\)"):
        collective_time_s("all_reduce", 1, topo, "dp", algorithm="bcube")
    with pytest.raises(ValueError, match="nbytes"):
        collective_time_s("all_reduce", -1, topo, "dp")
    with pytest.raises(ValueError, match="unknown mesh axis 'sp'"):
        collective_time_s("all_reduce", 1, topo, ("dp", "sp"))


# A calibrated-gloo-like link: joint fit plus per-kind overrides (all_gather slower than the ring ratio).
GLOO_X4 = Link("gloo_x4", 168e-6, 1.06e9, per_kind={"all_reduce": (150e-6, 1.3e9), "all_gather": (200e-6, 0.55e9),
                                                    "reduce_scatter": (200e-6, 0.55e9)})


def test_presets_have_no_per_kind_overrides():
    for cluster in (dgx_h100(2), dgx_a100(2), dgx_h200(1)):
        assert cluster.intra_node_link.per_kind == {} and cluster.inter_node_link.per_kind == {}


def test_flat_per_kind_override_replaces_alpha_beta_for_that_kind_only():
    topo = MeshTopology(Cluster(H100_SXM, 1, 4, GLOO_X4, GLOO_X4), (4,), ("dp",))
    n, nbytes = 4, 8 * MB
    # Override: its own alpha/beta, the ring step/byte factors unchanged.
    assert collective_time_s("all_gather", nbytes, topo, "dp") == pytest.approx(3 * 200e-6 + 3 / 4 * nbytes / 0.55e9)
    assert collective_time_s("all_reduce", nbytes, topo, "dp") == pytest.approx(6 * 150e-6 + 6 / 4 * nbytes / 1.3e9)
    # No override for broadcast: the link's own (joint) alpha/beta.
    assert collective_time_s("broadcast", nbytes, topo, "dp") == pytest.approx(3 * 168e-6 + nbytes / 1.06e9)
    assert flat_collective_time_s("all_gather", nbytes, n, GLOO_X4) == collective_time_s("all_gather", nbytes, topo, "dp")
    assert GLOO_X4.alpha_beta("all_to_all") == (168e-6, 1.06e9)


def test_two_level_paths_use_each_phases_override():
    intra = Link("intra", 2e-6, 300e9, per_kind={"reduce_scatter": (3e-6, 200e9), "all_gather": (4e-6, 150e9),
                                                 "all_to_all": (5e-6, 100e9)})
    inter = Link("inter", 4e-6, 25e9, per_kind={"all_reduce": (6e-6, 20e9), "all_gather": (7e-6, 10e9)})
    topo = MeshTopology(Cluster(H100_SXM, 4, 8, intra, inter), (32,), ("dp",))
    g, m, n, nbytes = 8, 4, 32, 256 * MB
    expected_all_reduce = ((g - 1) * 3e-6 + (g - 1) / g * nbytes / 200e9
                           + 2 * (m - 1) * 6e-6 + 2 * (m - 1) / m * (nbytes / g) / 20e9
                           + (g - 1) * 4e-6 + (g - 1) / g * nbytes / 150e9)
    assert collective_time_s("all_reduce", nbytes, topo, "dp") == pytest.approx(expected_all_reduce)
    expected_all_gather = ((m - 1) * 7e-6 + (m - 1) / m * (nbytes / g) / 10e9
                           + (g - 1) * 4e-6 + (g - 1) / g * nbytes / 150e9)
    assert collective_time_s("all_gather", nbytes, topo, "dp") == pytest.approx(expected_all_gather)
    expected_all_to_all = (g - 1) * (5e-6 + nbytes / n / 100e9) + (n - g) * (4e-6 + nbytes / n / 25e9)
    assert collective_time_s("all_to_all", nbytes, topo, "dp") == pytest.approx(expected_all_to_all)
    # send_recv / broadcast have no override here: the links' own alpha/beta.
    assert collective_time_s("send_recv", nbytes, topo, "dp") == pytest.approx(4e-6 + nbytes / 25e9)


@pytest.mark.parametrize("nbytes", [1024, 64 * MB])
def test_relations_hold_with_calibrated_style_overrides(nbytes):
    topo = MeshTopology(Cluster(H100_SXM, 1, 8, GLOO_X4, GLOO_X4), (4, 2), ("a", "b"))
    for axes in ("a", "b", ("a", "b")):
        all_reduce = collective_time_s("all_reduce", nbytes, topo, axes)
        split = collective_time_s("reduce_scatter", nbytes, topo, axes) + collective_time_s("all_gather", nbytes, topo, axes)
        assert all_reduce <= split
    for kind in COLLECTIVE_KINDS:
        times = [collective_time_s(kind, b, topo, "a") for b in (MB, 8 * MB, 64 * MB)]
        assert times == sorted(times) and times[0] < times[-1]
        if kind != "send_recv":
            assert collective_time_s(kind, 8 * MB, topo, "b") < collective_time_s(kind, 8 * MB, topo, "a")
        assert collective_time_s(kind, 8 * MB, topo, ("a", "b")) >= collective_time_s(kind, 8 * MB, topo, "a")


@pytest.mark.parametrize("per_kind,match", [
    ({"allgather": (1e-6, 1e9)}, "per_kind key 'allgather': unknown collective kind"),
    ({"all_gather": (1e-6, 0.0)}, r"per_kind\['all_gather'\]\.bandwidth_bytes_per_s=0.0"),
    ({"all_gather": (-1e-6, 1e9)}, r"per_kind\['all_gather'\]\.latency_s"),
    ({"all_gather": 1e9}, "must be a pair"),
    ([("all_gather", (1e-6, 1e9))], "must be a mapping"),
])
def test_link_per_kind_validation_names_kind_and_field(per_kind, match):
    with pytest.raises(ValueError, match=match):
        Link("x", 1e-6, 1e9, per_kind=per_kind)


def test_link_with_overrides_is_a_frozen_hashable_value():
    same = Link("gloo_x4", 168e-6, 1.06e9, per_kind={k: list(v) for k, v in reversed(GLOO_X4.per_kind.items())})
    assert same == GLOO_X4 and hash(same) == hash(GLOO_X4)
    assert list(GLOO_X4.per_kind) == sorted(GLOO_X4.per_kind)
    with pytest.raises(TypeError):
        GLOO_X4.per_kind["broadcast"] = (1e-6, 1e9)  # type: ignore[index]
    assert Link("x", 1e-6, 1e9) != Link("x", 1e-6, 1e9, per_kind={"all_gather": (1e-6, 1e9)})
