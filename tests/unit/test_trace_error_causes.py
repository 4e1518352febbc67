"""Typed errors whose stated cause or remedy is checked against the facts the code can see (round 15, r15f).

Each translated export failure (`tracer/export_errors.translate`) named a cause guessed from the exception's
type or text: a device mismatch was always "the model is on meta, a factory call without device=" (also for a
CPU model given meta inputs), an input of the wrong shape or dtype was "make forward traceable by
torch.export(strict=False)", a wrong number of inputs pointed at inspect.py, `int(tensor)` was "Python control
flow", a random draw in other code above the failing line was "the condition is a random number". Each test
builds an input that reaches the branch through another cause than the one it was written for, checks that the
message names the true cause, and where the remedy is an action, that following it traces."""
import inspect

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer import TraceError, cli, presets


def _trace_error(model, args, kwargs=None) -> TraceError:
    with pytest.raises(TraceError) as info:
        parallelizer.trace(model, args, kwargs)
    return info.value


class _LinearBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.bn = nn.Linear(8, 8), nn.BatchNorm1d(8)

    def forward(self, x, y=None):
        h = self.bn(self.lin(x))
        return (h if y is None else h + y).sum()


def test_a_cpu_model_given_a_meta_input_names_the_input_not_a_factory_call():
    """Before: 'the model is on meta, the tensor is not: a factory call without device=' for a CPU model whose
    INPUT was on meta (no factory call anywhere)."""
    model = _LinearBatchNorm()
    err = _trace_error(model, (torch.randn(4, 8, device="meta"),))
    text = str(err)
    assert "an example input on another device than the model (example_inputs[0] on meta; the model's parameters " \
           "and buffers are on cpu)" in text, text
    assert "factory call" not in text and "model is on meta" not in text
    err = _trace_error(model, (torch.randn(4, 8),), {"y": torch.randn(4, 8, device="meta")})
    assert "example_kwargs['y'] on meta" in str(err), str(err)
    parallelizer.trace(model, (torch.randn(4, 8),))  # remedy 1: the inputs on the model's device
    parallelizer.trace(_LinearBatchNorm().to("meta"), (torch.randn(4, 8, device="meta"),))  # remedy 2: model on meta


class _ScaledLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return self.lin(x) * self.scale


def test_a_model_partly_on_meta_through_a_0_dim_buffer_names_both_devices():
    """A 0-dim buffer left on CPU (legacy constructor under `with torch.device('meta')`) kept the trace from moving
    the inputs to meta; the message blamed a factory call in forward."""
    model = _ScaledLinear()
    model.lin.to("meta")
    text = str(_trace_error(model, (torch.randn(4, 8),)))
    assert "a model whose parameters and buffers are on several devices (cpu: scale; meta: lin.weight, lin.bias)" \
           in text, text
    assert "factory call" not in text
    parallelizer.trace(model.to("meta"), (torch.randn(4, 8),))  # the remedy: the whole model on one device


class _PlainTensorAttribute(nn.Module):
    def __init__(self, registered: bool):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        if registered:
            self.register_buffer("offset", torch.ones(8), persistent=False)
        else:
            self.offset = torch.ones(8)

    def forward(self, x):
        return self.lin(x) + self.offset


def test_a_tensor_attribute_model_to_does_not_move_is_named():
    text = str(_trace_error(_PlainTensorAttribute(False).to("meta"), (torch.randn(4, 8),)))
    assert "a tensor kept as a plain module attribute, not a parameter or buffer (offset (cpu))" in text, text
    assert "register_buffer" in text and "factory call" not in text
    parallelizer.trace(_PlainTensorAttribute(True).to("meta"), (torch.randn(4, 8),))  # the remedy traces


class _ZerosWithoutDevice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) + torch.zeros(x.shape[0], 8)


def test_a_factory_call_without_device_keeps_its_message_with_the_devices_seen():
    text = str(_trace_error(_ZerosWithoutDevice().to("meta"), (torch.randn(4, 8),)))
    assert "made in forward on another device than the model's and its inputs' (they are on meta, the tensor on " \
           "cpu: a factory call without device=" in text, text


class _TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, y):
        return self.lin(x) + y


@pytest.mark.parametrize("args, kwargs, said", [
    ((torch.randn(4, 8),), {}, "missing a required argument: 'y'"),
    ((torch.randn(4, 8),) * 3, {}, "too many positional arguments"),
    ((torch.randn(4, 8),), {"y": torch.randn(4, 8), "z": torch.randn(2)}, "got an unexpected keyword argument 'z'"),
])
def test_inputs_that_do_not_fit_forward_name_its_signature(args, kwargs, said):
    """Before: 'its forward raised TypeError in code outside torch at .../inspect.py:3127' (the model's code was
    never called)."""
    err = _trace_error(_TwoInputs(), args, kwargs)
    expected = "cannot trace example inputs that do not fit _TwoInputs.forward(x, y) (" + said
    assert str(err).startswith(expected), str(err)
    assert err.location is None and "inspect.py" not in str(err) and "example_kwargs" in err.remedy


@pytest.mark.parametrize("model, args, eager_words", [
    (nn.Linear(8, 8), (torch.randn(4, 7),), "mat1 and mat2 shapes cannot be multiplied"),
    (nn.Conv2d(3, 4, 3), (torch.randn(3, 8),), "Expected 3D (unbatched) or 4D (batched) input to conv2d"),
    (nn.Embedding(10, 8), (torch.randn(4, 3),), "Expected tensor for argument #1 'indices'"),
    (nn.BatchNorm1d(8), (torch.randn(1, 8),), "Expected more than 1 value per channel when training"),
])
def test_an_input_the_model_rejects_eagerly_too_is_not_called_untraceable(model, args, eager_words):
    """Before: 'cannot trace the model (RuntimeError). Remedy: make forward traceable by torch.export(strict=False)'
    for inputs of the wrong shape, rank, dtype or batch, which the model rejects on one device just the same."""
    text = str(_trace_error(model, args))
    assert "it raises on these example inputs when called eagerly too (model(*inputs) raises" in text, text
    assert eager_words in text and "make forward traceable" not in text


def test_an_untraceable_error_on_meta_says_what_it_cannot_tell():
    text = str(_trace_error(nn.Linear(8, 8).to("meta"), (torch.randn(4, 7),)))
    assert "where no eager call tells an error of the model or its example inputs" in text, text
    assert "make forward traceable" not in text


class _SkipsDefaultMask(nn.Module):
    """SwitchTransformers' pattern (its default mask skipped under export), given an input of the wrong width."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, mask=None):
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones(x.shape[:-1])
        return self.lin(x).sum()


def test_a_tracing_branch_on_the_stack_is_not_the_cause_when_eager_fails_too():
    """Before: 'its code takes another path when traced than eagerly' for any error below such a test, also a
    wrong input width that fails the same way eagerly."""
    text = str(_trace_error(_SkipsDefaultMask(), (torch.randn(2, 3, 5),)))
    assert "another path" not in text and "when called eagerly too" in text, text
    parallelizer.trace(_SkipsDefaultMask(), (torch.randn(2, 3, 4),), {"mask": torch.ones(2, 3)})


class _ValueAsSize(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how, self.lin = how, nn.Linear(8, 8)

    def forward(self, x):
        if self.how == "int":
            n = int(x.abs().max().ceil())
            return self.lin(x).sum() + torch.zeros(n).sum()
        return self.lin(x).sum() + nn.functional.one_hot((x[:, 0] > 0).long()).sum()


@pytest.mark.parametrize("how, line", [("int", "n = int(x.abs().max().ceil())"), ("one_hot", "one_hot((x[:, 0]")])
def test_a_value_read_as_a_number_is_not_called_control_flow(how, line):
    err = _trace_error(_ValueAsSize(how), (torch.randn(4, 8),))
    assert err.construct.startswith("a tensor value read as a Python number or size (`") and line in err.construct, \
        err.construct
    assert "control flow" not in str(err) and "num_classes" in err.remedy


def _noisy(x):
    return x + torch.rand(x.shape) * 0.0


class _BranchBelowAHelperThatDraws(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return _noisy(x)
        return x


def test_a_random_draw_in_other_code_above_the_branch_is_not_named():
    """Before: the six-line window before the failing line crossed the function's start and named `_noisy`'s draw
    as 'the condition is a random number drawn in forward'."""
    lines, start = inspect.getsourcelines(_BranchBelowAHelperThatDraws.forward)
    assert start - inspect.getsourcelines(_noisy)[1] <= 6  # the draw is inside the old window
    text = str(_trace_error(_BranchBelowAHelperThatDraws(), (torch.randn(3),)))
    assert "data-dependent control flow" in text and "random" not in text, text


class _CtcLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 5)

    def forward(self, x, targets, input_lengths, target_lengths):
        logp = self.lin(x).log_softmax(-1).transpose(0, 1)
        return nn.functional.ctc_loss(logp, targets, input_lengths, target_lengths)


def test_an_op_without_fixed_shapes_that_selects_nothing_gets_no_masking_remedy():
    """ctc_loss has no output shapes export can fix (with tensor or list lengths); 'masking with torch.where
    instead of selecting' was no remedy for it."""
    args = (torch.randn(2, 6, 8), torch.randint(1, 5, (2, 3)), torch.tensor([6, 6]), torch.tensor([3, 2]))
    err = _trace_error(_CtcLoss(), args)
    assert "_ctc_loss" in err.construct and "torch.where" not in err.remedy and "outside forward" in err.remedy


class _InputData(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x.data).sum()


def test_data_of_an_input_is_named_as_such():
    assert "or of an input or activation (`x.data`)" in str(_trace_error(_InputData(), (torch.randn(4, 8),)))


class _TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)

    def forward(self, input_ids, attention_mask=None):
        batch, seq = input_ids.size()
        return self.emb(input_ids).sum()


def test_a_batch_dict_passed_positionally_is_named_with_the_keyword_remedy():
    ids = torch.randint(0, 16, (2, 5))
    err = _trace_error(_TokenModel(), ({"input_ids": ids, "attention_mask": torch.ones_like(ids)},))
    assert "model(*inputs) raises AttributeError: 'dict' object has no attribute 'size'" in err.remedy, err.remedy
    assert "example_inputs[0] is a dict whose keys (attention_mask, input_ids) are parameters of forward" in err.remedy
    parallelizer.trace(_TokenModel(), (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def failing_factory():
    raise RuntimeError("boom with defaults")


def item_factory(width: int = 8):
    n = int(torch.tensor(float(width)).item())  # a value read while building: meta tensors have none
    return nn.Linear(n, n), (torch.randn(2, n),)


def test_a_model_build_error_names_no_config_when_none_was_given_and_the_meta_device():
    """Before: 'Remedy: fix that --config value' for a factory that raised with no --config, and for one that
    only fails on the meta device `parallelizer plan` builds on."""
    with pytest.raises(presets.ModelBuildError) as info:
        presets.build(presets.recipe("test_trace_error_causes:failing_factory"), "meta")
    assert "no --config given" in str(info.value) and "fix that --config" not in str(info.value)
    with pytest.raises(presets.ModelBuildError) as info:
        presets.build(presets.recipe("test_trace_error_causes:item_factory"), "meta")
    assert "(on the meta device)" in str(info.value) and "the cause names meta tensors" in str(info.value)
    presets.build(presets.recipe("test_trace_error_causes:item_factory"), "cpu")  # it builds on CPU


def test_cli_paths_that_are_directories_or_in_missing_folders_are_one_error_line(tmp_path, capsys):
    """Before: `show DIR` and `plan -o DIR` ended in an IsADirectoryError traceback with exit code 1 (the code for
    'rehearsal numerics differ'), and `-o missing/plan.json` failed only after the whole solve."""
    assert cli.main(["show", str(tmp_path)]) == 2
    assert "Is a directory" in capsys.readouterr().err
    for out, said in ((tmp_path, "is a directory"), (tmp_path / "missing" / "plan.json", "does not exist")):
        argv = ["plan", "--model", "test_trace_error_causes:item_factory", "--mesh", "dp=2", "-o", str(out),
                "--no-progress"]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    assert cli.main(["plan", "--model", "test_trace_error_causes:item_factory", "--mesh", "dp=2", "-o",
                     str(tmp_path / "plan.json"), "--no-progress"]) == 2  # item_factory fails on meta, typed
    assert "a meta tensor does not have" in capsys.readouterr().err


class _Select(nn.Module):
    def __init__(self):
        super().__init__()
        self.select = False

    def forward(self, h):
        return h[h > 0] if self.select else h


class _Switchable(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.gate = nn.Linear(8, 8), _Select()

    def forward(self, x):
        return self.gate(self.lin(x)).sum()


def test_a_setting_changed_after_wrapping_gets_the_update_bn_recipe_only_for_momentum_none():
    """Before: any setting changed after auto_parallelize whose retrace failed got 'update_bn sets BatchNorm
    momentum=None ... momentum = 1 / k' as its remedy (here a model without BatchNorm)."""
    x = torch.randn(8, 8)
    try:
        pm = parallelizer.auto_parallelize(_Switchable(), (x,), cluster="h100:1x1")
        pm.gate.select = True
        with pytest.raises(TraceError) as info:
            pm(x)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    text = str(info.value)
    assert "settings changed after the ParallelModule was built (gate.select=True)" in text, text
    assert "update_bn" not in text and "output size depends on tensor values" in info.value.remedy


class _LinearNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.bn = nn.Linear(8, 8), nn.BatchNorm1d(8)

    def forward(self, x, y=None):
        return self.bn(self.lin(x)).sum()


def test_calls_of_a_parallel_module_with_other_inputs_name_what_differs():
    """Before: pm((x,)) (a tuple where a tensor was traced) was a raw AttributeError ('NoneType' object has no
    attribute '__name__') from the message builder; a (4, 7) input for a (4, 8) trace was told to 'drop or pad
    the last short batch'; an eval call whose first call had the plan's shapes was said to have been traced at
    other shapes than the plan's."""
    x = torch.randn(4, 8)
    try:
        pm = parallelizer.auto_parallelize(_LinearNorm(), (x,), cluster="h100:1x1")
        for call in ((x,), [x]):
            with pytest.raises(parallelizer.InputMismatchError, match=r"inputs\[0\] is a (tuple|list) where a "
                                                                      r"tensor was traced") as info:
                pm(call)
            assert isinstance(info.value, TypeError)
        with pytest.raises(parallelizer.PlanMismatchError) as info:
            pm(torch.randn(4, 7))
        assert "dim(s) 1 (7, traced 8) differ, not only the batch" in str(info.value)
        assert "short batch" not in str(info.value)
        with pytest.raises(parallelizer.PlanMismatchError, match=r"it has 3 dim\(s\), traced with 2"):
            pm(torch.randn(4, 8, 1))
        pm.eval()
        pm(x)
        with pytest.raises(parallelizer.PlanMismatchError) as info:
            pm(torch.randn(6, 8))
        assert "short batch" in str(info.value) and "in mode" not in str(info.value), str(info.value)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_an_input_of_an_unsupported_type_is_named_as_the_caller_passed_it():
    """Before: 'an input of type ndarray (inputs[0][0])', the path inside the (args, kwargs) pair."""
    import numpy as np
    err = _trace_error(nn.Linear(8, 8), (torch.randn(4, 8),), {"extra": {"w": np.ones(2)}})
    assert "an input of type ndarray (example_kwargs['extra']['w'])" in str(err), str(err)
    assert "(example_inputs[0])" in str(_trace_error(nn.Linear(8, 8), (np.ones((4, 8)),)))


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        return (self.lin(x) * scale).sum()


def test_a_constant_input_of_another_value_is_a_typed_error():
    """Before: a plain ValueError (with a remedy) from the toolkit; now a PlanMismatchError that is a ValueError."""
    x = torch.randn(4, 8)
    try:
        pm = parallelizer.auto_parallelize(_Scaled(), (x,), example_kwargs={"scale": 0.5}, cluster="h100:1x1")
        with pytest.raises(parallelizer.ConstantInputError, match=r"input 'scale' is 0.7 but the graph was traced "
                                                                  r"with 0.5") as info:
            pm(x, scale=0.7)
        assert isinstance(info.value, ValueError) and isinstance(info.value, parallelizer.ParallelizerError)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
