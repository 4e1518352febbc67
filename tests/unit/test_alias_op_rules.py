"""unsafe_chunk / unsafe_split / unsafe_split_with_sizes / atleast_1d / 2d / 3d have verified rules (rows of
`rules.rows_tensor`, run by tests/rules/test_rule_harness.py): on a batch-sharded activation under a data role
they keep the batch sharded (no fallback, no gather), and a write through unsafe_chunk plans (r18h: 3 typed
refusals, InfeasiblePlanError, because these ops had no rule and were replicated)."""
import contextlib
import io
import os
import sys

import pytest

import parallelizer
from parallelizer.core.layout import Layout, Shard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "distributed"))
from alias_op_models import OP, WHICH, alias_op  # noqa: E402


@pytest.mark.parametrize("which", WHICH)
def test_alias_ops_keep_the_batch_sharded_under_data_roles(which):
    model, inputs = alias_op(which)
    traced = parallelizer.trace(model, inputs)
    op = f"aten.{OP.get(which, which)}."
    (name,) = [n for n, info in traced.nodes.items() if info.op_name.startswith(op)]
    for role in ("ddp", "fsdp"):
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": role})
        assert not [f for f in plan.fallbacks if f.node == name], (which, role, plan.fallbacks)
        (used,) = Layout.parse(plan.nodes[name].inputs[0]).placements
        assert used == Shard(0), (which, role, plan.nodes[name].strategy)
        moved = [(e.src, e.dst, s.kind) for e, s in plan.steps() if e.dst != "output"
                 and s.kind in ("all_gather", "all_to_all") and not e.src.startswith("p_")]
        assert not moved, (which, role, moved)  # (fsdp's parameter all-gathers aside)
