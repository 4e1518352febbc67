"""Trial r13a: module backward hooks registered on the model before tracing. torch.export keeps no trace of them,
so every plan (and the one-device program) ran backward without them, silently: a pre-hook halving a Linear's
grad_output left every gradient before it 2x one device's. Now a TraceError names the module and the remedy;
the remedy (the hook on the ParallelModule itself) trains as the model with its hook does."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as nn_module

import parallelizer
from parallelizer.errors import TraceError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, 10)
        self.l2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(F.gelu(self.l1(x)))


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


X = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def _halve_grad_output(module, grad_output):
    return (grad_output[0] * 0.5,)


def _halve_grad_input(module, grad_input, grad_output):
    return (grad_input[0] * 0.5,)


@pytest.mark.parametrize("register, kind", [
    (lambda m: m.l2.register_full_backward_pre_hook(_halve_grad_output), "l2 (Linear): a backward pre-hook"),
    (lambda m: m.l2.register_full_backward_hook(_halve_grad_input), "l2 (Linear): a backward hook"),
    (lambda m: m.register_full_backward_hook(_halve_grad_input), "Net (Net): a backward hook"),
])
def test_a_module_backward_hook_is_refused_when_tracing(register, kind):
    model = _net()
    register(model)
    with pytest.raises(TraceError, match="module backward hooks") as err:
        parallelizer.trace(model, (X,))
    assert kind in str(err.value) and "Remedy" in str(err.value), str(err.value)


def test_a_global_module_backward_hook_is_refused_and_forward_hooks_still_trace():
    handle = nn_module.register_module_full_backward_pre_hook(_halve_grad_output)
    try:
        with pytest.raises(TraceError, match="global backward pre-hook"):
            parallelizer.trace(_net(), (X,))
    finally:
        handle.remove()
    model = _net()
    model.l1.register_forward_hook(lambda m, args, out: out * 2)  # forward hooks are traced into the program
    expected = model(X)
    pm = parallelizer.auto_parallelize(model, (X,), cluster="h100:1x1")
    torch.testing.assert_close(pm(X), expected)

def test_the_remedy_a_backward_pre_hook_on_the_parallel_module_trains_as_the_hooked_model():
    reference = _net()
    reference.register_full_backward_pre_hook(_halve_grad_output)
    reference(X).pow(2).mean().backward()
    pm = parallelizer.auto_parallelize(_net(), (X,), cluster="h100:1x1")
    pm.register_full_backward_pre_hook(_halve_grad_output)
    pm(X).pow(2).mean().backward()
    unhooked = _net()
    unhooked(X).pow(2).mean().backward()
    for name, p in pm.named_parameters():
        torch.testing.assert_close(p.grad, reference.get_parameter(name).grad)
        assert not torch.allclose(p.grad, unhooked.get_parameter(name).grad)
