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
from parallelizer.runtime.part_writes import _broadcast_mask_key, _indexed_key, partial_along_sharded

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


# Round 27 (r27f, merged by r27fg): the members r27f added (its tests/unit/test_piece_access.py, on this module's one
# rule): boolean indices of fewer dims, broadcast masks, tril_ / triu_, writes into a gradient, local_writes(), and
# norms of a piece (`runtime.piece_norms`). A (3, 3) or (3, 6) local piece of a (6, 6) parameter.
def _owner(layout: str) -> Owner:
    return Owner(Layout.parse(layout), MeshSpec(("dp",), (2,)), {"dp": [0, 1]}, None, "w", (6, 6), (1,))


@pytest.mark.parametrize("key, layout, chosen", [
    (1, "S(0)", True),  # a row of a row shard: another row on each rank
    (1, "S(1)", False),  # a row of a column shard keeps its columns whole
    ((slice(None), 2), "S(1)", True),
    ((slice(None), 2), "S(0)", False),
    ((torch.arange(3), torch.arange(3)), "S(0)", True),  # every row index, yet each rank's own diagonal
    ((torch.arange(3), torch.arange(3)), "S(1)", True),
    (..., "S(0)", False),
    ((slice(None), slice(0, 2)), "S(0)", False),
    (torch.tensor([True, False, True]), "S(0)", True),  # rows by a mask along the sharded dim: positional
    (torch.tensor([True, False, True]), "S(1)", False),
    ((slice(None), torch.tensor([True, False, True])), "S(1)", True),  # columns by a mask
    (torch.tensor([True, True, True]), "S(0)", True),  # all 3 local rows: rows 0-2 of one device's 6
    (1, "R", False),  # replicated: every position is one device's
])
def test_a_part_is_chosen_along_a_sharded_dim_unless_it_is_whole_fibres(key, layout, chosen):
    piece = torch.zeros(3, 3)
    assert partial_along_sharded(piece, piece, _owner(layout), key) is chosen


def test_a_view_is_placed_by_its_memory_offsets():
    """`piece.diagonal()` of a square row shard keeps every row index (r26b's per-dim test passed it) but is no union
    of whole column fibres: chosen. A row view of a column shard is whole along the columns: not chosen."""
    piece = torch.zeros(3, 3)
    assert partial_along_sharded(piece.diagonal(), piece, _owner("S(0)"))
    assert not partial_along_sharded(piece[1], piece, _owner("S(1)"))
    assert partial_along_sharded(piece[1], piece, _owner("S(0)"))
    assert not partial_along_sharded(piece.view(-1)[3:6], piece, _owner("S(1)"))


@pytest.mark.parametrize("name, args, rows, cols", [
    ("tril_", (), True, True),  # zeroes the upper triangle of the LOCAL piece
    ("triu_", (1,), True, True),
    ("tril_", (5,), False, False),  # zeroes nothing on a (3, 4) piece
])
def test_triangles_name_the_positions_they_zero(name, args, rows, cols):
    key = _indexed_key(name, W, args, {})
    assert partial_along_sharded(W, W, ROWS, key) is rows
    assert partial_along_sharded(W, W, COLS, key) is cols


@pytest.mark.parametrize("mask, rows, cols", [
    (torch.tensor([[True], [False], [False]]), True, False),  # (3, 1): row 0, broadcast along the columns
    (torch.tensor([False, True, False, False]), False, True),  # (4,): column 1, broadcast along the rows
    (torch.tensor([[False, False, False, True]]), False, True),
    (torch.tensor(True), False, False),  # a scalar mask: the whole shard
    (MASK, None, None),  # the shard's own shape: chosen by value, not checked (no key)
])
def test_a_broadcast_mask_chooses_by_position_along_the_dims_it_varies_on(mask, rows, cols):
    key = _broadcast_mask_key(W, mask)
    if rows is None:
        assert key is None
        return
    assert partial_along_sharded(W, W, ROWS, key) is rows
    assert partial_along_sharded(W, W, COLS, key) is cols


@pytest.fixture
def registered():
    """A (3, 6) row shard `w` (stored S(0) over dp=2) with a gradient, and a replicated (4,) `b`, registered as a
    ParallelModule registers its parameters; the checks installed as a ParallelModule installs them."""
    from parallelizer.runtime import grad_norm, init_check

    w = torch.nn.Parameter(torch.randn(3, 6))
    b = torch.nn.Parameter(torch.randn(4))
    w.grad, b.grad = torch.randn(3, 6), torch.randn(4)
    grad_norm.register([("w", w, Layout.parse("S(0)")), ("b", b, Layout.parse("R"))], MeshSpec(("dp",), (2,)),
                       {"dp": [0, 1]}, shapes={"w": (6, 6), "b": (4,)}, coords=(1,))
    init_check.install()
    return w, b


def test_norms_over_a_sharded_dim_of_a_piece_or_its_gradient_are_refused(registered):
    import torch.nn.functional as F
    from parallelizer.errors import UnsupportedOpError

    w, b = registered
    for call in (lambda: w.norm(), lambda: w.data.norm(), lambda: torch.linalg.vector_norm(w.detach()),
                 lambda: w.grad.norm(), lambda: torch.linalg.matrix_norm(w), lambda: torch.norm(w, dim=0),
                 lambda: F.normalize(w.detach(), dim=0), lambda: w.data[0].norm(), lambda: torch.linalg.norm(w)):
        with pytest.raises(UnsupportedOpError, match=r"'w'.*a local shard.*get_total_norm"):
            call()
    with pytest.raises(UnsupportedOpError, match="of the gradient of 'w'"):
        w.grad.norm()
    torch.testing.assert_close(w.norm(dim=1), torch.sqrt((w.detach() ** 2).sum(1)))  # rows are whole: runs
    torch.testing.assert_close(F.normalize(w.grad, dim=1).norm(dim=1), torch.ones(3))
    torch.testing.assert_close(b.norm(), torch.sqrt((b.detach() ** 2).sum()))  # replicated: one device's
    x = torch.randn(5)
    torch.testing.assert_close(x.norm(), x.pow(2).sum().sqrt())  # other tensors: torch's own
    # renorm (r27fg): each slice along `dim` by its norm over the other dims
    for call in (lambda: w.data.renorm_(2, 1, 1.0), lambda: torch.renorm(w.grad, 2, 1, 1.0),
                 lambda: w.renorm(p=2, dim=1, maxnorm=1.0), lambda: w.data[:2].renorm_(2, 0, 1.0)):
        with pytest.raises(UnsupportedOpError, match=r"renorm_? of .*'w'.*a local shard.*get_total_norm"):
            call()
    rows = w.detach() / w.detach().pow(2).sum(1, keepdim=True).sqrt().clamp(min=1.0)  # renorm's formula, by hand
    w.data.renorm_(2, 0, 1.0)  # each row over its whole columns: one device's rows
    torch.testing.assert_close(w.detach(), rows, rtol=1e-5, atol=1e-6)


def test_positional_writes_into_a_piece_or_its_gradient_are_refused_along_a_sharded_dim(registered):
    """r27f's cases on part_writes' rule. `w.data.scatter_(1, zeros(3, 1), 2.0)` ran on r27f (column 0 of every local
    row) and is refused here: its (3, 1) index names rows 0-2 only on one device's (6, 6), every row on the shards."""
    from parallelizer.errors import UnsupportedOpError
    from parallelizer.runtime.part_writes import local_writes

    w, b = registered
    for write in (lambda: w.data.__setitem__(1, 0.0), lambda: w.grad.__setitem__(slice(0, 2), 0.0),
                  lambda: w.data.index_fill_(0, torch.tensor([1]), 0.0),
                  lambda: w.data.masked_fill_(torch.tensor([[True], [False], [False]]), 0.0),
                  lambda: w.data.index_put_((torch.tensor([0]), torch.tensor([1])), torch.tensor(0.0)),
                  lambda: w.data.scatter_(0, torch.tensor([[1]]), 0.0),
                  lambda: w.data.put_(torch.tensor([2]), torch.tensor(0.0)),
                  lambda: w.data.fill_diagonal_(0.0), lambda: w.data.tril_(), lambda: w.grad.triu_(1),
                  lambda: w.grad[1].zero_(), lambda: w.grad.masked_scatter_(torch.tensor([[True], [False], [False]]),
                                                                            torch.zeros(6)),
                  lambda: w.data.scatter_(1, torch.zeros(3, 1, dtype=torch.long), 2.0)):
        before = w.detach().clone(), w.grad.clone()
        with pytest.raises(UnsupportedOpError, match=r"on part of .*'w', a local shard .* of \(6, 6\)"):
            write()
        assert torch.equal(w.detach(), before[0]) and torch.equal(w.grad, before[1])  # nothing written
    with pytest.raises(UnsupportedOpError, match="of the gradient of 'w'"):
        w.grad[0] = 1.0
    with torch.no_grad():
        w[:, 2] = 0.5  # a column of a row shard: whole along the rows
        w.data[w.data.abs() < 0.1] = 0.0  # by value
        w.data.masked_fill_(torch.tensor([[False] * 5 + [True]]), 1.0)  # a broadcast column mask
        b.data[1] = 3.0  # replicated
    assert (w[:, 2] == 0.5).all() and (w[:, 5] == 1.0).all() and b[1] == 3.0
    with local_writes():  # this rank's piece by local position, on purpose
        w.grad[0, 0] = float("inf")
        w.grad[1].zero_()
    assert w.grad[0, 0] == float("inf") and (w.grad[1] == 0).all()
