"""A mode traced again (eval) keeps the shapes of its first call; a later call with the plan's own batch was refused
as "traced (and planned) with (3, ...)", though the plan was made for batch 8 (trial r9c). The error now says
the eval program was traced at its first call's shapes and gives the plan's; the values of the eval calls that
run equal eager eval."""
import pytest
import torch
from torch import nn

import parallelizer
from parallelizer.errors import PlanMismatchError


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_eval_batch_mismatch_names_the_modes_first_call_and_the_plans_shape():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    x8, x3 = torch.randn(8, 6), torch.randn(3, 6)
    pm = parallelizer.auto_parallelize(model, (x8,))
    pm.eval(); model.eval()
    with torch.no_grad():
        torch.testing.assert_close(pm(x3), model(x3))
        with pytest.raises(PlanMismatchError) as err:
            pm(x8)
    text = str(err.value)
    assert "in mode eval" in text and "first call" in text and "(8, 6)" in text, text
