"""A "pp" mesh for a model without repeated blocks is refused with a remedy that fits it (trial r9c: the remedy
said "dp / tp split a shared-weight model", written for ALBERT-like models, for a model that shares nothing)."""
import pytest
import torch
from torch import nn

import parallelizer
from parallelizer.errors import PipelineError


class _Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_no_blocks_remedy_names_a_data_mesh_not_shared_weights():
    traced = parallelizer.trace(_Flat(), (torch.randn(4, 8),))
    with pytest.raises(PipelineError, match="this graph has none") as err:
        parallelizer.plan(traced, {"pp": 2})
    assert "shared-weight" not in str(err.value) and "{'dp': 2}" in str(err.value), err.value


class _TiedLSTM(nn.Module):
    """pytorch/examples word_language_model's RNNModel with tie_weights: one nn.LSTM (its layers are one op),
    decoder.weight = encoder.weight."""

    def __init__(self):
        super().__init__()
        self.encoder, self.rnn, self.decoder = nn.Embedding(20, 8), nn.LSTM(8, 8, 2), nn.Linear(8, 20)
        self.decoder.weight = self.encoder.weight

    def forward(self, x):
        return self.decoder(self.rnn(self.encoder(x))[0])


def test_a_weight_tied_between_two_modules_is_not_named_a_block_called_twice():
    """Trial r16b: the message said "one block (encoder) called 2 times with shared weights" for the tied
    embedding / head, and that dp / tp "split a shared-weight model"; the model simply has no repeated blocks."""
    traced = parallelizer.trace(_TiedLSTM(), (torch.randint(0, 20, (4, 6)),))
    with pytest.raises(PipelineError, match="this graph has none") as err:
        parallelizer.plan(traced, {"pp": 2})
    assert "called 2 times" not in str(err.value) and "{'dp': 2}" in str(err.value), err.value
