"""In-place ops written through slices of activations (`F.elu(h[..., 2:6], inplace=True)`, `abs_().sqrt_()`,
`lerp_`, `addcmul_`, `clamp_` with 0-d tensor bounds, `pow_`, `masked_fill_` with a 0-d tensor value) planned on
ddp, fsdp, tp=2 and random costs, and trained on 2 gloo ranks against one device (round 17, r17a). Before, these
in-place ops (or overloads: masked_fill_.Tensor, clamp_.Tensor) had no verified row and ran replicated; the
data-parallel roles cannot replicate an activation, so every ddp / fsdp plan of this per-sample model was an
InfeasiblePlanError blaming "an op that pairs samples across the batch". Now every such op has its rule (the
out-of-place rule, the written input keeping its layout) and no fallback is left."""
import contextlib
import io

import pytest

import parallelizer
from inplace_view_models import inplace_slices
from parallelizer.runtime.rehearsal import rehearse_many
from plan_cases import random_cost_plan

pytestmark = pytest.mark.distributed
PLANS = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"}),
         "random": ({"dp": 2}, None)}


def _plan(kind):
    mesh, roles = PLANS[kind]
    if roles is None:
        return random_cost_plan(inplace_slices, mesh, {}, 17)
    model, inputs = inplace_slices()
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles)


@pytest.fixture(scope="module")
def reports():
    plans = {kind: _plan(kind) for kind in PLANS}
    got = rehearse_many([(inplace_slices, {}, plan) for plan in plans.values()], steps=3)
    return {kind: (plan, report) for (kind, plan), report in zip(plans.items(), got)}


@pytest.mark.parametrize("kind", sorted(PLANS))
def test_inplace_ops_on_slices_plan_without_fallback_and_train_as_one_device(reports, kind):
    plan, report = reports[kind]
    assert not plan.fallbacks, plan.fallbacks
    ops = {n.op for n in plan.nodes.values()}
    for op in ("aten.elu_.default", "aten.hardswish_.default", "aten.sqrt_.default", "aten.lerp_.Scalar",
               "aten.addcmul_.default", "aten.clamp_.Tensor", "aten.pow_.Scalar", "aten.masked_fill_.Tensor"):
        assert op in ops, sorted(ops)
    assert report.matches(), report
