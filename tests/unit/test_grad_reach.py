"""`runtime.grad_reach.unreached_parameters`: the trained parameters that no output of the traced model reaches
through autograd, i.e. those one device's `backward` leaves with `.grad` None (round 22, r22a). Each expected set is
what eager autograd says on the same model (`_eager_none`), not a hand-written list."""
import sys
from pathlib import Path

import torch
from torch import nn

import parallelizer
from parallelizer.runtime.grad_reach import output_reach, read_outputs, unreached_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from ignored_models import LOSSES, side_lm  # noqa: E402
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


def _eager_none_reading(use: str, read: tuple[int, ...]) -> set[str]:
    """Trained parameters whose .grad is None after one device's backward of the sum of the outputs `read`."""
    model, ids, _ = side_lm(use)
    out = model(ids)
    sum(out[i].sum() for i in read).backward()
    return {n for n, p in model.named_parameters() if p.grad is None}


def test_each_output_reaches_what_eager_backward_of_that_output_reaches():
    """Round 23 (r23a): a loss that ignores an output (SideLM's aux, made on stage 0 by `side`) leaves `side` without
    gradient on one device; before, the walk knew only the union over outputs (`side` counted as reached), so a
    pipeline gave it zeros. `output_reach` keeps one set per output; `unreached(read)` for every subset of outputs
    read equals eager's None set, and `varies` says the outputs differ (a step then exchanges its flags)."""
    for use in ("grad", "detach", "no_grad"):
        model, ids, _ = side_lm(use)
        reach = output_reach(parallelizer.trace(model, (ids[:4],)))
        assert reach.varies
        for read in ((0,), (1,), (0, 1)):
            assert reach.unreached(read) == _eager_none_reading(use, read), (use, read)
        assert reach.unreached() == reach.unreached((0, 1)) == unreached_parameters(parallelizer.trace(model, (ids,)))
    single = output_reach(parallelizer.trace(*indexed_lm(4)))
    assert not single.varies and single.unreached((0,)) == set(UNREACHED)


def test_read_outputs_names_the_outputs_a_loss_reaches_as_eager_backward_gives_them_a_gradient():
    """`read_outputs` walks the loss's own ops and stops at the outputs: checked against eager, where an output the
    loss reaches gets a .grad (retain_grad) and one it ignores, detaches or reads through integers does not."""
    model, ids, labels = side_lm("grad")
    losses = {"logits": LOSSES["logits"], "both": LOSSES["both"],
              "view of aux": lambda out, y: out[0].mean() + out[1][:, -1].sum(),
              "aux detached": lambda out, y: out[0].mean() + out[1].detach().sum(),
              "aux through argmax": lambda out, y: out[0].mean() * out[1].argmax(-1).float().sum(),
              "branch not taken": LOSSES["branch"]}
    for name, fn in losses.items():
        out = model(ids)
        for t in out:
            t.retain_grad()
        loss = fn(out, labels)
        read = read_outputs(loss, list(out))
        loss.backward()
        assert read == {i for i, t in enumerate(out) if t.grad is not None}, name
    labels[0, 0] = 0  # the branch taken: aux read
    out = model(ids)
    assert read_outputs(LOSSES["branch"](out, labels), list(out)) == {0, 1}
    out = model(ids, labels)  # the model's own loss first: a loss that IS an output reads that output alone
    assert read_outputs(out[0], list(out)) == {0} and read_outputs(out[0] * 0.5, list(out)) == {0}
