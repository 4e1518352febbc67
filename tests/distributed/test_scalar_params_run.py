"""A parameter that reaches its op as a 0-d tensor (`weight_norm(m, dim=None)`'s gain, F.prelu's single slope)
planned and trained on 2 gloo ranks against one device (round 16, r16a). Before, the rules of
aten._weight_norm and aten.prelu read that tensor's shape at a dim it does not have, and planning raised a raw
IndexError on ddp, fsdp and tp=2 alike. The rows now keep such a tensor Replicate (tests/rules/ samples cover
the 0-d calls); here the whole model plans and trains 3 AdamW steps as one device."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from plan_cases import random_cost_plan
from scalar_param_models import scalar_gains

pytestmark = pytest.mark.distributed
PLANS = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"}),
         "random": ({"tp": 2}, None)}


def _plan(kind):
    mesh, roles = PLANS[kind]
    if roles is None:
        return random_cost_plan(scalar_gains, mesh, {}, 7)
    model, inputs = scalar_gains()
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles)


@pytest.fixture(scope="module")
def reports():
    plans = {kind: _plan(kind) for kind in PLANS}
    got = rehearse_many([(scalar_gains, {}, plan) for plan in plans.values()], steps=3)
    return {kind: (plan, report) for (kind, plan), report in zip(plans.items(), got)}


@pytest.mark.parametrize("kind", sorted(PLANS))
def test_zero_dim_gains_and_slopes_plan_and_train_as_one_device(reports, kind):
    plan, report = reports[kind]
    # one norm over the whole weight keeps it whole: on tp it is stored Replicate, a recorded fallback
    assert all("_weight_norm" in f.reason for f in plan.fallbacks), plan.fallbacks
    ops = {n.op for n in plan.nodes.values()}
    assert "aten._weight_norm.default" in ops, sorted(ops)
    assert "aten.prelu.default" in ops, sorted(ops)
    assert report.matches(), report
