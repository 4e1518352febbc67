"""A graph network (PyG's pattern in plain torch: node features gathered by edge index, messages summed into
their target nodes with index_add, mean pooling over a batch vector) under a forced data-parallel role: the
nodes are the batch dim and every node's features are gathered by edges, so no plan keeps them sharded. The
InfeasiblePlanError says so and that the axis should stay free (round 14, r14b: it named only in-batch losses);
planned without roles it plans."""
import contextlib
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.errors import InfeasiblePlanError


class TinyGCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def conv(self, lin, x, edge_index):
        h = lin(x)
        return torch.zeros_like(h).index_add_(0, edge_index[1], h.index_select(0, edge_index[0]))

    def forward(self, x, edge_index, batch, y):
        h = F.relu(self.conv(self.lin1, x, edge_index))
        h = self.conv(self.lin2, h, edge_index)
        pooled = torch.zeros(3, 16).index_add_(0, batch, h) / torch.bincount(batch, minlength=3)[:, None]
        return F.cross_entropy(self.head(pooled), y)


def _graph():
    src = torch.arange(15)
    dst = (src + 1) % 15
    return (torch.randn(15, 8), torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]),
            torch.tensor([0] * 5 + [1] * 4 + [2] * 6), torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("role", ["ddp", "fsdp"])
def test_a_forced_data_role_on_a_graph_network_is_refused_naming_message_passing(role):
    torch.manual_seed(0)
    traced = parallelizer.trace(TinyGCN(), _graph())
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(InfeasiblePlanError) as caught:
        parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": role})
    assert "graph network's message passing" in str(caught.value) and "leave a graph network's data axis free" \
        in str(caught.value), str(caught.value)
    with contextlib.redirect_stdout(io.StringIO()):
        parallelizer.plan(traced, {"dp": 2})  # free: plans
