"""tracer.call_defaults: the forward's defaults the traced call left out, and calls that pass them explicitly."""
import pytest
import torch
from torch import nn

from parallelizer.tracer.call_defaults import drop_passed_defaults, fill_omitted_defaults, untraced_defaults


class _M(nn.Module):
    def forward(self, x, mask=None, scale=1.0, table=torch.zeros(2), *rest, flag=False, **extra):
        return x


def test_only_plain_defaults_the_call_left_out_are_recorded():
    positional, defaults, passed = untraced_defaults(_M(), (torch.ones(1),), {"scale": 2.0})
    assert positional == ("x", "mask", "scale", "table")
    assert defaults == {"mask": None, "flag": False}  # scale was passed; a tensor default is not assumed unchanged


def test_defaults_passed_with_their_value_are_dropped_and_other_values_refused():
    x = torch.ones(1)
    positional, defaults = ("x", "mask", "scale"), {"mask": None, "scale": 1.0}
    assert drop_passed_defaults(1, set(), positional, defaults, (x, None, 1.0), {}) == ((x,), {})
    assert drop_passed_defaults(1, set(), positional, defaults, (x,), {"mask": None, "other": 3}) == ((x,), {"other": 3})
    assert drop_passed_defaults(1, {"scale"}, positional, defaults, (x,), {"scale": 5.0}) == ((x,), {"scale": 5.0})
    with pytest.raises(TypeError, match=r"input 'scale' = 1 was not passed(.|\n)*default scale=1.0"):
        drop_passed_defaults(1, set(), positional, defaults, (x,), {"scale": 1})  # int for a float default
    with pytest.raises(TypeError, match=r"input 'mask' = a tensor of shape \(1,\)(.|\n)*'mask': <that tensor>"):
        drop_passed_defaults(1, set(), positional, defaults, (x, x), {})


def test_inputs_passed_at_their_defaults_are_recorded_and_filled_in_when_omitted():
    x = torch.ones(1)
    positional, left, passed = untraced_defaults(_M(), (x, None), {"scale": 1.0, "flag": True})
    assert left == {}
    assert passed == {"mask": None, "scale": 1.0}  # flag=True is not its default; 1 would not be 1.0
    assert untraced_defaults(_M(), (x,), {"scale": 1})[2] == {}
    # traced as (x, None) with scale=1.0: Python fills both in for a call that omits them
    assert fill_omitted_defaults(2, {"scale", "flag"}, positional, passed, (x,), {"flag": True}) == (
        (x, None), {"flag": True, "scale": 1.0})
    # a position given by keyword, or one not passed at its default, is left for the structure check
    assert fill_omitted_defaults(2, set(), positional, passed, (x,), {"mask": None}) == ((x,), {"mask": None})
    assert fill_omitted_defaults(2, set(), positional, {}, (x,), {}) == ((x,), {})
