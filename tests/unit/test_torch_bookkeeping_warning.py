"""torch.export warns that tensor attributes "must be registered as buffers" when torch's own modules set them
during export: nn.LSTM / GRU / RNN refresh their `_flat_weights` lists, and the hook forms of
`torch.nn.utils.weight_norm` / `spectral_norm` set the weight in a forward pre-hook; both are recomputed at every call
and restored by export, so every RNN and hook-form user was told to register torch's attributes (round 23, r23f).
That warning is dropped when it names only such attributes; a forward that assigns another tensor attribute still
gets it."""
import warnings

import pytest
import torch
import torch.nn as nn

import parallelizer


class _Rnn(nn.Module):
    def __init__(self, kind: str, store: bool = False):
        super().__init__()
        self.rnn = getattr(nn, kind)(3, 4, 2, batch_first=True, bidirectional=True)
        self.store = store
        self.last = None

    def forward(self, x):
        out, _ = self.rnn(x)
        if self.store:
            self.last = out.detach()  # a tensor attribute assigned in forward: a real finding for the user
        return out.sum()


class _HookNorms(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.utils.spectral_norm(nn.Linear(3, 4))
        self.b = nn.utils.weight_norm(nn.Linear(4, 4))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))).sum()


def _export_warnings(model) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallelizer.trace(model, (torch.randn(2, 5, 3),))
    return [str(w.message) for w in caught if "assigned during export" in str(w.message)]


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN", "hook_norms"])
def test_torchs_own_bookkeeping_attributes_are_not_reported_as_attributes_to_register(kind):
    assert _export_warnings(_HookNorms() if kind == "hook_norms" else _Rnn(kind)) == []


def test_another_tensor_attribute_assigned_in_forward_is_still_reported():
    found = _export_warnings(_Rnn("GRU", store=True))
    assert found and "self.last" in found[0]
