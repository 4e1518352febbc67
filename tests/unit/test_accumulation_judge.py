"""The pipeline rehearsal's judge where its reference is not one device (round 24, r24f): the reference is eager
gradient accumulation over the plan's microbatches, and `judge._max_diff` reads a NaN on both sides as equal
(right when the reference is one device's own value). A microbatch that counts no item back-propagating
`loss * 0` through 0 / 0 made that accumulation NaN where one device's whole batch is finite: a plan with the
same NaN was called "numerics match" (measured on main with that backward restored on both sides: pp=2, every
gradient and parameter NaN, "match, worst ratio 0.00"). `whole_batch.nonfinite_accumulation` now finds such a
reference gradient, and `own_difference` no longer explains a NaN accumulation away as the model's own."""
import math

import torch

from parallelizer.runtime.whole_batch import labelled, nonfinite_accumulation, own_difference
from parallelizer.tracer.trace import trace


class MaskedMean(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))
        self.b = torch.nn.Parameter(torch.randn(()))

    def forward(self, x, mask):
        return (((x @ self.w) + self.b).pow(2) * mask).sum() / mask.sum()


def _accumulate(model, x, mask, zero_path: bool):
    """Gradient accumulation over 2 microbatches weighted n_j / N; a microbatch that counts nothing adds zeros
    (`zero_path`, as `pipeline_rehearsal._accumulated_reference`) or back-propagates `loss * 0` (the old path)."""
    n = [float(k.sum()) for k in mask.tensor_split(2)]
    for xj, kj, nj in zip(x.tensor_split(2), mask.tensor_split(2), n):
        loss = model(xj, kj) * (nj / sum(n))
        if not (zero_path and nj == 0):
            loss.backward()


def test_a_nan_accumulation_where_one_device_is_finite_is_no_match():
    torch.manual_seed(0)
    x, mask = torch.randn(4, 3), torch.tensor([0.0, 0.0, 1.0, 1.0])  # microbatch 0 counts nothing
    model = MaskedMean()
    traced = trace(model, (x[:2], mask[:2]))
    _accumulate(model, x, mask, zero_path=False)
    assert not torch.isfinite(model.w.grad).all()  # the old reference: NaN
    found = nonfinite_accumulation(model, traced, (x, mask), {})
    assert found is not None and math.isinf(found[2]) and found[1].startswith("w:"), found
    model.zero_grad(set_to_none=True)
    _accumulate(model, x, mask, zero_path=True)  # the reference as it is now: finite, equal to the whole batch's
    assert nonfinite_accumulation(model, traced, (x, mask), {}) is None
    whole = MaskedMean()
    whole.load_state_dict(model.state_dict())
    whole(x, mask).backward()
    torch.testing.assert_close(model.w.grad, whole.w.grad)


def test_a_nan_of_one_device_itself_stays_equal():
    """Every mask entry 0: one device's whole batch is 0 / 0 too, so a NaN on both sides is its value."""
    torch.manual_seed(0)
    x, mask = torch.randn(4, 3), torch.zeros(4)
    model = MaskedMean()
    traced = trace(model, (x[:2], mask[:2]))
    model(x, mask).backward()
    assert not torch.isfinite(model.w.grad).all()
    assert nonfinite_accumulation(model, traced, (x, mask), {}) is None


def test_a_nan_accumulated_loss_beside_a_finite_whole_batch_keeps_the_pair_judged():
    nan, finite = torch.tensor(float("nan"), dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64)
    assert own_difference(nan, finite, 2, torch.float32) == ""  # before: "not comparable", and NaN == NaN matched
    assert own_difference(finite + 1, finite, 2, torch.float32).startswith("not comparable")


def test_a_judged_whole_batch_pair_carries_no_not_judged_note():
    """`labelled` with no reason: the pair is judged, so no note (before: " (measured ...)", which the report
    printed as "whole-batch loss NOT JUDGED ( (measured |diff| ...))" beside a verdict that used it)."""
    assert labelled((1e-7, "step 0 (whole batch)", 0.01), "") == ""
    assert labelled((1e-7, "step 0 (whole batch)", 0.01), "not comparable: x").endswith("not judged)")
