"""Data roles ("ddp", "fsdp") keep a parameter whole where it is used also when the use reads it through a view or
an undeclared alias (round 18 r18b: Mixtral's expert weight reached grouped_mm through a transpose and was used
sharded over the "ddp" axis). The model forces the question: a softmax over the batch leaves the activation
feature-sharded, and a matmul with the weight could then contract over dp-sharded features, using the weight
sharded over dp (tensor parallelism over the data axis), instead of moving the activation back to the batch."""
import pytest
import torch
import torch.nn as nn

import parallelizer
from parallelizer.core.layout import Layout, Replicate, Shard

VIEWS = {  # how the (12, 16) weight reaches the matmul as a (16, 12) operand
    "t": lambda w: w.t(),
    "permute": lambda w: w.permute(1, 0),
    "view_then_T": lambda w: w.view(12, 16).T,
    "as_strided": lambda w: w.as_strided((16, 12), (1, 16)),
    "einsum_transpose": lambda w: torch.einsum("ij->ji", w),
    "unsafe_split": lambda w: torch.unsafe_split(w, 12, 0)[0].t(),  # one piece: w itself
    "type_as": lambda w: w.t().type_as(w),
    "clone": lambda w: w.clone().t(),
}


class _BatchSoftmax(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.l, self.w, self.how = nn.Linear(8, 16), nn.Parameter(torch.randn(12, 16) * 0.1), how

    def forward(self, x):
        a = torch.softmax(self.l(x), dim=0)  # over the batch: no rule keeps it batch-sharded
        if self.how == "expand":
            y = torch.bmm(a.unsqueeze(1), self.w.t().expand(x.shape[0], 16, 12)).squeeze(1)
        else:
            y = a @ VIEWS[self.how](self.w)
        return (y ** 2).sum()


def _weight_use(plan, traced):
    """The layout the matmul / bmm takes its weight operand (input 1) in."""
    (name,) = [n for n, info in traced.nodes.items() if info.op_name in ("aten.matmul.default", "aten.bmm.default")]
    return Layout.parse(plan.nodes[name].inputs[1])


@pytest.mark.parametrize("how", [*VIEWS, "expand"])
def test_a_weight_used_through_a_view_stays_whole_over_a_data_axis(how):
    traced = parallelizer.trace(_BatchSoftmax(how), (torch.randn(6, 8, generator=torch.Generator().manual_seed(0)),))
    for role in ("ddp", "fsdp"):
        plan = parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": role})
        (used,) = _weight_use(plan, traced).placements
        # whole, or (expand) sharded along the broadcast batch dim, which slices no weight element
        allowed = (Replicate(), Shard(0)) if how == "expand" else (Replicate(),)
        assert used in allowed, (how, role, str(used))
