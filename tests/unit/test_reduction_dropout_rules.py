"""sum_to_size, the feature dropouts (feature_dropout, feature_alpha_dropout) and alpha_dropout have verified rules
(rows of `rules.rows_tensor`, run by tests/rules/test_rule_harness.py; round 19's leftover: none had a row, so each
ran replicated with its input gathered over the data axis): on a batch-sharded activation under a data role they
keep the batch sharded (sum_to_size over the batch: Partial), and the feature dropouts, which draw one mask entry
per (sample, channel) (`torch.nn.functional.dropout2d`), are never sharded along a dim that one entry spans: a
shard of the spatial dims would draw its own mask for the same channel (`rewriter.localize.seeded_per_shard`)."""
import os
import sys

import pytest
import torch

from parallelizer.core.layout import Layout, Partial, Shard
from parallelizer.planner.rules.table import rule_for
from parallelizer.planner.rules.base import OpView

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "distributed"))
from alias_op_models import data_role_plans  # noqa: E402
from reduction_dropout_models import OP, WHICH, reduction_dropout  # noqa: E402

aten = torch.ops.aten


@pytest.mark.parametrize("which", WHICH)
def test_ops_keep_the_batch_sharded_under_data_roles(which):
    for role, plan, name, moved in data_role_plans(*reduction_dropout(which), OP.get(which, which)):
        assert not [f for f in plan.fallbacks if f.node == name], (which, role, plan.fallbacks)
        (used,) = Layout.parse(plan.nodes[name].inputs[0]).placements
        assert used == Shard(0), (which, role, plan.nodes[name].strategy)
        (out,) = Layout.parse(plan.nodes[name].output).placements
        assert out == (Partial("sum") if which == "sum_to_size_batch" else Shard(0)), (which, role, str(out))
        assert not moved, (which, role, moved)


@pytest.mark.parametrize("op", [aten.feature_dropout.default, aten.feature_alpha_dropout.default])
@pytest.mark.parametrize("shape", [(4, 8, 36), (4, 8, 6, 6), (4, 8, 2, 6, 6)])
def test_feature_dropouts_shard_only_the_sample_and_channel_dims(op, shape):
    view = OpView(op, (None, 0.5, True), {}, (shape,), (shape,), (torch.float32,), (torch.float32,))
    rule = rule_for(op, view)
    assert rule is not None, op
    sharded = {p.dim for o in rule(view) for p in o.inputs if isinstance(p, Shard)}
    assert sharded == {0, 1}, (op, shape, sharded)
