"""The training-step contract (`runtime.step`, issue 13 item 3) on one process: item counts, the
token-weighted microbatch loss against the whole-batch loss, and `ParallelModule.step` with its typed error.
The distributed cases (pipeline plans on 4 gloo ranks) are in tests/distributed/test_step.py."""
import copy

import pytest
import torch
import torch.nn.functional as F

import parallelizer
from parallelizer import zoo
from parallelizer.runtime.pipeline import MicrobatchLoss
from parallelizer.runtime.step import StepError, count_items


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    """auto_parallelize outside a launcher creates a one-process gloo group; do not leak it to other tests."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_count_items_counts_what_a_mean_loss_averages_over():
    labels = torch.tensor([[1, -100, 3], [-100, -100, 2]])
    assert int(count_items(labels)) == 3  # cross_entropy's ignore_index -100 is not counted
    assert count_items(torch.zeros(4, 5)) == 20 and count_items(None) == 1


def test_token_weighted_microbatch_losses_add_up_to_the_batch_loss():
    torch.manual_seed(0)
    logits, labels = torch.randn(4, 6, 11), torch.randint(0, 11, (4, 6))
    labels[:2, 1:] = -100  # microbatch 0 counts 2 tokens, microbatch 1 counts 12
    ce = lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten())  # noqa: E731
    loss = MicrobatchLoss(ce, 2)
    loss.begin(None, count_items, labels)
    total = sum(loss(o, y) for o, y in zip(logits.tensor_split(2), labels.tensor_split(2)))
    whole = ce(logits, labels)
    torch.testing.assert_close(total, whole, rtol=1e-6, atol=1e-6)
    plain = MicrobatchLoss(ce, 2)  # no item count: the mean of the microbatch means, which is not the batch loss
    plain.begin(None, None, labels)
    mean_of_means = sum(plain(o, y) for o, y in zip(logits.tensor_split(2), labels.tensor_split(2)))
    assert abs(mean_of_means - whole) > 1e-2
    assert [w for _, w in plain.recorded] == [0.5, 0.5]


def test_parallel_module_step_is_forward_loss_backward():
    model, (x,) = zoo.mlp(batch=8, in_features=16, dim=32, hidden=64, out_features=4)
    reference = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, (x,), cluster="h100:1x1")
    y = torch.randn(8, 4)
    loss = pm.step(x, target=y, loss_fn=F.mse_loss)
    ref = F.mse_loss(reference(x), y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    for (name, p), q in zip(pm.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert not loss.requires_grad
    with pytest.raises(StepError, match=r"loss_fn=None, but the model's first output has shape \(8, 4\)"):
        pm.step(x, target=y)



def test_parallel_module_step_takes_item_count_as_a_pipeline_step_does():
    """A loop written for a pipeline plan (`item_count=` with `target=`) runs on a plan without stages: before, the
    keyword went to the model as an input, an InputMismatchError telling the user to trace again (round 16 trial)."""
    model, (x,) = zoo.mlp(batch=8, in_features=16, dim=32, hidden=64, out_features=4)
    reference = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, (x,), cluster="h100:1x1")
    y = torch.randint(0, 4, (8,))
    y[:3] = -100
    ce = lambda out, t: F.cross_entropy(out, t, label_smoothing=0.1)  # noqa: E731
    loss = pm.step(x, target=y, loss_fn=ce, item_count=lambda t: (t != -100).sum())
    ref = ce(reference(x), y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    for (name, p), q in zip(pm.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    with pytest.raises(StepError, match="item_count= was given without target="):
        pm.step(x, loss_fn=lambda out, t: out.sum(), item_count=lambda t: 1)

def test_a_pipeline_item_count_that_disagrees_with_loss_fns_graph_is_warned():
    """A user's item_count counting every label != -100 for a loss over the SHIFTED labels y[:, 1:] weighs the
    microbatches otherwise than the loss averages (GPT-2 on pp=2 x tp=2, trial4a: loss 2.8e-3 off, no word):
    `PipelineModule.step` compares it once with the count read from loss_fn's graph and warns; the right count
    passes silently. (The module is assembled without ranks: only the count check runs.)"""
    import types
    import warnings

    from parallelizer.runtime.pipeline_module import PipelineModule
    from parallelizer.tracer.trace import trace

    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(1))
    labels[0, 1:] = -100  # microbatch 0: shifted count 0 + row 1's 5; unshifted 1 + 6
    pm = PipelineModule.__new__(PipelineModule)
    pm.traced, pm.run = trace(model, (ids,)), types.SimpleNamespace(microbatches=2)
    pm._fn_count, pm._checked_counts = (None, None), set()

    def shifted(out, y):
        return F.cross_entropy(out[:, :-1].flatten(0, 1), y[:, 1:].flatten())

    def every_label(y):
        return (y != -100).sum()

    def shifted_labels(y):
        return (y[:, 1:] != -100).sum()

    with pytest.warns(UserWarning, match="loss_fn's graph averages over"):
        pm._check_user_count(shifted, labels, every_label)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pm._check_user_count(shifted, labels, shifted_labels)


def test_a_broadcast_input_of_a_pipeline_step_is_named_as_such():
    """position_ids of shape (1, T) (transformers' common broadcast form) under a pipeline: the typed error says
    the input has no batch dim and to expand it, not to drop or pad a short last batch (trial4a)."""
    from parallelizer.errors import PipelineError
    from parallelizer.runtime.microbatches import check_batch

    with pytest.raises(PipelineError, match=r"\(1, 16\) has no batch dim .*expand\(8, \.\.\.\)"):
        check_batch((torch.zeros(8, 16), torch.arange(16)[None]), 2, 4)
    with pytest.raises(PipelineError, match="drop or pad a short last batch"):
        check_batch((torch.zeros(6, 16),), 2, 4)


def test_a_0d_tensor_input_of_a_pipeline_is_named_with_a_remedy_that_keeps_its_meaning():
    """transformers' `num_items_in_batch` (a 0-d count of the whole batch's items) given to a pipeline (r25f,
    GPT-J pp=2): the error names the keyword and says to pass a Python number or leave it out, not to expand it to
    the batch (a (B,) divisor would change the loss); a Python number is kept as it is in every microbatch."""
    from parallelizer.errors import PipelineError
    from parallelizer.runtime.microbatches import microbatch_of

    ids, labels = torch.zeros(4, 6, dtype=torch.long), torch.ones(4, 6, dtype=torch.long)
    with pytest.raises(PipelineError, match=r"input 'num_items_in_batch' is a 0-d tensor.*Python number") as err:
        microbatch_of((ids,), {"labels": labels, "num_items_in_batch": torch.tensor(20)}, 2)
    assert "expand(" not in str(err.value)
    (first,), kwargs = microbatch_of((ids,), {"labels": labels, "num_items_in_batch": 20}, 2)
    assert first.shape == (2, 6) and kwargs["labels"].shape == (2, 6) and kwargs["num_items_in_batch"] == 20


def _assert_whole_batch(loss_fn, w, x, mask):
    """The pipeline's batch loss (`weighted_loss` of `loss_fn.recorded`) and w's accumulated gradient equal one
    device's masked mean of (x @ w)^2 over the whole batch, computed here eagerly."""
    from parallelizer.runtime.pipeline import weighted_loss

    total = sum(weighted_loss(loss, weight) for loss, weight in loss_fn.recorded)
    whole = w.detach().clone().requires_grad_()
    ref = ((x @ whole).pow(2) * mask).sum() / mask.sum()
    ref.backward()
    assert torch.isfinite(w.grad).all(), w.grad
    torch.testing.assert_close(w.grad, whole.grad)
    torch.testing.assert_close(total, ref.detach())


def test_a_microbatch_without_items_sends_zero_not_nan_gradients():
    """The model's own masked mean `(x * mask).sum() / mask.sum()` on a microbatch whose mask is all 0 (weight
    n_j / N = 0): its loss is 0/0 = NaN, and backward of `loss * 0` through the division is NaN in every
    gradient, while one device's loss of the whole batch is finite. `MicrobatchLoss` sends zeros through the
    stage's finite outputs instead; the batch loss and gradients equal the whole batch's (trial4a)."""
    from parallelizer.runtime.pipeline import MicrobatchLoss

    w = torch.randn(3, requires_grad=True)
    x = torch.randn(4, 3)
    mask = torch.tensor([0.0, 0.0, 1.0, 1.0])  # microbatch 0 (rows 0-1) counts nothing

    def own(rows):
        h = x[rows] @ w
        return ((h.pow(2) * mask[rows]).sum() / mask[rows].sum(), h)  # the stage's outputs: (loss, h)

    loss_fn = MicrobatchLoss(lambda out, t: out[0], 2)
    target = mask.clone()
    loss_fn.begin(None, lambda t: t.sum(), target)
    for rows in (slice(0, 2), slice(2, 4)):
        out = loss_fn(own(rows), target[rows])
        out.backward()
    _assert_whole_batch(loss_fn, w, x, mask)


def test_a_microbatch_without_items_sends_zero_gradients_when_the_loss_is_the_stages_only_output():
    """Round 22 (r22b): the last stage of a model that returns only its own masked mean (`(h * mask).sum() /
    mask.sum()`, transformers-style `loss` alone) has no other output to send zeros through; `loss * 0` on a
    microbatch whose mask is all 0 back-propagated 0 / 0 = NaN into every gradient (pp=2, 2 microbatches: loss
    right, every parameter NaN after the optimizer step, no error). The zeros now go to the leaves of the loss's
    autograd graph (the stage's received activations and parameters), so the received activation's gradient sent
    back is 0 and the parameters' gradients equal one device's of the whole batch."""
    from parallelizer.runtime.pipeline import MicrobatchLoss

    w = torch.randn(3, requires_grad=True)
    x = torch.randn(4, 3)
    mask = torch.tensor([0.0, 0.0, 1.0, 1.0])  # microbatch 0 (rows 0-1) counts nothing
    loss_fn = MicrobatchLoss(lambda out, t: out[0], 2)
    target = mask.clone()
    loss_fn.begin(None, lambda t: t.sum(), target)
    received = []
    for rows in (slice(0, 2), slice(2, 4)):
        h_in = x[rows].clone().requires_grad_()  # what a last stage receives: a leaf that requires grad
        received.append(h_in)
        out = loss_fn((((h_in @ w).pow(2) * mask[rows]).sum() / mask[rows].sum(),), target[rows])
        out.backward()
    _assert_whole_batch(loss_fn, w, x, mask)
    torch.testing.assert_close(received[0].grad, torch.zeros(2, 3))  # what is sent back to the previous stage


def test_item_count_for_a_model_loss_without_a_count_is_warned_once_naming_the_loss_op():
    """The model's own loss with a batch-level term (a load-balancing product of batch means) has no
    per-microbatch count: weighting it by the user's item_count gives gradient accumulation's value, so
    `PipelineModule.step` warns once, naming the loss op (the module is assembled without ranks)."""
    import warnings

    from test_loss_weight import B, M, Own, _batch  # tests/unit is on sys.path (pytest's rootdir-less import)

    from parallelizer.runtime.pipeline_module import PipelineModule
    from parallelizer.tracer.trace import trace

    ids, labels = _batch()
    pm = PipelineModule.__new__(PipelineModule)
    pm.traced, pm._trusted_warned = trace(Own("aux"), (ids[:B // M], labels[:B // M])), False
    pm._own_weighting = None  # read before the first own-loss step (round 16, r16e)
    with pytest.warns(UserWarning, match=r"own loss \(node add \(aten\.add\.Tensor\)\) by your item_count"):
        pm._warn_trusted_count()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pm._warn_trusted_count()  # once


def test_a_pipeline_step_refuses_inputs_or_a_target_that_require_grad():
    """torch's pipeline schedules send no gradient back to the first stage's inputs or the last stage's
    target: a trainable module in front of a PipelineModule would silently stay untrained (its .grad None).
    `PipelineModule.step` refuses such tensors before any communication, naming them."""
    import types

    from parallelizer.errors import PipelineError
    from parallelizer.runtime.pipeline_module import _refuse_input_gradients

    traced = types.SimpleNamespace(input_names=("input_ids", "inputs_embeds"))
    plain = [torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, 3, 8)]
    _refuse_input_gradients(traced, plain, torch.zeros(4))
    with pytest.raises(PipelineError, match="inputs_embeds require"):
        _refuse_input_gradients(traced, [plain[0], plain[1].requires_grad_()], None)
    with pytest.raises(PipelineError, match="target require"):
        _refuse_input_gradients(traced, plain[:1] + [torch.zeros(4, 3, 8)], torch.zeros(4, requires_grad=True))


def test_a_pipeline_module_refuses_deepcopy_with_a_remedy():
    """copy.deepcopy of a PipelineModule (AveragedModel, EMA teachers) cannot copy its schedules: a typed
    PipelineError naming the remedy, not torch's "Cannot access data pointer" RuntimeError."""
    from parallelizer.errors import PipelineError
    from parallelizer.runtime.pipeline_module import PipelineModule

    with pytest.raises(PipelineError, match="ema_p.lerp_"):
        copy.deepcopy(PipelineModule.__new__(PipelineModule))


def test_the_pipeline_rehearsals_reference_adds_zero_gradients_for_a_microbatch_without_items():
    """Round 22 (lead, from r22b's note): the rehearsal's eager reference (`_accumulated_reference`, gradient
    accumulation over the same microbatches) back-propagated `loss * 0` of a microbatch whose masked mean is 0/0,
    so its gradients were NaN where the pipeline's (zeros, `MicrobatchLoss`) and one device's whole batch are
    finite. Its gradient and batch loss now equal the whole batch's masked mean, computed here eagerly."""
    from parallelizer.runtime.pipeline_rehearsal import _accumulated_reference

    class MaskedMean(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3))

        def forward(self, x, mask):
            return ((x @ self.w).pow(2) * mask).sum() / mask.sum()

    torch.manual_seed(0)
    model, x = MaskedMean(), torch.randn(4, 3)
    mask = torch.tensor([0.0, 0.0, 1.0, 1.0])  # microbatch 0 counts nothing: weight n_0 / N = 0
    total = _accumulated_reference(model, (x, mask), {}, torch.tensor([0.0, 1.0], dtype=torch.float64))
    whole = MaskedMean()
    whole.load_state_dict(model.state_dict())
    ref = whole(x, mask)
    ref.backward()
    assert torch.isfinite(model.w.grad).all(), model.w.grad
    torch.testing.assert_close(model.w.grad, whole.w.grad)
    torch.testing.assert_close(total.float(), ref.detach())
