"""Inputs traced positionally and passed by keyword (`pm(user=u, item=i)` for a model traced with `(u, i)`), as
Python binds them for the model's forward, run the program (trial r9c: they raised TypeError "0 positional
input(s), traced with 2; unexpected keyword(s) ['item', 'user']" while the model itself takes the call)."""
import pytest
import torch
from torch import nn

import parallelizer


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class _TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.u, self.i = nn.Embedding(11, 6), nn.Embedding(13, 6)
        self.head = nn.Linear(12, 1)

    def forward(self, user, item, scale: float = 1.0):
        eu, ei = self.u(user), self.i(item)
        return ((eu * ei).sum(-1) + self.head(torch.cat([eu, ei], -1)).squeeze(-1)) * scale


def test_positional_inputs_passed_by_keyword_match_the_model():
    torch.manual_seed(0)
    model = _TwoTower()
    u, i = torch.randint(0, 11, (4,)), torch.randint(0, 13, (4,))
    pm = parallelizer.auto_parallelize(model, (u, i))
    expected = model(user=u, item=i)
    torch.testing.assert_close(pm(user=u, item=i), expected)
    torch.testing.assert_close(pm(u, item=i), model(u, item=i))
    torch.testing.assert_close(pm(item=i, user=u), expected)


def test_other_keyword_mistakes_stay_typed():
    torch.manual_seed(0)
    model = _TwoTower()
    u, i = torch.randint(0, 11, (4,)), torch.randint(0, 13, (4,))
    pm = parallelizer.auto_parallelize(model, (u, i))
    with pytest.raises(TypeError, match=r"unexpected keyword\(s\) \['extra'\]"):
        pm(user=u, item=i, extra=u)
    with pytest.raises(TypeError, match=r"1 positional input\(s\), traced with 2"):
        pm(u)
    with pytest.raises(TypeError, match=r"input 'scale' = 2.0 was not passed when the model was traced(.|\n)*"
                                        r"default scale=1.0(.|\n)*example_kwargs=\{'scale': 2.0\}"):
        pm(u, i, scale=2.0)
    torch.testing.assert_close(pm(u, i, scale=1.0), model(u, i))  # its default: the traced function


class _Optional(nn.Module):
    """An optional input (None by default) and a plain-constant setting."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(11, 6), nn.Linear(6, 3)

    def forward(self, ids, extra=None, scale: float = 1.0):
        x = self.emb(ids)  # (B, 6)
        if extra is not None:
            x = x + extra
        return self.head(x) * scale


def test_an_input_traced_at_its_default_may_be_omitted_as_python_fills_it_in():
    """Traced with `extra=None, scale=1.0` spelled out, `pm(ids)` is the model's `model(ids)` (trial r24h: it raised
    "missing keyword(s) ['extra', 'scale']"); the same for an optional input traced positionally at its default."""
    torch.manual_seed(0)
    model = _Optional()
    ids = torch.randint(0, 11, (4,))
    pm = parallelizer.auto_parallelize(model, (ids,), example_kwargs={"extra": None, "scale": 1.0})
    expected = model(ids)
    torch.testing.assert_close(pm(ids), expected)
    torch.testing.assert_close(pm(ids, scale=1.0), expected)
    torch.testing.assert_close(pm(ids, extra=None), expected)
    torch.distributed.destroy_process_group()
    positional = parallelizer.auto_parallelize(model, (ids, None))
    torch.testing.assert_close(positional(ids), expected)
    torch.testing.assert_close(positional(ids, extra=None), expected)


def test_an_omitted_input_traced_with_another_value_than_its_default_stays_refused():
    torch.manual_seed(0)
    model = _Optional()
    ids = torch.randint(0, 11, (4,))
    pm = parallelizer.auto_parallelize(model, (ids,), example_kwargs={"extra": torch.ones(4, 6), "scale": 2.0})
    torch.testing.assert_close(pm(ids, extra=torch.ones(4, 6), scale=2.0), model(ids, torch.ones(4, 6), 2.0))
    with pytest.raises(TypeError, match=r"missing keyword\(s\) \['extra', 'scale'\]"):
        pm(ids)
    with pytest.raises(TypeError, match=r"missing keyword\(s\) \['scale'\]"):
        pm(ids, extra=torch.ones(4, 6))
