"""Sharding rules: per op, the strategies it may take on one mesh axis (`table.TABLE`, with the samples that
verify each rule), the view of a node a rule sees (`base.OpView`) and what it returns (`base.AxisOption`),
and the exact Partial semantics (`partial`)."""
from .base import OUT, AxisOption, OpView
from .partial import exact_cast
from .table import TABLE, RuleEntry, rule_for

__all__ = ["AxisOption", "OpView", "OUT", "RuleEntry", "TABLE", "rule_for", "exact_cast"]
