"""Zero-bubble schedules refuse a stage that reads a trained parameter twice (found in trial10c).

torch's zero-bubble schedules (zbv, interleaved_zero_bubble, dualpipev) split each stage's backward into an
input pass (stage_backward_input) and a weight pass (stage_backward_weight) over the saved graph. On a stage
where a Linear is applied to its own output (x -> sq -> tanh -> sq: its weight and its split-off bias each read
twice) the weight pass raised torch's "Trying to backward through the graph a second time" from inside the
schedule, mid-step, on every rank (trial/hc_pipe.py "reuse zbv pp2xdp2"; the same model on 1f1b matches one
device); pytorch#180952 reports the split path double-counting a weight used twice on one path. The pipeline
build now refuses such a stage with a typed PipelineError naming the parameter, its uses and the remedy."""
import functools

import pytest
import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

import parallelizer
from parallelizer.errors import PipelineError
from parallelizer.runtime.pipeline import cut_stages
from parallelizer.runtime.stage_checks import SPLIT_BACKWARD, check_split_backward

V, H, T, B = 32, 16, 4, 2


class Reused(nn.Module):
    def __init__(self, reuse: bool) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(V, H), nn.Linear(H, V)
        self.blocks = nn.ModuleList([nn.Linear(H, H) for _ in range(4)])
        self.reuse = reuse

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = h + (b(torch.tanh(b(h))) if self.reuse else torch.tanh(b(h)))
        return self.head(h)


@functools.cache
def _cut(reuse: bool):
    torch.manual_seed(0)
    traced = parallelizer.trace(Reused(reuse), (torch.randint(0, V, (B, T)),))
    return traced, cut_stages(traced, 4)


def test_torch_split_backward_is_not_exact_for_a_linear_applied_to_its_own_output():
    """The fact behind the refusal, on torch alone: the weight pass fails (or, per pytorch#180952, would
    differ from autograd) for (x @ w + b) @ w + b, while plain autograd gives the gradients."""
    torch.manual_seed(0)
    w, b = torch.randn(H, H, requires_grad=True), torch.randn(H, requires_grad=True)
    x = torch.randn(B, H, requires_grad=True)
    ref = torch.autograd.grad(((x @ w + b) @ w + b).pow(2).sum(), [w, b])
    out = ((x @ w + b) @ w + b).pow(2).sum()
    try:
        _, groups = stage_backward_input([out], None, [x], [w, b])
        stage_backward_weight([w, b], groups)
        exact = all(torch.allclose(p.grad, r) for p, r in zip((w, b), ref))
    except RuntimeError:
        exact = False
    assert not exact


@pytest.mark.parametrize("schedule", sorted(SPLIT_BACKWARD))
def test_a_zero_bubble_schedule_refuses_a_stage_reading_a_parameter_twice(schedule):
    traced, cut = _cut(reuse=True)
    with pytest.raises(PipelineError, match=r"blocks\.0\.weight' is read by 2 ops of stage 0.*schedule='1f1b'"):
        check_split_backward(traced, cut, schedule)


def test_one_backward_schedules_and_single_reads_are_accepted():
    traced, cut = _cut(reuse=True)
    for schedule in ("1f1b", "gpipe", "interleaved_1f1b"):
        check_split_backward(traced, cut, schedule)
    traced, cut = _cut(reuse=False)
    for schedule in SPLIT_BACKWARD:
        check_split_backward(traced, cut, schedule)


def test_the_search_leaves_zero_bubble_schedules_out_for_a_parameter_a_stage_may_read_twice():
    """`api.plan`'s search drops zbv / dualpipev when some cut could give one stage two reads of a trained
    parameter: twice inside one block, or once in each of two blocks (ALBERT-style sharing: a cut may put both
    blocks on one stage); a tied embedding and head (one read before the blocks, one after: always the first
    and the last stage) keeps them."""
    from parallelizer.runtime.stage_checks import read_twice_by_a_stage

    assert read_twice_by_a_stage(_cut(reuse=True)[0]) == [f"blocks.{i}.{k}" for i in range(4) for k in ("weight", "bias")]
    assert read_twice_by_a_stage(_cut(reuse=False)[0]) == []
    torch.manual_seed(0)
    tied = Reused(reuse=False)
    tied.head.weight = tied.emb.weight
    assert read_twice_by_a_stage(parallelizer.trace(tied, (torch.randint(0, V, (B, T)),))) == []
    shared = Reused(reuse=False)
    shared.blocks[1] = shared.blocks[0]  # blocks 0 and 1 share a layer: a 2-block stage would read it twice
    traced = parallelizer.trace(shared, (torch.randint(0, V, (B, T)),))
    assert read_twice_by_a_stage(traced) == ["blocks.0.weight", "blocks.0.bias"]
    with pytest.raises(PipelineError, match=r"blocks\.0\.weight' is read by 2 ops of stage 0"):
        check_split_backward(traced, cut_stages(traced, 2), "zbv")
