"""A model class whose own `__getattr__` raises something other than AttributeError while its children are being
added (peft's `ModulesToSaveWrapper` with `modules_to_save`: KeyError 'modules_to_save'; round 14, trial r14b):
building the ParallelModule mirrored it with `add_module`, whose `hasattr` check called that `__getattr__`, and
raised the KeyError raw on every rank. Expected values: the eager model on one device."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import parallelizer


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class SaveWrapper(nn.Module):
    """peft's pattern: attribute lookups fall through to the wrapped copy, found in `_modules['copies']`."""

    def __init__(self, module):
        super().__init__()
        self.original = module
        self.copies = nn.ModuleDict({"default": nn.Linear(module.in_features, module.out_features)})

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__["_modules"]
            return getattr(modules["copies"]["default"], name)  # KeyError while 'copies' is not there yet

    def forward(self, x):
        return self.copies["default"](x)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = SaveWrapper(nn.Linear(8, 3))

    def forward(self, x, y):
        return F.cross_entropy(self.head(torch.tanh(self.body(x))), y)


def test_a_wrapper_whose_getattr_raises_keyerror_is_mirrored_and_trains_as_eager():
    torch.manual_seed(0)
    model = Classifier()
    torch.manual_seed(0)
    reference = Classifier()
    x, y = torch.randn(4, 6), torch.tensor([0, 2, 1, 1])
    pm = parallelizer.auto_parallelize(model, (x, y))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (pm, reference)]
    for _ in range(2):
        losses = []
        for m, opt in zip((pm, reference), opts):
            loss = m(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss)
        torch.testing.assert_close(*losses)
    torch.testing.assert_close(dict(pm.named_parameters()), dict(reference.named_parameters()))
