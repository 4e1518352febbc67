"""The rule table's storage: `RuleEntry` (one row: an op, its rule and the samples that verify it), `TABLE`
and `add_row`. The rows are added by `rows_tensor` and `rows_nn` (and the in-place forms and extension ops by
`table`), in that order; `table` is the module to import."""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass

from .base import AxisOption, OpView
from .samples import Sample, T, optional_tensors_passed

Rule = Callable[[OpView], list[AxisOption] | None]  # None: no verified option for this call (replicated, noted)


@dataclass(frozen=True)
class RuleEntry:
    """One row of the table (module docstring)."""

    key: object            # an OpOverloadPacket, an OpOverload, or operator.getitem
    rule: Rule
    samples: tuple[Sample, ...]
    exact: bool = False
    random: bool = False

    @property
    def verified(self) -> frozenset:
        """The overloads this row's samples run (a packet row covers only these, `rule_for`)."""
        return frozenset(s.op for s in self.samples)

    @functools.cached_property
    def verified_optional(self) -> dict[object, frozenset[str]]:
        """Per verified overload, the optional tensor arguments (schema names: searchsorted's `sorter`, a
        conv's `bias`) that some sample passes a tensor for; a call passing another is not covered (`rule_for`)."""
        out: dict[object, frozenset[str]] = {}
        for s in self.samples:
            out[s.op] = out.get(s.op, frozenset()) | optional_tensors_passed(s.op, s.args, s.kwargs, T)
        return out

    @property
    def name(self) -> str:
        return getattr(self.key, "__name__", str(self.key)) if self.key is operator.getitem else str(self.key)


TABLE: dict[object, RuleEntry] = {}


def add_row(keys, rule: Rule, samples: list[Sample] | Callable[[object], list[Sample]], *, exact: bool = False,
         random: bool = False) -> None:
    for key in keys:
        s = samples(key) if callable(samples) else samples
        TABLE[key] = RuleEntry(key, rule, tuple(s), exact, random)
