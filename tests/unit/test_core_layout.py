"""MeshSpec validation, placement/layout string forms, local shapes and their typed errors."""
import pytest

from parallelizer.core import IndivisibleShardError, Layout, MeshSpec, Partial, Replicate, Shard, local_shape
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


def test_local_shape_nested_and_jax_style_error():
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    assert local_shape((8, 24), Layout.parse("S(0)S(1)"), mesh) == (4, 6)
    assert local_shape((8, 24), Layout.parse("S(0)S(0)"), mesh) == (1, 24)
    with pytest.raises(IndivisibleShardError) as err:
        local_shape((9, 24), Layout.parse("RS(1)"), MeshSpec(("dp", "tp"), (2, 5)))
    assert "dim 1 of shape (9, 24) is not divisible by mesh axis 'tp' of size 5" in str(err.value)
    assert err.value.axis == "tp" and err.value.dim == 1
    with pytest.raises(IndivisibleShardError, match="has 1 placements but mesh"):
        local_shape((8,), Layout.parse("R"), mesh)
