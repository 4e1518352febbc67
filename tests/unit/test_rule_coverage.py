"""Two classes around the rule table, each a silent loss (of numbers, or of parallelism).

1. A row keyed by an op packet applied to EVERY overload of the packet, including overloads nobody verified:
   `aten.view.dtype` (bit reinterpretation) took `aten.view.default`'s reshape rule, which lets a Partial
   value through (the bits of a sum are not the sum of the bits) and regroups a last dim whose size the
   dtype changes; `aten.lstm.data` (packed sequences) took `lstm.input`'s batch rule. A packet row now
   covers only the overloads its samples run (`rule_for`); others are replicated and noted.
2. Ops without a row ran replicated and took everything around them along (a data-parallel decoder gathered
   its whole batch for the transposed conv, the upsampling and the loss): transposed convs, 3-D and adaptive
   max pooling, pooling with indices and unpooling, every interpolation mode, pixel (un)shuffle, instance
   norm, PReLU, GLU, grid sampling, GRU / RNN, elementwise and NLL losses, broadcast_tensors (which F.mse_loss
   calls), baddbmm, repeat. Each row's options are verified by the rule harness (tests/rules); here whole
   models plan with no fallback.
"""
import contextlib
import io
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor.placement_types import Partial, Shard

import parallelizer
from parallelizer.planner.rules import TABLE, rule_for
from parallelizer.planner.rules.samples import Sample, T, optional_tensors_passed, t
from parallelizer.planner.rules.table import RuleEntry, unverified_overload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import coverage_models  # noqa: E402

aten = torch.ops.aten


def test_a_packet_row_covers_only_the_overloads_its_samples_run():
    assert rule_for(aten.lstm.input) is not None
    assert rule_for(aten.lstm.data) is None  # packed sequences: (sum of lengths, H) data, no batch dim
    assert "verified on its overloads input only" in unverified_overload(aten.lstm.data)
    for entry in TABLE.values():
        for sample in entry.samples:
            assert rule_for(sample.op) is entry.rule, sample.op


def test_every_optional_tensor_argument_of_a_verified_overload_is_sampled():
    """A verified overload called with an optional tensor argument (searchsorted's `sorter`, a conv's `bias`,
    pinv's `atol`) that no sample passes is not covered (`rule_for`), so every such argument has a sample: found
    by the schema, not by a list. Before round 12, eight were never run (searchsorted's sorter raised a raw
    IndexError in planning)."""
    missing = []
    for entry in TABLE.values():
        for op in entry.verified:
            schema = getattr(op, "_schema", None)
            optional = {a.name for a in schema.arguments if str(a.type).startswith("Optional")
                        and "Tensor" in str(a.type)} if schema is not None else set()
            sampled = set().union(*(optional_tensors_passed(s.op, s.args, s.kwargs, T) for s in entry.samples if s.op is op))
            missing += [f"{op}.{name}" for name in sorted(optional - sampled)]
    assert not missing, missing


def test_a_call_passing_an_unsampled_optional_tensor_is_not_covered(monkeypatch):
    """Without its sorter sample, the searchsorted row does not cover a call passing `sorter=` (replicated and
    noted, naming the argument) while it still covers a call without one."""
    entry = TABLE[aten.searchsorted]
    kept = tuple(s for s in entry.samples if "sorter" not in s.kwargs)
    assert len(kept) < len(entry.samples)
    monkeypatch.setitem(TABLE, aten.searchsorted, RuleEntry(entry.key, entry.rule, kept, entry.exact, entry.random))
    with_sorter, _ = Sample(aten.searchsorted.Tensor, (t(6), t(3, 5)), {"sorter": T((6,), "perm", grad=False)}).view()
    plain, _ = Sample(aten.searchsorted.Tensor, (T((6,), "sorted"), t(3, 5))).view()
    assert rule_for(aten.searchsorted.Tensor, with_sorter) is None
    assert "without a tensor for sorter" in unverified_overload(aten.searchsorted.Tensor, with_sorter)
    assert rule_for(aten.searchsorted.Tensor, plain) is entry.rule


def test_searchsorted_with_a_sorter_shards_the_queries_only():
    view, _ = Sample(aten.searchsorted.Tensor, (t(6), t(3, 5)), {"sorter": T((6,), "perm", grad=False)}).view()
    options = rule_for(aten.searchsorted.Tensor, view)(view)
    assert all(len(o.inputs) == 3 for o in options), options
    assert {(str(o.inputs[0]), str(o.inputs[2])) for o in options} == {("R", "R")}
    assert {o.output.dim for o in options if isinstance(o.output, Shard)} == {0, 1}


@pytest.mark.parametrize("dtype", [torch.int32, torch.bfloat16, torch.float64])
def test_a_dtype_view_never_passes_a_partial_and_keeps_a_rescaled_last_dim_whole(dtype):
    view, _ = Sample(aten.view.dtype, (t(4, 6), dtype)).view()
    options = rule_for(aten.view.dtype)(view)
    assert not any(isinstance(p, Partial) for o in options for p in (*o.inputs, o.output)), options
    sharded = {o.output.dim for o in options if isinstance(o.output, Shard)}
    assert sharded == ({0, 1} if dtype.itemsize == 4 else {0}), options


@pytest.mark.parametrize("name", sorted(coverage_models.BUILDERS))
def test_models_made_of_previously_uncovered_ops_plan_data_parallel_without_a_fallback(name):
    model, inputs = coverage_models.BUILDERS[name]()
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles={"dp": "ddp"})
    assert not plan.fallbacks, plan.fallbacks
    replicated = sorted({q.op for q in plan.nodes.values() if q.op and q.op.startswith("aten") and str(q.output) == "R"})
    assert not replicated, replicated  # every op runs on its batch shard (the losses give Partial sums)


def test_a_batch_sharded_masked_scatter_refuses_samples_whose_counts_do_not_fill_their_rows():
    """masked_scatter's batch option is right only when each rank's mask selects what its source rows hold (the
    same number of image tokens per sample); the local form checks it (counts compared and, over the batch
    groups, all-reduced so every rank raises together) instead of placing rows into other samples."""
    from parallelizer.errors import UnsupportedOpError
    from parallelizer.rewriter.localize import checked_masked_scatter

    x, src = torch.randn(2, 3, 4), torch.randn(2, 4)
    mask = torch.zeros(2, 3, 4, dtype=torch.bool)
    mask[0, 1], mask[1, 2] = True, True  # one token per sample: 8 elements for 8 source elements
    torch.testing.assert_close(checked_masked_scatter(x, mask, src, []), x.masked_scatter(mask, src), rtol=0, atol=0)
    mask[1, 0] = True  # the second sample selects two tokens
    with pytest.raises(UnsupportedOpError, match="selects 12 elements and its source rows hold 8"):
        checked_masked_scatter(x, mask, src, [])


class _FourierMixer(torch.nn.Module):
    """FNet's token mixing: the real part of a 2-D FFT over (sequence, hidden), between linears."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b(torch.fft.fftn(h, dim=(1, 2)).real + h).pow(2).mean()


def test_an_fft_over_sequence_and_hidden_keeps_the_batch_sharded_under_ddp():
    """fft_fftn (and the complex views around FFTs) had no row: FNet ran its token mixing replicated, and under
    ddp gathered the batch for it in every layer."""
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(parallelizer.trace(_FourierMixer(), (torch.randn(4, 6, 8),)), {"dp": 2},
                                 axis_roles={"dp": "ddp"})
    nodes = {q.op: str(q.output) for q in plan.nodes.values() if q.op in ("aten.fft_fftn.default", "aten.real.default")}
    assert nodes == {"aten.fft_fftn.default": "S(0)", "aten.real.default": "S(0)"}, nodes
