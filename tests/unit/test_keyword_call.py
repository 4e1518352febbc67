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
