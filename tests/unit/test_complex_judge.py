"""Complex values in the checks and norms (round 12, trial r12a): `.double()` of a complex tensor keeps only its
real part, so the rehearsal judged 1+1j against 1+5j a match (ratio 0), the eager check and the replica
checksum missed differences in imaginary parts, and the global gradient norm left out the imaginary parts
(`parallelizer.tracer.graph.as_real`). Expected values are computed here from the complex numbers directly."""
import math

import pytest
import torch

from parallelizer.core.layout import Layout
from parallelizer.core.mesh import MeshSpec
from parallelizer.runtime.grad_norm import global_norm
from parallelizer.runtime.rehearsal import _max_diff, float64_excess, recipe_excess
from parallelizer.runtime.tolerance import excess
from parallelizer.tracer.eager_check import _worst

A = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.cfloat)
B = torch.tensor([1 + 5j, 2 - 1j], dtype=torch.cfloat)  # differs only in an imaginary part, by 4


def test_a_difference_in_an_imaginary_part_is_outside_the_bound():
    rtol, atol = 1.3e-6, 1e-5  # torch.testing's float32 defaults, per real and imaginary part
    assert excess(A, B) == pytest.approx(4 / (atol + rtol * 5), rel=1e-6)  # before: 0.0
    assert excess(B, B) == 0.0
    assert excess(A.conj(), A.conj()) == 0.0  # a lazily conjugated tensor is compared by its values


def test_the_rehearsal_reports_the_imaginary_difference():
    worst, name, ratio = _max_diff([("w", A, B)], None)
    assert (worst, name) == (4.0, "w") and ratio > 1e4
    assert float64_excess(A, B, B) > 1e4  # the float64 re-check does not excuse it
    assert recipe_excess(A, B, B) == math.inf  # the recipe changed nothing, the program did


def test_the_eager_check_names_an_imaginary_difference():
    found = _worst([(0, A, B)])
    assert found is not None and found[1] == 4.0


def test_as_real_is_a_view_of_complex_pairs_and_leaves_real_tensors():
    from parallelizer.tracer.graph import as_real

    assert as_real(A).shape == (2, 2) and as_real(A).data_ptr() == A.data_ptr()
    real = torch.ones(3)
    assert as_real(real) is real


@pytest.mark.parametrize("norm_type", [2.0, 3.0, math.inf])
def test_the_global_norm_of_complex_gradients_is_the_norm_of_their_magnitudes(norm_type):
    g = torch.randn(5, 3, dtype=torch.cfloat, generator=torch.Generator().manual_seed(0))
    r = torch.randn(4, generator=torch.Generator().manual_seed(1))
    mesh = MeshSpec(("dp",), (1,))
    for tensors in ([g, r], [r, g]):  # complex first (the dtype of the result) and second
        total = global_norm([(t, Layout.replicate(1)) for t in tensors], mesh, {"dp": [0]}, norm_type)
        mags = torch.cat([g.abs().reshape(-1).double(), r.abs().double()])
        want = mags.max() if math.isinf(norm_type) else mags.pow(norm_type).sum().pow(1 / norm_type)
        assert total.dtype == torch.float32
        assert total.item() == pytest.approx(want.item(), rel=1e-6)
        assert total.item() == pytest.approx(torch.nn.utils.get_total_norm(tensors, norm_type).item(), rel=1e-6)


class _BatchFFT(torch.nn.Module):
    """Mixes the samples of its batch in a COMPLEX output (an fft over dim 0)."""

    def forward(self, x):
        return torch.fft.fft(x, dim=0)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.mix = torch.nn.Linear(4, 4), _BatchFFT()

    def forward(self, x):
        return self.lin(self.mix(x).abs())


def test_a_module_mixing_the_batch_in_a_complex_output_is_named():
    from parallelizer.tracer.microbatch_check import microbatch_mixing

    torch.manual_seed(0)
    model, x = _Net(), torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    whole = torch.fft.fft(x, dim=0)
    parts = torch.cat([torch.fft.fft(p, dim=0) for p in x.tensor_split(2)])
    assert (whole - parts).abs().max() > 0.1  # independently: the microbatches compute another value
    where, message = microbatch_mixing(model, (x,), {}, 2)
    assert where == "mix", (where, message)  # before: its complex output was skipped and 'lin' was named


class _ToComplexWrongGrad(torch.autograd.Function):
    """Real pairs -> complex values, with a backward that is NOT the derivative of the forward (x 3)."""

    @staticmethod
    def forward(ctx, x):
        return torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * 2

    @staticmethod
    def backward(ctx, g):
        return torch.view_as_real(g).reshape(*g.shape[:-1], -1) * 6  # the derivative is 2 (conj-linear), not 6


class _ComplexHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x):
        return _ToComplexWrongGrad.apply(self.a(x)).abs().sum()


def test_an_autograd_function_with_complex_outputs_is_checked():
    """Its complex output was skipped by the check (only floating outputs were seeded), so the wrong backward
    passed with neither error nor note, and every parallel program would train with the forward's derivative
    while eager uses the Function's backward."""
    import parallelizer
    from parallelizer.errors import TraceError

    model, x = _ComplexHead(), torch.randn(3, 4)
    x.requires_grad_(False)
    eager = torch.autograd.grad(model(x), model.a.weight)[0]
    plain = torch.autograd.grad(torch.view_as_complex(model.a(x).reshape(3, 2, 2)).mul(2).abs().sum(),
                                model.a.weight)[0]
    assert (eager - 3 * plain).abs().max() < 1e-5  # independently: eager's gradient is 3x the derivative's
    with pytest.raises(TraceError, match="_ToComplexWrongGrad"):
        parallelizer.trace(model, (x,))
