"""Optimizers that read a statistic along one dim, or at some tensor ranks only, on a parallel module's pieces
(round 26, r26b; `runtime.optimizer_check`).

The optimizer probe split one (4, 6) tensor along its columns, so three kinds of per-tensor update were called
per-element and stepped the local shards of fsdp / tp plans silently: a column normalisation (a statistic over
dim 0: Scion's ColNorm), a norm of biases only, a norm of conv weights only (`optimizer_dims_workers.RULES`).
Now each is refused on every rank before it touches a shard, naming the kind and a sharded parameter; under ddp
(whole tensors on every rank) they run and equal the model on one device, and plain SGD equals it on every plan.
One launch of 2 gloo ranks; Conv1d -> Linear, 2 SGD steps (lr 0.1).
"""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from optimizer_dims_workers import conv_head, per_dim_steps

pytestmark = pytest.mark.distributed
PLANS = {"fsdp2": ({"dp": 2}, {"dp": "fsdp"}), "tp2": ({"tp": 2}, {"tp": "tp"}), "ddp2": ({"dp": 2}, {"dp": "ddp"})}


@pytest.fixture(scope="module")
def results():
    model, inputs = conv_head()
    traced = parallelizer.trace(model, inputs)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        specs = {name: spec_from_plan(parallelizer.plan(traced, mesh, axis_roles=roles))
                 for name, (mesh, roles) in PLANS.items()}
    return spawn(per_dim_steps, 2, specs, timeout_s=600)


def test_per_tensor_updates_are_refused_on_shards_and_equal_one_device_on_whole_tensors(results):
    """Before (main 5abdc2f), fsdp / tp stepped the shards: parameters up to 0.2 (colnorm, fsdp) off one device
    after 2 steps (tests/unit/test_optimizer_check.py checks the kinds)."""
    for rank, per_case in enumerate(results):
        for (plan, rule), r in per_case.items():
            if plan == "ddp2" or rule == "plain":
                assert r["error"] is None, (rank, plan, rule, r["error"])
                for fqn, want in r["reference"].items():
                    torch.testing.assert_close(r["state"][fqn], want,
                                               msg=lambda m, f=fqn, k=(rank, plan, rule): f"{k} {f}: {m}")
            else:
                assert r["error"] is not None and r["error"][0] == "per-tensor" and r["unchanged"], (rank, plan, rule, r["error"])
