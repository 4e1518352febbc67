"""`pm.step(x, labels=y)` on a model traced without `labels=` (trial r9e, a ViT): the StepError said "call the
model so that it returns its loss first (e.g. transformers models given labels=)", which the caller had done;
it now names the keyword the trace lacks and the remedy (example_kwargs)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.runtime.step import StepError


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class _Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)

    def forward(self, x, labels=None):
        logits = self.lin(x)
        return logits if labels is None else (F.cross_entropy(logits, labels), logits)


def test_a_keyword_the_trace_lacks_is_named():
    torch.manual_seed(0)
    model = _Classifier()
    x, y = torch.randn(4, 5), torch.randint(0, 3, (4,))
    pm = parallelizer.auto_parallelize(model, (x,))
    with pytest.raises(StepError, match=r"traced without the keyword input\(s\) \['labels'\].*example_kwargs"):
        pm.step(x, labels=y)
    with pytest.raises(StepError, match="e.g. transformers models given labels="):  # no keyword: as before
        pm.step(x)


def test_traced_with_the_keyword_the_step_runs_the_models_loss():
    torch.manual_seed(0)
    model = _Classifier()
    x, y = torch.randn(4, 5), torch.randint(0, 3, (4,))
    pm = parallelizer.auto_parallelize(model, (x,), example_kwargs={"labels": y})
    torch.testing.assert_close(pm.step(x, labels=y), model(x, labels=y)[0].detach())
