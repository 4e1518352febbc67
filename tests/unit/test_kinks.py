"""`runtime.kinks._crossed`, op by op: an element crossed a kink by rounding when the plan's run and one device's
take different sides of the op's kink while the op's continuous value agrees within float32's tolerance (a tie,
or a value at the kink); another value on the other side is not a crossing (a wrong program is not excused)."""
import pytest
import torch

from parallelizer.runtime.kinks import _crossed, kink_op

F32 = torch.float32
TINY = 2.0 ** -23  # ~1.19e-07: float32's rounding at 1


def _pair(op, fn, plan_args, ref_args):
    return _crossed(op, (plan_args, fn(*plan_args)), (ref_args, fn(*ref_args)), F32)


def test_relu_threshold_abs_and_clamp_sides():
    plan, ref = torch.tensor([0.0, 1.0, -2.0, 3.0]), torch.tensor([TINY, 1.0, -2.0, -3.0])
    assert _pair("relu", torch.relu, (plan,), (ref,)).tolist() == [True, False, False, False]  # -3 vs 3: a value
    assert _pair("threshold", lambda x, t, v: torch.threshold(x, t, v), (plan + 0.5, 0.5, 0.5),
                 (ref + 0.5, 0.5, 0.5)).tolist() == [True, False, False, False]
    # a threshold whose replacement value jumps (0 for inputs <= 0.5), like a `where` on a comparison: the
    # inputs agree, so it is the same crossing by rounding although the outputs differ by 0.5
    assert _pair("threshold", lambda x, t, v: torch.threshold(x, t, v), (plan + 0.5, 0.5, 0.0),
                 (ref + 0.5, 0.5, 0.0)).tolist() == [True, False, False, False]
    assert _pair("abs", torch.abs, (plan - TINY / 4,), (ref,)).tolist() == [True, False, False, False]
    # clamp's gradient passes on [lo, hi] inclusive: 0 and 1e-7 are on the same side of lo = 0
    assert not _pair("clamp", lambda x, lo, hi: x.clamp(lo, hi), (plan, 0.0, 0.5), (ref, 0.0, 0.5)).any()
    below = torch.tensor([-TINY])
    assert _pair("clamp", lambda x, lo, hi: x.clamp(lo, hi), (below, 0.0, 0.5), (torch.tensor([0.0]), 0.0, 0.5)).all()


def test_ties_of_maximum_comparisons_and_selections():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([1.0 + TINY, 1.0])
    assert _pair("maximum", torch.maximum, (a, b), (torch.tensor([1.0 + 2 * TINY, 2.0]), b)).tolist() == [True, False]
    x = torch.tensor([TINY, 5.0])
    assert _pair("gt", torch.gt, (torch.tensor([0.0, 5.0]), 0.0), (x, 0.0)).tolist() == [True, False]
    v, w = torch.tensor([[1.0, 1.0 + TINY, 0.0]]), torch.tensor([[1.0 + 2 * TINY, 1.0, 0.0]])
    assert _pair("argmax", lambda t, d: t.argmax(d), (v, 1), (w, 1)).all()
    assert _pair("max", lambda t, d: t.max(d), (v, 1), (w, 1)).all()
    assert _pair("sort", lambda t, d: t.sort(d), (v, 1), (w, 1)).any()
    far = torch.tensor([[1.0, 3.0, 0.0]])  # another maximum, not a tie: not excused
    assert not _pair("max", lambda t, d: t.max(d), (far, 1), (w, 1)).any()
    swapped = torch.tensor([[1.0, 0.0, 1.0]])  # the same maximum at another place: another input, not a tie
    assert not _pair("max", lambda t, d: t.max(d), (swapped, 1), (torch.tensor([[1.0, 1.0, 0.0]]), 1)).any()
    img, img2 = torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2)
    img[0, 0, 0, 1], img2[0, 0, 1, 0] = 1.0, 1.0 + TINY  # the plan's maximum at (0, 1), one device's at (1, 0)
    img[0, 0, 1, 0], img2[0, 0, 0, 1] = 1.0 - TINY, 1.0  # the other candidate within rounding in both runs: a tie
    pool = lambda t, k: torch.ops.aten.max_pool2d_with_indices(t, k)  # noqa: E731
    assert _pair("max_pool2d_with_indices", pool, (img, [2, 2]), (img2, [2, 2])).all()


def test_kink_ops_are_recognised_by_their_aten_target():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    nodes = {name: graph.call_function(target, (x,) + extra) for name, target, extra in (
        ("relu", torch.ops.aten.relu.default, ()), ("max_dim", torch.ops.aten.max.dim, (1,)),
        ("max_all", torch.ops.aten.max.default, ()), ("gelu", torch.ops.aten.gelu.default, ()),
        ("pool", torch.ops.aten.max_pool2d_with_indices.default, ([2, 2],)))}
    assert {k: kink_op(n) for k, n in nodes.items()} == {"relu": "relu", "max_dim": "max", "max_all": None,
                                                          "gelu": None, "pool": "max_pool2d_with_indices"}
