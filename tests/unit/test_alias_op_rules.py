"""unsafe_chunk / unsafe_split / unsafe_split_with_sizes / atleast_1d / 2d / 3d have verified rules (rows of
`rules.rows_tensor`, run by tests/rules/test_rule_harness.py): on a batch-sharded activation under a data role
they keep the batch sharded (no fallback, no gather), and a write through unsafe_chunk plans (r18h: 3 typed
refusals, InfeasiblePlanError, because these ops had no rule and were replicated)."""
import os
import sys

import pytest

from parallelizer.core.layout import Layout, Shard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "distributed"))
from alias_op_models import OP, WHICH, alias_op, data_role_plans  # noqa: E402


@pytest.mark.parametrize("which", WHICH)
def test_alias_ops_keep_the_batch_sharded_under_data_roles(which):
    for role, plan, name, moved in data_role_plans(*alias_op(which), OP.get(which, which)):
        assert not [f for f in plan.fallbacks if f.node == name], (which, role, plan.fallbacks)
        (used,) = Layout.parse(plan.nodes[name].inputs[0]).placements
        assert used == Shard(0), (which, role, plan.nodes[name].strategy)
        assert not moved, (which, role, moved)  # (fsdp's parameter all-gathers aside)
