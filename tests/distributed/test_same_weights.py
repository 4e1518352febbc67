"""Ranks that built different weights are told so (a typed error naming the tensor), instead of each keeping
its own "replica" for the whole run (torch's DDP broadcasts rank 0's weights for the same reason)."""
import pytest
import torch

from parallelizer.runtime import spawn
from parallelizer.runtime.launch import DistributedError

pytestmark = pytest.mark.distributed


def _build_and_check(rank: int, world_size: int, same: bool) -> str:
    from parallelizer.runtime.replicas import check_same_weights
    torch.manual_seed(0 if same else rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    check_same_weights(model)
    return "ok"


def test_equal_weights_pass_and_different_weights_are_named():
    assert spawn(_build_and_check, 2, True, timeout_s=120) == ["ok", "ok"]
    with pytest.raises(DistributedError, match=r"PlanMismatchError: the ranks built different weights.*'0\.weight'"):
        spawn(_build_and_check, 2, False, timeout_s=120)


def _complex_imag_differs(rank: int, world_size: int) -> str:
    """A complex parameter (FNO's spectral weights) whose imaginary parts differ between the ranks, real
    parts equal."""
    from parallelizer.runtime.replicas import check_same_weights
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.complex(torch.ones(2, 3), torch.full((2, 3), float(rank))))
    check_same_weights(model)
    return "ok"


def test_complex_weights_differing_in_their_imaginary_parts_are_named():
    """Round 12 (r12b): the digest cast complex tensors with `.double()`, which drops the imaginary parts (a
    ComplexWarning), so ranks whose complex weights differed there passed the check and trained apart."""
    with pytest.raises(DistributedError, match=r"PlanMismatchError: the ranks built different weights.*'w'"):
        spawn(_complex_imag_differs, 2, timeout_s=120)
