"""torch.cov / torch.corrcoef under torch.export: a TraceError naming the op, why export cannot follow it, and a
remedy whose code, run as written, traces and equals the op on one device (round 18 r18a refused both with the
generic 'another path when traced' remedy)."""
import re

import pytest
import torch

import parallelizer
from parallelizer import TraceError
from parallelizer.tracer.export_errors import CORRCOEF_CODE, COV_CODE


class _Stat(torch.nn.Module):
    def __init__(self, op: str):
        super().__init__()
        self.l, self.op = torch.nn.Linear(6, 4), op

    def forward(self, x):
        h = self.l(x).T  # (features, batch): rows the variables
        if self.op == "cov":
            return torch.cov(h).sum()
        if self.op == "corrcoef":
            return h.corrcoef().sum()
        return torch.cov(h).sum() + torch.corrcoef(h).sum()


class _Remedy(torch.nn.Module):
    def __init__(self, code: str):
        super().__init__()
        self.l, self.code = torch.nn.Linear(6, 4), code

    def forward(self, x):
        scope = {"x": self.l(x).T}
        exec(self.code, {}, scope)  # the remedy's text, as the message gives it
        return scope["c"]


@pytest.mark.parametrize("op, names", [("cov", ("torch.cov",)), ("corrcoef", ("torch.corrcoef",)),
                                       ("both", ("torch.cov", "torch.corrcoef"))])
def test_cov_and_corrcoef_name_the_op_and_a_remedy_that_traces_and_matches(op, names):
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TraceError) as err:
        parallelizer.trace(_Stat(op), (x,))
    text = str(err.value)
    for name in names:
        assert name in text, text
    assert "export cannot follow" in text and "test_trace_errors_statistics.py" in text, text
    code = re.search(r"`(xc = .*?)`", text).group(1)
    assert code == (COV_CODE if op == "cov" else CORRCOEF_CODE)
    torch.manual_seed(0)
    model = _Remedy(code)
    traced = parallelizer.trace(model, (x,))  # the remedy traces
    h = model.l(x).T
    want = torch.cov(h) if op == "cov" else torch.corrcoef(h)
    torch.testing.assert_close(traced.exported.module()(x), want)
    torch.testing.assert_close(model(x), want)
