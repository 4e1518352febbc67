"""MeshSpec validation, placement/layout string forms, local shapes and their typed errors."""
import pytest
import torch

from parallelizer.core import IndivisibleShardError, Layout, MeshSpec, Partial, Replicate, Shard, local_shape
from parallelizer.core.layout import chunk_range, divides_evenly, local_region
from parallelizer.core.layout import parse_placement, placement_str


def test_mesh_validates_and_names_what_was_declared():
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    assert mesh.world_size == 8 and mesh.size("tp") == 4 and str(mesh) == "(dp=2, tp=4)"
    with pytest.raises(ValueError, match=r"axis_names=\('dp',\) and shape=\(2, 4\)"):
        MeshSpec(("dp",), (2, 4))
    with pytest.raises(ValueError, match="unique"):
        MeshSpec(("dp", "dp"), (2, 2))
    with pytest.raises(ValueError, match="int >= 1"):
        MeshSpec(("dp",), (0,))
    with pytest.raises(ValueError, match="unknown mesh axis 'pp'"):
        mesh.size("pp")


@pytest.mark.parametrize("p, text", [(Shard(0), "S(0)"), (Replicate(), "R"), (Partial("sum"), "P"),
                                     (Partial("avg"), "P(avg)")])
def test_placement_string_forms_round_trip(p, text):
    assert placement_str(p) == text and parse_placement(text) == p


def test_layout_string_round_trip_and_hash():
    layout = Layout((Shard(0), Replicate(), Partial("avg")))
    assert str(layout) == "S(0)RP(avg)"
    assert Layout.parse("S(0)RP(avg)") == layout and hash(Layout.parse(str(layout))) == hash(layout)
    with pytest.raises(ValueError, match="cannot parse layout"):
        Layout.parse("S0R")


def test_local_shape_nested_even_and_uneven():
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    assert local_shape((8, 24), Layout.parse("S(0)S(1)"), mesh) == (4, 6)
    assert local_shape((8, 24), Layout.parse("S(0)S(0)"), mesh) == (1, 24)
    # torch.chunk's split: 24 over 5 -> 5, 5, 5, 5, 4; 9 over 2 -> 5, 4
    five = MeshSpec(("dp", "tp"), (2, 5))
    assert [local_shape((9, 24), Layout.parse("S(0)S(1)"), five, (i, j)) for i, j in ((0, 0), (1, 4))] == [(5, 5), (4, 4)]
    # nested uneven: 10 rows over dp=2 (5, 5), each over tp=2 (3, 2): rows 0-2, 3-4, 5-7, 8-9
    m22 = MeshSpec(("dp", "tp"), (2, 2))
    regions = [local_region((10, 3), Layout.parse("S(0)S(0)"), m22, c) for c in ((0, 0), (0, 1), (1, 0), (1, 1))]
    assert [(s[0], n[0]) for s, n in regions] == [(0, 3), (3, 2), (5, 3), (8, 2)]
    # empty shards: 4 elements over 8 ranks
    eight = MeshSpec(("dp",), (8,))
    assert [chunk_range(4, 8, i) for i in (0, 3, 4, 7)] == [(0, 1), (3, 1), (4, 0), (4, 0)]
    assert local_shape((4, 2), Layout.parse("S(0)"), eight, (6,)) == (0, 2)
    assert local_shape((4, 2), Layout.parse("S(0)"), eight) == (1, 2)  # no coords: the largest shard
    # torch.chunk itself returns fewer chunks here; the regions agree with the chunks it does return
    full = torch.arange(10)
    assert [full[s:s + n].tolist() for s, n in (chunk_range(10, 4, i) for i in range(4))] == \
        [c.tolist() for c in full.chunk(4)]
    assert divides_evenly((8, 24), Layout.parse("S(0)S(1)"), mesh) and not divides_evenly((9, 24), Layout.parse("S(0)R"), five)


def test_layout_that_does_not_fit_is_a_typed_error():
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    with pytest.raises(IndivisibleShardError, match="has 1 placements but mesh"):
        local_shape((8,), Layout.parse("R"), mesh)
    with pytest.raises(IndivisibleShardError, match="shards dim 2 over mesh axis 'tp', but shape"):
        local_shape((8, 3), Layout.parse("RS(2)"), mesh)
