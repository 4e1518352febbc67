"""`runtime.grad_reach.unreached_parameters`: the trained parameters that no output of the traced model reaches
through autograd, i.e. those one device's `backward` leaves with `.grad` None (round 22, r22a). Each expected set is
what eager autograd says on the same model (`_eager_none`), not a hand-written list."""
import sys
from pathlib import Path

import torch
from torch import nn

import parallelizer
from parallelizer.runtime.grad_reach import unreached_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from unreached_models import UNREACHED, indexed_lm  # noqa: E402


def _eager_none(model: nn.Module, args: tuple) -> set[str]:
    """Trained parameters whose .grad is None after one device's backward of every floating output."""
    out = model(*args)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.float().sum() for o in outs if o.requires_grad).backward()
    return {n for n, p in model.named_parameters() if p.requires_grad and p.grad is None}


def test_parameters_read_only_through_topk_indices_are_unreached_as_eager_says():
    model, args = indexed_lm(4)
    traced = parallelizer.trace(model, args)
    assert unreached_parameters(traced) == _eager_none(indexed_lm(4)[0], args) == set(UNREACHED)


class _TwoHeads(nn.Module):
    """`aux` feeds only the second output, `gate` only an argmax (integers), `frozen` is not trained, and the
    embedding's weight is tied to `head`'s (both uses differentiable)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.aux = nn.Linear(4, 1)
        self.gate = nn.Linear(4, 3)
        self.frozen = nn.Linear(4, 4).requires_grad_(False)

    def forward(self, ids):
        h = self.frozen(self.emb(ids))  # (B, T, 4)
        choice = self.gate(h).argmax(-1, keepdim=True).float()  # integers made float: no gradient path
        return self.head(h + choice).mean(), self.aux(h).sum()


def test_an_output_the_loss_may_ignore_counts_as_reached_and_frozen_or_tied_parameters_are_handled():
    """Conservative: `aux` reaches only the second output, which a caller's loss might ignore; it is never listed
    (a listed parameter's gradient is dropped). `gate` (argmax) is; the frozen layer and the tied pair are not."""
    torch.manual_seed(0)
    model, ids = _TwoHeads(), torch.randint(0, 10, (2, 3))
    traced = parallelizer.trace(model, (ids,))
    assert unreached_parameters(traced) == _eager_none(model, (ids,)) == {"gate.weight", "gate.bias"}


def test_a_rehearsal_reports_a_zero_gradient_where_one_device_has_none():
    """`pipeline_rehearsal.stage_diffs` (and `rehearse`, through the same `presence_mismatch`) counted a missing
    gradient as zeros, so a plan's zero gradient where one device has None (the weight-decay defect above) matched
    at every step; only a parameter large enough for weight decay to cross the bound (r21e: a norm weight of 1.0)
    showed it. Now the pair is a mismatch (ratio inf) naming the parameter and which side has None."""
    from types import SimpleNamespace

    from parallelizer.runtime.grad_reach import presence_mismatch
    from parallelizer.runtime.pipeline_rehearsal import stage_diffs

    stage, reference = nn.Linear(2, 2), nn.Linear(2, 2)
    stage.coords = (0,)
    stage.weight.grad, stage.bias.grad = torch.zeros(2, 2), torch.zeros(2)  # the plan: zeros
    reference.weight.grad = torch.zeros(2, 2)  # one device: bias.grad None
    diff, name, ratio = stage_diffs(SimpleNamespace(stages=[stage]), reference, spec=None, compute=None, grads=True)
    assert ratio == float("inf") and name == "bias (.grad None on one device, a tensor under the plan)"
    name = presence_mismatch([("w", None, torch.zeros(1))])[1]
    assert name == "w (.grad None under the plan, a tensor on one device)"
    assert presence_mismatch([("w", None, None), ("v", torch.ones(1), torch.ones(1), torch.ones(1))]) is None
