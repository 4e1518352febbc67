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
