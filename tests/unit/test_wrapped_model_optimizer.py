"""The model handed to auto_parallelize is not what the returned module trains (trial r9e): an optimizer built
over `model.parameters()` after wrapping, or a backward through `model(...)` with the optimizer over
`pm.parameters()`, stepped nothing `pm` computes with and `pm` never trained, silently (a conv autoencoder on
dp=2: the loss stayed at its first value, 6x the float32 bound above one device's after 2 SGD steps). Both are
an OptimizerError now; the right loop, and eager training of the original model after wrapping (a reference
run), are untouched and match one device."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.errors import OptimizerError


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6))
    x = torch.randn(4, 6)
    ref = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, (x,))
    return model, ref, pm, x


def _loss(out, y):
    return F.mse_loss(out, y)


def test_an_optimizer_over_the_original_models_parameters_is_refused():
    model, _, pm, x = _setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    pm.step(x, target=x, loss_fn=_loss)
    before = [p.detach().clone() for p in pm.parameters()]
    with pytest.raises(OptimizerError, match=r"pm\.parameters\(\)") as info:
        opt.step()
    assert info.value.kind == "wrapped model" and info.value.parameter == "0.weight"
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, pm.parameters()))


def test_a_backward_through_the_original_model_is_refused_at_the_step():
    model, _, pm, x = _setup()
    opt = torch.optim.SGD(pm.parameters(), lr=0.5)
    _loss(model(x), x).backward()
    with pytest.raises(OptimizerError, match=r"backward ran through the original model"):
        opt.step()


@pytest.mark.filterwarnings("ignore::parallelizer.StaleModelWarning")  # model(x) after pm's first step: warned
def test_the_right_loop_and_an_eager_reference_on_the_original_model_train_as_one_device():
    model, ref, pm, x = _setup()
    opt, ref_opt = torch.optim.SGD(pm.parameters(), lr=0.5), torch.optim.SGD(ref.parameters(), lr=0.5)
    model_opt = torch.optim.SGD(model.parameters(), lr=0.5)  # the original model trained eagerly: allowed
    for _ in range(2):
        opt.zero_grad(); loss = pm.step(x, target=x, loss_fn=_loss); opt.step()
        ref_opt.zero_grad(); expected = _loss(ref(x), x); expected.backward(); ref_opt.step()
        model_opt.zero_grad(); _loss(model(x), x).backward(); model_opt.step()
        torch.testing.assert_close(loss, expected.detach())
    full = pm.full_state_dict()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(full[k], v)
        torch.testing.assert_close(model.state_dict()[k], v)


def test_the_original_model_run_or_saved_after_pm_trained_is_warned_about_once():
    """After `pm` trains, `model(x)` computes with, and `model.state_dict()` saves, the weights the model had when
    it was wrapped (documented, but silent: an evaluation or a checkpoint of the untrained model). Both now warn
    StaleModelWarning with the remedy, once per model; before `pm` changes a parameter nothing is said (the model
    still equals `pm`), and copies of the model (a reference kept for comparison, `pm.full_model()`'s copy with
    the trained weights) are never warned about. The values themselves: the model's output is the untrained one,
    full_model's is pm's."""
    import warnings

    model, ref, pm, x = _setup()
    with warnings.catch_warnings():
        warnings.simplefilter("error", parallelizer.StaleModelWarning)
        untrained = model(x)  # nothing trained yet: the model equals pm, no warning
        model.state_dict()
    opt = torch.optim.SGD(pm.parameters(), lr=0.5)
    pm.step(x, target=x, loss_fn=_loss)
    opt.step()
    early = copy.deepcopy(model)
    with pytest.warns(parallelizer.StaleModelWarning, match=r"pm\.full_state_dict\(\)") as record:
        stale = model(x)
        model.state_dict()
    assert len([w for w in record if w.category is parallelizer.StaleModelWarning]) == 1
    torch.testing.assert_close(stale, untrained)
    with warnings.catch_warnings():
        warnings.simplefilter("error", parallelizer.StaleModelWarning)
        ref(x), early(x), early.state_dict()
        with pm.full_model() as full:
            trained = full(x)
    torch.testing.assert_close(trained, pm(x))
    assert (trained - stale).abs().max() > 1e-3


def test_a_second_wrapped_model_is_watched_on_its_own():
    """Each wrapped model warns for its own parallel module: a model whose pm has not trained says nothing while
    another model's pm trains."""
    import warnings

    a, _, pm_a, x = _setup()
    b, _, _, _ = _setup()
    torch.optim.SGD(pm_a.parameters(), lr=0.5)
    pm_a.step(x, target=x, loss_fn=_loss)
    torch.optim.SGD(pm_a.parameters(), lr=0.5).step()
    with warnings.catch_warnings():
        warnings.simplefilter("error", parallelizer.StaleModelWarning)
        b(x)
    with pytest.warns(parallelizer.StaleModelWarning):
        a(x)


def test_clipping_the_original_models_parameters_is_refused_and_pms_clip_as_one_device():
    """trial r13a: a DDP script's `clip_grad_norm_(model.parameters(), c)` with `model` still the original
    returned a norm of 0 and left pm's gradients unclipped, silently (DDP shares the tensors; we do not)."""
    model, ref, pm, x = _setup()
    pm.step(x, target=x * 10, loss_fn=_loss)
    _loss(ref(x), x * 10).backward()
    with pytest.raises(OptimizerError, match=r"clip_grad_norm_.*pm\.parameters\(\)") as info:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    assert info.value.parameter == "0.weight"
    with pytest.raises(OptimizerError, match=r"clip_grad_value_.*pm\.parameters\(\)"):
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
    norm = torch.nn.utils.clip_grad_norm_(pm.parameters(), 0.1)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    torch.testing.assert_close(norm, ref_norm)
    assert ref_norm > 1.0  # the clip is real: without it the gradients would be this much larger
    torch.nn.utils.clip_grad_value_(pm.parameters(), 0.001)
    torch.nn.utils.clip_grad_value_(ref.parameters(), 0.001)
    for (name, p), q in zip(pm.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_a_load_or_a_freeze_of_the_original_model_after_wrapping_is_warned_and_the_remedy_applies_it():
    """trial r13a: `model.load_state_dict(checkpoint)` (or `requires_grad_(False)`) on the model after
    auto_parallelize changed nothing the parallel module computes with: it ran and trained from the weights it
    was built with, silently (a DDP script does this: DDP shares the model's tensors). Warned at pm's next
    forward now; pm.load_full_state_dict applies the load."""
    import warnings

    model, _, pm, x = _setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm(x)
    assert not [w for w in caught if issubclass(w.category, parallelizer.StaleModelWarning)]
    torch.manual_seed(1)
    checkpoint = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6))
    model.load_state_dict(checkpoint.state_dict())
    with pytest.warns(parallelizer.StaleModelWarning, match=r"changed after wrapping.*'0\.weight'.*load_full_state_dict"):
        stale = pm(x)
    assert not torch.allclose(stale, checkpoint(x))  # what the warning is about: pm still runs the old weights
    pm.load_full_state_dict(checkpoint.state_dict())
    torch.testing.assert_close(pm(x), checkpoint(x))

    model, _, pm, x = _setup()
    model[2].weight.requires_grad_(False)
    with pytest.warns(parallelizer.StaleModelWarning, match=r"'2\.weight': its requires_grad"):
        pm(x)

    model, _, pm, x = _setup()
    model.eval()  # a validation loop written for DDP: the parallel module keeps its own mode (dropout stays on)
    with pytest.warns(parallelizer.StaleModelWarning, match=r"train/eval mode.*pm\.eval\(\)"):
        pm(x)
    assert pm.training


def test_an_ema_of_the_original_model_updated_after_wrapping_is_warned():
    """trial r13a: AveragedModel(model) made before wrapping and updated from `model` (a DDP script: DDP shares
    the model's tensors) averaged the untrained weights at every step, silently."""
    from torch.optim.swa_utils import AveragedModel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6))
    x = torch.randn(4, 6)
    ema = AveragedModel(model)
    pm = parallelizer.auto_parallelize(model, (x,))
    opt = torch.optim.SGD(pm.parameters(), lr=0.5)
    pm.step(x, target=x, loss_fn=_loss)
    opt.step()
    with pytest.warns(parallelizer.StaleModelWarning, match=r"AveragedModel\.update_parameters.*AveragedModel\(pm\)"):
        ema.update_parameters(model)
    assert torch.equal(ema.module[0].weight, model[0].weight)  # what it averaged: the untrained weights
    assert not torch.allclose(model[0].weight, pm.get_parameter("0.weight"))
