"""runtime.shard_origin: the piece of a tensor a rank holds, and the refusal of a state dict of other pieces."""
import pytest

from parallelizer.core.layout import Layout
from parallelizer.core.mesh import MeshSpec
from parallelizer.errors import StateDictError
from parallelizer.runtime.shard_origin import check, piece

DP2 = MeshSpec(("dp",), (2,))
DPTP = MeshSpec(("dp", "tp"), (2, 2))


def test_whole_tensors_are_the_same_piece_on_every_rank_and_mesh():
    assert piece((10, 6), Layout.parse("R"), DP2, (0,)) == piece((10, 6), Layout.parse("R"), DP2, (1,)) \
        == piece((10, 6), Layout.parse("RR"), DPTP, (1, 1)) == ((10, 6), (0, 0), (10, 6))


def test_uneven_shards_follow_torch_chunk():
    assert piece((10, 6), Layout.parse("S(0)S(0)"), DPTP, (1, 1)) == ((10, 6), (8, 0), (2, 6))
    assert piece((5,), Layout.parse("S(0)"), DP2, (1,)) == ((5,), (3,), (2,))


def test_another_ranks_or_plans_piece_is_refused_with_the_remedies():
    mine = {"w": piece((10, 6), Layout.parse("S(0)"), DP2, (1,))}
    check("x", mine, {"w": piece((10, 6), Layout.parse("S(0)"), DP2, (1,))}, "")  # its own: fine
    check("x", mine, {"other": piece((4,), Layout.parse("S(0)"), DP2, (0,))}, "")  # names not held: not compared
    for saved in (piece((10, 6), Layout.parse("S(0)"), DP2, (0,)),  # rank 0's rows
                  piece((10, 6), Layout.parse("S(1)"), DP2, (1,))):  # another plan, same rank
        with pytest.raises(StateDictError, match=r"'w': saved \[.*\] of \(10, 6\), but this rank holds \[5:10, 0:6\]"
                                                 r"(.|\n)*parallelizer.checkpoint.save"):
            check("AdamW.load_state_dict", mine, {"w": saved}, "")
