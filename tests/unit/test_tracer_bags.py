"""Normalisation 11 (`tracer/bags.py`): nn.EmbeddingBag over fixed-size bags ran replicated (the fused op has no
rule: four outputs of different ranks, 1-D ids and offsets addressing the whole batch), so under ddp every rank
gathered the batch for it. It is now embedding + sum / mean / amax over the bag dim; the traced program gives
eager's values and weight gradients, and the ops plan on the batch shard. Bags of variable size (offsets the
caller gives) keep the op, replicated and noted."""
import contextlib
import io

import pytest
import torch
from torch import nn

import parallelizer


class Bag(nn.Module):
    def __init__(self, mode: str, weighted: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(5, 3)
        self.bag = nn.EmbeddingBag(13, 6, mode=mode)
        self.weighted = weighted

    def forward(self, ids, dense):
        w = torch.sigmoid(self.gate(dense)) if self.weighted else None  # (N, 3)
        return self.bag(ids, per_sample_weights=w) * 1.5               # (N, 6)


def _inputs():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 13, (5, 3), generator=g)
    ids[1, 2] = ids[1, 0]  # an id twice in one bag: a tie under "max"
    return ids, torch.randn(5, 5, generator=g)


@pytest.mark.parametrize("mode,weighted", [("sum", True), ("sum", False), ("mean", False), ("max", False)])
def test_fixed_size_bags_become_embedding_and_a_reduction_with_eager_values_and_gradients(mode, weighted):
    torch.manual_seed(0)
    model, (ids, dense) = Bag(mode, weighted), _inputs()
    traced = parallelizer.trace(model, (ids, dense))
    ops = [n.op_name for n in traced.compute_nodes()]
    assert not any("embedding_bag" in op for op in ops) and "aten.embedding.default" in ops, ops
    assert any("embedding bag(s) of fixed-size bags" in note for note in traced.notes)

    params = [*model.parameters()]
    got = traced.graph_module(*params, ids, dense)[0]
    want = model(ids, dense)
    torch.testing.assert_close(got, want)
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(4))
    got_grads = torch.autograd.grad(got, params, cot, allow_unused=True)
    want_grads = torch.autograd.grad(want, params, cot, allow_unused=True)
    for p, g, w in zip(params, got_grads, want_grads):
        if w is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, w)

    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": "ddp"})
    assert not plan.fallbacks, plan.fallbacks
    assert [q.output for q in plan.nodes.values() if q.op == "aten.embedding.default"] == ["S(0)"]


class VariableBags(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(13, 6, mode="sum")

    def forward(self, flat_ids, offsets):
        return self.bag(flat_ids, offsets)


def test_bags_of_variable_size_keep_the_op_replicated_and_noted():
    torch.manual_seed(0)
    model = VariableBags()
    traced = parallelizer.trace(model, (torch.arange(7) % 13, torch.tensor([0, 2, 3, 7 - 1])))
    assert any("embedding_bag" in n.op_name for n in traced.compute_nodes())
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"dp": 2})
    assert any("embedding_bag" in f.op and "no sharding rule" in f.reason for f in plan.fallbacks), plan.fallbacks
