"""The fp32 rehearsal's second judge (`runtime.rehearsal.float64_excess`): a float64 copy of the single-device
model tells rounding of a cancelling sum from a wrong term; `_same_computation` keeps it out when the float64
copy computed something else."""
import torch

from parallelizer.runtime.rehearsal import _same_computation, float64_excess
from parallelizer.runtime.tolerance import excess


def _cancelling_sum(order: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """The sum of `terms` (fp32) in the given order: a gradient that is 0 in exact arithmetic."""
    return terms[order].sum(0)


def test_rounding_of_a_cancelling_sum_passes_and_a_wrong_term_fails():
    gen = torch.Generator().manual_seed(0)
    half = torch.randn(512, 8, generator=gen, dtype=torch.float64) * 100
    terms64 = torch.cat([half, -half])  # sums to exactly 0
    exact = terms64.sum(0)
    terms = terms64.float()
    one_device = _cancelling_sum(torch.arange(1024), terms)
    sharded = _cancelling_sum(torch.randperm(1024, generator=gen), terms)  # another summation order
    assert excess(sharded, one_device) > 1  # the plain fp32 bound flags the rounding
    assert float64_excess(sharded, one_device, exact) <= 1
    assert float64_excess(one_device, one_device, exact) <= 1 / 8
    wrong = sharded + terms[0]  # a doubled term: off by the size of the values
    assert float64_excess(wrong, one_device, exact) > 1


def test_same_computation_only_when_the_float64_copy_agrees_with_the_fp32_model():
    gen = torch.Generator().manual_seed(1)
    out64 = torch.randn(16, 32, generator=gen, dtype=torch.float64)
    assert _same_computation([out64.float()], [out64])
    other_mask = out64 * (torch.rand(16, 32, generator=gen, dtype=torch.float64) > 0.1) / 0.9  # dropout redrawn
    assert not _same_computation([out64.float()], [other_mask])
    assert not _same_computation([out64.float()], [])
