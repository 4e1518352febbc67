"""Which writes into a local shard pick a part along a sharded dim (`runtime.part_writes`, round 27, r27g).

Each case's answer is worked out by hand from one device: a write is the shard of one device's write exactly when it
names every index of each sharded dim times one set over the other dims; a key that only happens to cover this
rank's indices (`w[:3]` on 3 local rows) is still a positional part on one device. No ranks: the shards are plain
tensors with an `Owner` naming their layout (the ranks' test: tests/distributed/test_piece_updates.py)."""
import pytest
import torch

from parallelizer.core.layout import Layout
from parallelizer.core.mesh import MeshSpec
from parallelizer.runtime.grad_norm import Owner
from parallelizer.runtime.part_writes import _indexed_key, partial_along_sharded

ROWS = Owner(Layout.parse("S(0)"), MeshSpec(("dp",), (2,)), {}, None, "w")   # fsdp: rows sharded
COLS = Owner(Layout.parse("S(1)"), MeshSpec(("tp",), (2,)), {}, None, "w")   # tp: columns sharded
BOTH = Owner(Layout.parse("S(0)S(1)"), MeshSpec(("dp", "tp"), (2, 2)), {}, None, "w")
WHOLE = Owner(Layout.parse("R"), MeshSpec(("dp",), (2,)), {}, None, "w")      # ddp
SIZE_ONE = Owner(Layout.parse("S(0)"), MeshSpec(("dp",), (1,)), {}, None, "w")  # an axis of one rank shards nothing

W = torch.arange(12.0).view(3, 4)  # a (3, 4) local shard
MASK = W < 5


@pytest.mark.parametrize("key, rows, cols", [
    (1, True, False),                                   # a row: positional along dim 0 only
    ((slice(None), 1), False, True),                    # a column
    (slice(None), False, False),                        # the whole shard
    (Ellipsis, False, False),
    ([0, 2], True, False),                              # a list of rows
    (torch.tensor([1]), True, False),
    (slice(0, 3), True, False),                         # covers the 3 local rows, yet rows 0-2 of one device
    (-1, True, False),                                  # the last local row is not the last row
    ((torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])), True, True),  # a diagonal: every row, other columns
    ((slice(None), slice(None), None), False, False),   # a new axis only
    (MASK, False, False),                               # a boolean mask is not checked (module docstring)
])
def test_index_assignment_keys_are_partial_exactly_where_they_choose_along_the_sharded_dim(key, rows, cols):
    assert partial_along_sharded(W, W, ROWS, key) is rows
    assert partial_along_sharded(W, W, COLS, key) is cols
    assert partial_along_sharded(W, W, BOTH, key) is (rows or cols)
    assert partial_along_sharded(W, W, WHOLE, key) is False
    assert partial_along_sharded(W, W, SIZE_ONE, key) is False


def test_the_data_of_a_parameter_and_views_are_placed_by_their_memory():
    p = torch.nn.Parameter(torch.arange(12.0).view(3, 4))
    assert partial_along_sharded(p.data, p, ROWS, 1) is True          # `p.data[1] = 0`
    assert partial_along_sharded(p.data[1], p, ROWS) is True          # a row view: `p.data[1].copy_(v)`
    assert partial_along_sharded(p.data[1], p, COLS) is False
    assert partial_along_sharded(p.data[:, 1:], p, COLS) is True
    assert partial_along_sharded(p.data[:, 1:], p, ROWS) is False
    assert partial_along_sharded(p.data.view(-1), p, ROWS) is False   # the whole shard, flattened
    assert partial_along_sharded(p.data.view(-1), p, ROWS, slice(0, 5)) is True
    assert partial_along_sharded(p.data.t(), p, ROWS, (slice(None), 0)) is True  # row 0 through a transpose
    assert partial_along_sharded(p.data.t(), p, ROWS, 0) is False               # column 0: every row
    assert partial_along_sharded(p.data[:0], p, ROWS) is False        # writes nothing
    assert partial_along_sharded(p.data.diagonal(), p, ROWS) is True  # every local row, other columns at each
    assert partial_along_sharded(p.data.diagonal(), p, COLS) is True


@pytest.mark.parametrize("name, args, rows, cols", [
    ("index_fill_", (0, torch.tensor([1]), 0.0), True, False),
    ("index_fill_", (1, torch.tensor([0, 3]), 0.0), False, True),
    ("index_add_", (-1, torch.tensor([2]), torch.ones(3, 1)), False, True),
    ("index_put_", ((torch.tensor([0, 1]),), torch.tensor(0.0)), True, False),
    ("index_put_", ((None, torch.tensor([0])), torch.tensor(0.0)), False, True),
    # scatter writes where the index's VALUES point along `dim` and where its POSITIONS are along the other dims:
    # its (1, 4) index covers this shard's 4 columns, not one device's 8
    ("scatter_", (0, torch.tensor([[0, 1, 2, 0]]), 0.0), True, True),
    ("scatter_", (1, torch.tensor([[0], [1], [2]]), 0.0), True, True),
    ("put_", (torch.tensor([5]), torch.tensor([0.0])), True, True),
    ("fill_diagonal_", (1.0,), True, True),
])
def test_indexed_writes_name_the_positions_their_index_writes(name, args, rows, cols):
    key = _indexed_key(name, W, args, {})
    assert partial_along_sharded(W, W, ROWS, key) is rows
    assert partial_along_sharded(W, W, COLS, key) is cols


def test_writes_into_a_registered_shard_are_refused_or_run_as_on_one_device():
    """Through the installed Tensor methods, on a parameter registered as a ParallelModule registers its shards (S(0)
    over dp=2): positional row writes raise, naming the parameter; the augmented assignment says the part already
    changed; column, value-mask and whole writes run and give what the same writes give a plain tensor. Still refused
    after `p.data = t` gave the parameter new memory (`grad_norm._memory_spans` is rebuilt)."""
    from parallelizer.errors import UnsupportedOpError
    from parallelizer.runtime import grad_norm, part_writes

    part_writes.install()
    p = torch.nn.Parameter(torch.arange(12.0).view(3, 4) - 5)
    grad_norm.register([("w", p, Layout.parse("S(0)"))], MeshSpec(("dp",), (2,)), {"dp": [0, 1]})
    with pytest.raises(UnsupportedOpError, match=r"Tensor.__setitem__ .* on part of 'w'"):
        p.data[1] = 0.0
    with pytest.raises(UnsupportedOpError, match="augmented assignment"):
        p.data[:2] *= 0.5
    with pytest.raises(UnsupportedOpError, match=r"Tensor.index_fill_ on part of 'w'"):
        p.data.index_fill_(0, torch.tensor([2]), 0.0)
    with pytest.raises(UnsupportedOpError, match=r"Tensor.copy_ on part of 'w'"):
        p.data[2:].copy_(torch.ones(1, 4))
    expected = torch.arange(12.0).view(3, 4) - 5
    expected[:2] *= 0.5  # the augmented assignment changed the part before it was refused
    for t in (p.data, expected):  # allowed: the same writes on the shard and on a plain tensor
        t[:, 1] = 7.0
        t[t < 0] = 0.0
    torch.testing.assert_close(p.data, expected, rtol=0, atol=0)
    p.data = torch.zeros(3, 4)
    with pytest.raises(UnsupportedOpError, match="on part of 'w'"):
        p.data[0] = 1.0
    p.data[:] = 2.0
    assert torch.equal(p.data, torch.full((3, 4), 2.0))
