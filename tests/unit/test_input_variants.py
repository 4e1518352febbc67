"""Calls whose inputs differ from the traced example (trial r13c), on a one-device ParallelModule against the eager
model: each gives eager's numbers or a typed error naming the input, the traced and the given value, and a remedy.

- a mask of another dtype kind than traced (a bool mask where a float additive one was traced): the model branches
  on `mask.dtype`, the program had the traced branch baked in and added the bool mask as 0 / 1, silently off eager
  (only float -> other float was refused before); now a PlanMismatchError, as is float ids where int64 was traced
  (torch's embedding error from inside the program before). Integer width (int32 ids) still runs, as eager;
- None for an input traced as a tensor: torch's "Expected a proper Tensor but got None" (tp) or AttributeError
  "'NoneType' object has no attribute 'dim'" (dp) from inside the program; now a TypeError naming the input, the
  traced shape and dtype and the remedy;
- an input traced as a keyword passed positionally (`pm(ids, mask)` for `model(ids, mask=mask)`): a false
  TypeError, although the model takes it; now bound as Python binds it;
- a dict input with its keys in another order: a false TypeError "the nesting of the inputs differs" (dict keys are
  a set to the model, an order to pytree); now reordered as traced, and a missing / extra key or a list for a dict
  is named;
- `pm.step` under `torch.no_grad()` / `torch.inference_mode()`: autograd's "element 0 of tensors does not require
  grad" from backward; now a StepError before the forward.
"""
import pytest
import torch
from torch import nn

import parallelizer
from parallelizer.errors import PlanMismatchError
from parallelizer.runtime.step import StepError


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class _MaskedMixer(nn.Module):
    """(B, T) ids and a (B, T) mask -> (B, T, V) logits. The mask is additive (0 / -1e4) when floating and a keep
    mask when bool, as SDPA reads its attn_mask: the forward branches on the mask's dtype."""

    def __init__(self):
        super().__init__()
        self.emb, self.mix, self.head = nn.Embedding(20, 8), nn.Linear(8, 8), nn.Linear(8, 20)

    def forward(self, ids, mask=None):
        h = self.emb(ids)
        scores = h @ self.mix(h).transpose(1, 2)  # (B, T, T)
        if mask is not None:
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask[:, None, :], -1e4)
            else:
                scores = scores + mask[:, None, :]
        return self.head(scores.softmax(-1) @ h)


def _model_and_inputs():
    torch.manual_seed(0)
    model = _MaskedMixer()
    ids = torch.randint(0, 20, (4, 6))
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[:, -2:] = False
    additive = torch.zeros(4, 6).masked_fill(~keep, -1e4)
    return model, ids, keep, additive


def test_another_dtype_kind_is_refused_and_integer_width_runs():
    model, ids, keep, additive = _model_and_inputs()
    pm = parallelizer.auto_parallelize(model, (ids,), example_kwargs={"mask": additive})
    torch.testing.assert_close(pm(ids, mask=additive), model(ids, mask=additive))
    torch.testing.assert_close(pm(ids.int(), mask=additive), model(ids.int(), mask=additive))
    assert (model(ids, mask=keep) - model(ids, mask=additive)).abs().max() < 1e-4  # the same masking, both branches
    with pytest.raises(PlanMismatchError, match=r"input 'mask' has dtype torch.bool but the graph was traced \(and "
                                                r"planned\) with torch.float32(.|\n)*Remedy: cast it"):
        pm(ids, mask=keep)  # before: ran the float branch on the bool mask (adding 0 / 1): 0.98 off eager
    with pytest.raises(PlanMismatchError, match=r"input 'ids' has dtype torch.float32 but the graph was traced "
                                                r"\(and planned\) with torch.int64"):
        pm(ids.float(), mask=additive)


def test_none_for_a_traced_tensor_names_the_input_and_the_traced_tensor():
    model, ids, _, additive = _model_and_inputs()
    pm = parallelizer.auto_parallelize(model, (ids,), example_kwargs={"mask": additive})
    with pytest.raises(TypeError, match=r"input 'mask' is None but the graph was traced \(and planned\) with a "
                                        r"tensor of shape \(4, 6\) and dtype torch.float32(.|\n)*Remedy: pass a tensor"):
        pm(ids, mask=None)
    with pytest.raises(TypeError, match=r"input 'mask' is 0.0 but the graph was traced"):
        pm(ids, mask=0.0)


def test_a_traced_keyword_passed_positionally_binds_as_python_does():
    model, ids, _, additive = _model_and_inputs()
    pm = parallelizer.auto_parallelize(model, (ids,), example_kwargs={"mask": additive})
    torch.testing.assert_close(pm(ids, additive), model(ids, additive))
    torch.testing.assert_close(pm(ids=ids, mask=additive), model(ids=ids, mask=additive))
    with pytest.raises(TypeError, match=r"2 positional input\(s\), traced with 1"):
        pm(ids, additive, mask=additive)  # Python's "multiple values": still a TypeError


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_step_with_gradients_off_is_a_step_error(context):
    model, ids, _, additive = _model_and_inputs()
    pm = parallelizer.auto_parallelize(model, (ids,), example_kwargs={"mask": additive})
    loss_fn = lambda out, y: nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())  # noqa: E731
    with context(), pytest.raises(StepError, match=r"ParallelModule.step under torch.no_grad\(\) / "
                                                   r"torch.inference_mode\(\)(.|\n)*Remedy"):
        pm.step(ids, target=ids, loss_fn=loss_fn, mask=additive)
    loss = pm.step(ids, target=ids, loss_fn=loss_fn, mask=additive)  # gradients on again: the step runs
    torch.testing.assert_close(loss, loss_fn(model(ids, mask=additive), ids))


class _DictInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(6, 12), nn.Linear(4, 12), nn.Linear(12, 3)

    def forward(self, batch):
        return self.out(torch.relu(self.a(batch["x"]) + self.b(batch["y"])))


def test_a_dict_input_in_another_key_order_runs_and_other_keys_are_named():
    """A dict's keys are a set to the model; pytree compares them in order. Before: `pm({"y": y, "x": x})` was a
    TypeError "the nesting of the inputs differs", as were a missing or an extra key, without naming it."""
    torch.manual_seed(0)
    model = _DictInput()
    x, y = torch.randn(4, 6), torch.randn(4, 4)
    pm = parallelizer.auto_parallelize(model, ({"x": x, "y": y},))
    torch.testing.assert_close(pm({"y": y, "x": x}), model({"x": x, "y": y}))
    with pytest.raises(TypeError, match=r"inputs\[0\] has keys \['x'\], traced with \['x', 'y'\] \(missing \['y'\]\)"):
        pm({"x": x})
    with pytest.raises(TypeError, match=r"inputs\[0\] has keys \['x', 'y', 'z'\], traced with \['x', 'y'\] "
                                        r"\(unexpected \['z'\]\)"):
        pm({"x": x, "y": y, "z": y})
    with pytest.raises(TypeError, match=r"inputs\[0\] is a list where a dict was traced"):
        pm([x, y])


def test_an_input_on_another_device_is_named():
    """Before: torch's "Tensor on device meta is not on the expected device cpu!" from inside the program (on a GPU
    plan, a CPU batch would reach the program's ops and collectives the same way)."""
    model, ids, _, additive = _model_and_inputs()
    pm = parallelizer.auto_parallelize(model, (ids,), example_kwargs={"mask": additive})
    with pytest.raises(PlanMismatchError, match=r"input 'mask' is on device meta but the graph was traced \(and "
                                                r"planned\) with it on cpu(.|\n)*Remedy: move it there first"):
        pm(ids, mask=additive.to("meta"))


def test_pipeline_batch_checks_name_the_input_and_integer_widths_take_the_traced_dtype():
    """`global_tensor_inputs` (every pipeline step): a short last batch names the input as the caller wrote it
    (before: "an input or target of shape ..."); an int32 input where int64 was traced comes back int64 (the
    stages' buffers hold the traced dtype), one whose values the traced dtype cannot hold is refused."""
    from parallelizer.errors import PipelineError
    from parallelizer.runtime.microbatches import global_tensor_inputs

    model, ids, _, additive = _model_and_inputs()
    traced = parallelizer.trace(model, (ids[:2],), {"mask": additive[:2]})  # one of 2 microbatches
    with pytest.raises(PipelineError, match=r"input 'mask' of shape \(3, 6\) does not split into 2 microbatches"):
        global_tensor_inputs(traced, (ids,), {"mask": additive[:3]}, 2)
    flat = global_tensor_inputs(traced, (ids.int(),), {"mask": additive}, 2)
    assert flat[0].dtype == torch.int64 and torch.equal(flat[0], ids)
    narrow = parallelizer.trace(model, (ids[:2].int(),), {"mask": additive[:2]})
    with pytest.raises(PlanMismatchError, match=r"input 'ids' has dtype torch.int64 but the pipeline was traced "
                                                r"\(and planned\) with torch.int32, which cannot hold"):
        global_tensor_inputs(narrow, (ids + 2 ** 40,), {"mask": additive}, 2)


def test_pipeline_input_errors_give_the_callers_shapes_not_the_microbatchs():
    """A pipeline checks a call on its first microbatch; its errors name the shapes the caller passed and the
    whole traced batch (trial r24h: a (4, 3) call on a pipeline traced with (4, 6) in 2 microbatches was told
    "input 'ids' has shape (2, 3) but the graph was traced (and planned) with (2, 6)", shapes nobody passed; an
    (8, 6, 8) tensor where None was traced was "a tensor of shape (4, 6, 8)")."""
    from parallelizer.errors import ConstantInputError
    from parallelizer.runtime.microbatches import global_tensor_inputs

    model, ids, _, additive = _model_and_inputs()
    traced = parallelizer.trace(model, (ids[:2],), {"mask": additive[:2]})  # one of 2 microbatches
    with pytest.raises(PlanMismatchError, match=r"input 'ids' has shape \(4, 3\) but the graph was traced \(and "
                                                r"planned\) with \(4, 6\) \(2 pipeline microbatches\)(.|\n)*dim\(s\) 1 "
                                                r"\(3, traced 6\) differ"):
        global_tensor_inputs(traced, (ids[:, :3],), {"mask": additive[:, :3]}, 2)
    with pytest.raises(TypeError, match=r"input 'mask' is None but the graph was traced \(and planned\) with a "
                                        r"tensor of shape \(4, 6\)"):
        global_tensor_inputs(traced, (ids,), {"mask": None}, 2)
    unmasked = parallelizer.trace(model, (ids[:2],), {"mask": None})
    with pytest.raises(ConstantInputError, match=r"input 'mask' is a tensor of shape \(4, 6\) \(torch.float32\) but "
                                                 r"the graph was traced with None"):
        global_tensor_inputs(unmasked, (ids,), {"mask": additive}, 2)
    assert len(global_tensor_inputs(unmasked, (ids,), {}, 2)) == 1  # omitted: its traced default (None) filled in


class _OwnTarget(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, target=None):
        out = self.fc(x)
        return (nn.functional.cross_entropy(out, target), out) if target is not None else out


def test_a_model_input_named_like_a_step_argument_is_told_apart():
    """`pm.step(x, target=y)` for a model traced as `model(x, target=y)`: step keeps `target` as its loss target, so
    the model was called without it, and the TypeError "missing keyword(s) ['target']" told the caller to pass what
    they had passed. Now a StepError with the positional remedy, which runs as eager."""
    torch.manual_seed(0)
    model = _OwnTarget()
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])
    pm = parallelizer.auto_parallelize(model, (x,), example_kwargs={"target": y})
    with pytest.raises(StepError, match=r"traced with the keyword input\(s\) \['target'\], which step takes as its "
                                        r"own(.|\n)*Remedy: pass them to step positionally"):
        pm.step(x, target=y)
    torch.testing.assert_close(pm.step(x, y), model(x, target=y)[0].detach())
