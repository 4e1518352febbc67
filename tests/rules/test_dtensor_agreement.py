"""Our rules beside DTensor's strategy table (issue 11; DESIGN.md rules 7 and 8): for every row whose op DTensor
covers directly, DTensor must not contradict any of our options (`rules.dtensor_check`), and docs/rules.md,
which lists per op the rule, its samples and DTensor's verdicts, must be what `rules.report` writes now.

Our harness (test_rule_harness.py) is what verifies every option by execution; these tests add DTensor's
opinion and keep the table's documentation current."""
import operator

import torch

from harness import one_op_graph
from parallelizer.planner.rules import TABLE
from parallelizer.planner.rules.table import load_extension_rows
from parallelizer.planner.rules import dtensor_check as dc
from parallelizer.planner.rules import report
from parallelizer.planner.rules.base import P, R, AxisOption
from parallelizer.planner.rules.samples import Sample, ints, t
from parallelizer.planner.strategies import op_view, tensor_inputs
from torch.distributed.tensor.placement_types import Shard

aten = torch.ops.aten


def _findings(kind: str) -> list[str]:
    return [f"{r.entry.name} sample {c.sample} {r.entry.samples[c.sample].op} {c.option}: DTensor {c.verdict.dtensor} "
            f"({c.verdict.reason})" for r in report.survey() for c in r.checks if c.verdict.kind == kind]


def test_dtensor_does_not_contradict_our_options():
    """Where DTensor takes our input placements as they are, it gives our output placement (or a documented
    equivalent). A difference is either a wrong rule (report it, with the sample) or an equivalence or a DTensor
    defect to document in `dtensor_check` — never silently accepted."""
    differs = _findings(dc.DIFFERS)
    assert not differs, "DTensor contradicts these options:\n" + "\n".join(differs)


def test_most_options_on_covered_ops_agree_and_none_is_left_unexplained():
    rows = report.survey()
    covered = [r for r in rows if r.covered]
    kinds = {c.verdict.kind for r in rows for c in r.checks}
    assert kinds <= {*dc.AGREEMENT, dc.OURS_ONLY, dc.DTENSOR_DEFECT, dc.NOT_APPLICABLE, dc.NOT_QUERIED}
    assert len(covered) >= 150, len(covered)
    agree = sum(r.count(*dc.AGREEMENT) for r in covered)
    checked = sum(len(r.checks) - r.count(dc.NOT_APPLICABLE) for r in covered)
    assert agree >= 0.9 * checked, (agree, checked)
    assert all(c.verdict.reason for r in rows for c in r.checks if c.verdict.kind == dc.NOT_QUERIED)


def test_every_listed_dtensor_defect_still_reproduces():
    """A defect entry whose DTensor behaviour got fixed in a newer torch must be deleted (and the doc
    regenerated), so each must still be met."""
    met = {r.entry.samples[c.sample].op for r in report.survey() for c in r.checks
           if c.verdict.kind == dc.DTENSOR_DEFECT}
    assert met == set(dc.DTENSOR_DEFECTS), (met, set(dc.DTENSOR_DEFECTS))


def test_adapter_was_checked_on_this_torch():
    """DESIGN.md rule 7: a new torch means re-checking the private DTensor API `dtensor_check` uses (then add
    the version to `TORCH_CHECKED` and regenerate docs/rules.md)."""
    assert torch.__version__.split("+")[0] in dc.TORCH_CHECKED, torch.__version__


def test_composites_that_export_keeps_whole_are_not_applicable_and_core_ops_are_covered():
    for op in (aten.linear.default, aten.layer_norm.default, aten.conv2d.default, aten.batch_norm.default,
               aten.einsum.default, aten.lstm.input, aten.cross_entropy_loss.default,
               aten.scaled_dot_product_attention.default):
        covered, why = dc.coverage(op)
        assert not covered and why.startswith("composite"), (op, why)
    for op in (aten.mm.default, aten.sum.dim_IntList, aten.cat.default, aten.view.default, aten.add.Tensor):
        assert dc.coverage(op)[0], op


def test_a_wrong_output_placement_is_reported_as_a_difference():
    """The check itself catches a wrong rule: mm with its rows sharded cannot give a column shard."""
    sample = Sample(aten.mm.default, (t(4, 6), t(6, 8)))
    assert dc.check_option(sample, AxisOption((Shard(0), R), Shard(0))).kind == dc.AGREES
    wrong = dc.check_option(sample, AxisOption((Shard(0), R), Shard(1)))
    assert wrong.kind == dc.DIFFERS and wrong.dtensor == "S(0) R -> S(0)"
    assert dc.check_option(sample, AxisOption((Shard(1), Shard(0)), P)).kind == dc.AGREES
    assert dc.check_option(sample, AxisOption((Shard(1), Shard(0)), R)).kind == dc.DIFFERS


def test_documented_equivalences_and_redistributions():
    """mean over an evenly sharded dim: DTensor's Partial("avg") is our Partial("sum") over the global count;
    vocab-parallel embedding: DTensor's _MaskPartial; Partial through relu: DTensor reduces first."""
    mean = dc.check_option(Sample(aten.mean.dim, (t(4, 3), [0])), AxisOption((Shard(0),), P))
    assert mean.kind == dc.EQUIVALENT and mean.dtensor == "S(0) -> P(avg)"
    emb = dc.check_option(Sample(aten.embedding.default, (t(10, 3), ints(10, 5))), AxisOption((Shard(0), R), P))
    assert emb.kind == dc.EQUIVALENT and "MaskPartial" in emb.dtensor
    relu = dc.check_option(Sample(aten.relu.default, (t(3, 5),)), AxisOption((P,), P))
    assert relu.kind == dc.OURS_ONLY and relu.dtensor == "R -> R"
    assert dc.check_option(Sample(aten.linear.default, (t(3, 5), t(7, 5))), AxisOption((R, R), R)).kind == \
        dc.NOT_APPLICABLE


def test_the_options_checked_are_the_options_the_harness_runs():
    """`Sample.view` (what the DTensor check feeds the rules) sees every sample as the harness's one-op graph
    does (`strategies.op_view`), so the options compared with DTensor are exactly those executed."""
    load_extension_rows()
    for entry in TABLE.values():
        if entry.key is operator.getitem:
            continue
        for sample in entry.samples:
            view, tensors = sample.view()
            args, kwargs = sample.materialize(0)
            tg, harness_tensors, name = one_op_graph(sample.op, args, kwargs)
            info = tg.nodes[name]
            theirs = op_view(tg, info, tensor_inputs(tg, info))
            assert (view.in_shapes, view.out_shapes, view.in_dtypes, view.out_dtypes) == \
                (theirs.in_shapes, theirs.out_shapes, theirs.in_dtypes, theirs.out_dtypes), sample
            assert entry.rule(view) == entry.rule(theirs), sample
            assert all(torch.equal(a, b) for a, b in zip(tensors, harness_tensors))


def test_docs_rules_md_is_current():
    """docs/rules.md is generated; a new or changed rule (or a new torch) must show up in it."""
    want = report.render(report.survey())
    have = report.DOC.read_text() if report.DOC.exists() else ""
    assert have == want, "docs/rules.md is stale: run `python -m parallelizer.planner.rules.report` and commit it"
