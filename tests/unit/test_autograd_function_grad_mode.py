"""torch.autograd.Functions whose forward turns gradients off inside, or whose backward writes the gradients of
modules passed to it (round 10a, transformers' Reformer).

`Function.apply` runs forward with grad mode off and turns it back on in C++, where torch.export does not see it:
a `torch.no_grad()` block inside forward left the rest of forward and every LATER op of the model exported under
no_grad, so the traced program had no gradient at all after the Function (every rank raised "element 0 of tensors
does not require grad"; with another path to the loss, gradients silently missing). Before, the check of the
Function's backward compared only its inputs' gradients and gave up (a warning) when the modules passed to it were
float32; Reformer's reversible layers (run under no_grad, their gradients computed in backward) were only warned."""
import pytest
import torch

import parallelizer
from parallelizer.errors import TraceError


def _recomputed_input_grad(ctx, g):
    """Backward of x + ctx.layer(x) by recomputing it: accumulates the layer's parameter gradients and returns x's."""
    (x,) = ctx.saved_tensors
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        torch.autograd.backward(x + ctx.layer(x), g)
    return x.grad


class _NormByMax(torch.autograd.Function):
    """x / (max|x| + 1) with the scale held constant in backward: the derivative of the forward's traced ops,
    since the scale is computed under no_grad (a stop-gradient in the program too)."""

    @staticmethod
    def forward(ctx, x):
        with torch.no_grad():
            scale = x.abs().amax() + 1.0
        ctx.save_for_backward(scale)
        return x / scale

    @staticmethod
    def backward(ctx, g):
        (scale,) = ctx.saved_tensors
        return g / scale


class _Reversible(torch.autograd.Function):
    """Reformer's RevNet in small: forward runs `layer` under no_grad, backward recomputes it and accumulates
    the layer's parameter gradients itself. `cache`, when given, is appended to (a re-run sees it filled)."""

    @staticmethod
    def forward(ctx, x, layer, cache):
        if cache is not None:
            if cache:
                raise RuntimeError("cache already filled")
            cache.append(1)
        ctx.layer = layer
        ctx.save_for_backward(x)
        with torch.no_grad():
            return x + layer(x)

    @staticmethod
    def backward(ctx, g):
        return _recomputed_input_grad(ctx, g), None, None


class _ScaledParamGrad(torch.autograd.Function):
    """layer(x) with a backward that accumulates twice the layer's parameter gradients (a hand-written backward
    with a mistake): the inputs' gradient is right, the parameters' is not."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        ctx.save_for_backward(x)
        return layer(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            y = ctx.layer(x)
            torch.autograd.backward(y, 2 * g, inputs=list(ctx.layer.parameters()))
            (gx,) = torch.autograd.grad(ctx.layer(x), x, g)
        return gx, None


class _Plain(torch.autograd.Function):
    """x + layer(x) with a recomputing backward that is its derivative (the layer's gradients accumulated)."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        ctx.save_for_backward(x)
        return x + layer(x)

    @staticmethod
    def backward(ctx, g):
        return _recomputed_input_grad(ctx, g), None


class _Net(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.a, self.b, self.c = kind, torch.nn.Linear(6, 6), torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        if self.kind == "norm":
            h = _NormByMax.apply(h)
        elif self.kind == "scaled":
            h = _ScaledParamGrad.apply(h, self.b)
        elif self.kind == "plain":
            h = _Plain.apply(h, self.b)
        else:
            h = _Reversible.apply(h, self.b, [] if self.kind == "cached" else None)
        return self.c(torch.tanh(h)).square().mean()


@pytest.mark.parametrize("kind", ["norm", "reversible", "cached"])
def test_a_function_whose_forward_turns_gradients_off_is_a_trace_error(kind):
    """Before: a warning (or nothing), then every rank raised "element 0 of tensors does not require grad" (c's ops
    exported under no_grad), or with another path to the loss gradients silently missing (a.*, b.*). Now a
    TraceError naming the Function, with the checkpoint remedy; `cached` (a list argument the traced call fills,
    Reformer's cache) could not even be re-run by the check."""
    with pytest.raises(TraceError, match=r"_NormByMax|_Reversible") as err:
        parallelizer.trace(_Net(kind), (torch.randn(5, 6),))
    assert "turns gradients off" in str(err.value) and "checkpoint" in err.value.remedy


def test_a_function_writing_wrong_gradients_of_a_module_passed_to_it_is_a_trace_error():
    """The layer's parameter gradients (accumulated in backward, 2x) are compared too, in float32 since the
    layer is float32 (before: the float64 check raised on the dtype and only warned)."""
    with pytest.raises(TraceError, match=r"_ScaledParamGrad.*not the derivative"):
        parallelizer.trace(_Net("scaled"), (torch.randn(5, 6),))


def test_a_function_whose_backward_is_the_derivative_of_its_module_traces_and_later_ops_keep_gradients():
    """A correct layer-calling Function (no grad-mode change): traced, noted as checked in the traced dtypes, and
    every parameter's gradient of the traced program equals eager's."""
    torch.manual_seed(0)
    model, x = _Net("plain"), torch.randn(5, 6)
    tg = parallelizer.trace(model, (x,))
    assert any("_Plain" in n and "equals their derivative" in n and "traced dtypes" in n for n in tg.notes), tg.notes
    model(x).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    traced = tg.exported.module()
    for p in (*model.parameters(), *traced.parameters()):
        p.grad = None
    traced(x).backward()
    got = dict(traced.named_parameters())
    for n, g in ref.items():
        torch.testing.assert_close(got[n].grad, g)


class _XDropout(torch.autograd.Function):
    """DeBERTa-v2's / SEW-D's XDropout: a bernoulli mask drawn in forward, the same mask in backward."""

    @staticmethod
    def forward(ctx, x):
        mask = torch.rand_like(x) < 0.25
        ctx.save_for_backward(mask)
        return x.masked_fill(mask, 0) / 0.75

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g.masked_fill(mask, 0) / 0.75


class _WithXDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)

    def forward(self, x):
        return _XDropout.apply(self.a(x)).sum()


def test_a_function_drawing_random_numbers_is_checked_with_the_same_draws():
    """SEW-D and DeBERTa-v2 with their default dropout (0.1) were refused: the check ran the Function's backward
    and the derivative of its forward on two different masks (they differed by 2.39 on SEW-D). Both now draw
    from the same generator state: the Function traces, noted as checked."""
    tg = parallelizer.trace(_WithXDropout(), (torch.randn(5, 6),))
    assert any("_XDropout" in n and "equals their derivative" in n for n in tg.notes), tg.notes


class _STE(torch.autograd.Function):
    """A straight-through estimator: rounds to 4 levels in forward (derivative zero almost everywhere), passes the
    gradient through unchanged in backward."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x.clamp(-1, 1) * 2) / 2

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Quantised(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.c = torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.c(_STE.apply(self.a(x))).square().mean()


def test_a_straight_through_estimator_gets_the_detach_remedy():
    """Its forward's ops have a zero derivative (not a detached forward), so the remedy is the detach form that
    works, x + (f(x) - x).detach(); before (trial r19g) it got the reversible layer's checkpoint remedy."""
    with pytest.raises(TraceError, match=r"_STE.*not the derivative") as err:
        parallelizer.trace(_Quantised(), (torch.randn(5, 6),))
    assert "x + (f(x) - x).detach()" in err.value.remedy and "RevNet" not in err.value.remedy
