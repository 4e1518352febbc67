"""Every rule of the rule table, verified by execution (DESIGN.md rule 8): each strategy the planner could
give an op runs on simulated per-rank shards (meshes of 2, 3, 4 and 2x2 devices, odd and uneven sizes) and
is compared with the op on global tensors, forward and backward (`harness.check`)."""
import operator

import pytest
import torch

from harness import MESHES, Mismatch, check
from parallelizer.planner.rules import TABLE, partial
from parallelizer.planner.rules.table import load_extension_rows
from parallelizer.planner.rules.samples import Sample, T, pos, t
from parallelizer.tracer.graph import mutated_args
from parallelizer.rewriter import localize

aten = torch.ops.aten
EXTENSIONS = load_extension_rows()  # rows of other libraries' custom ops (transformers' grouped_mm_fallback)
ENTRIES = [e for e in TABLE.values() if e.key is not operator.getitem]


def test_every_rule_has_verification_samples():
    """A rule without samples fails here: it cannot land unverified. getitem is verified through every
    multi-output op (topk, sort, split, lstm, max.dim, var_mean, native_dropout, ...)."""
    missing = [e.name for e in ENTRIES if not e.samples]
    assert not missing, f"rules without verification samples: {missing}"
    for e in ENTRIES:
        for s in e.samples:
            packet = getattr(s.op, "overloadpacket", s.op)
            assert s.op is e.key or packet is e.key, f"sample of {s.op} filed under {e.name}"
    multi = [e.name for e in ENTRIES for s in e.samples[:1] if isinstance(
        s.op(*s.materialize(0)[0], **s.materialize(0)[1]), (tuple, list))]
    assert len(multi) >= 8, multi


def meshes_for(index: int) -> tuple:
    """Every sample runs on the 1-D meshes (2, 3, 4 devices), which verify each per-axis option; the first
    sample of a row also runs on the 2x2 mesh, which verifies how options compose over two axes (its
    strategies are the product of the per-axis options, 65% of the harness's time when run on every sample)."""
    return MESHES if index == 0 else tuple(m for m in MESHES if m.ndim == 1)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_rule(entry):
    ran = sum(check(entry, sample, mesh) for i, sample in enumerate(entry.samples) for mesh in meshes_for(i))
    assert ran >= sum(len(meshes_for(i)) for i in range(len(entry.samples)))  # all-Replicate at least


def _catches(entry, sample: Sample) -> str:
    with pytest.raises(Mismatch) as err:
        for mesh in MESHES:
            check(entry, sample, mesh)
    return str(err.value)


def test_mutation_partial_plus_a_constant_is_caught(monkeypatch):
    """Mutation 1: let a Partial value through `x + 10` (the constant would be added once per rank)."""
    original = partial._scalar_operand
    monkeypatch.setattr(partial, "_scalar_operand", lambda v: False)
    text = _catches(TABLE[aten.add], Sample(aten.add.Tensor, (t(3, 5), 10.0)))
    assert "strategy P -> P" in text
    monkeypatch.setattr(partial, "_scalar_operand", original)


def test_mutation_partial_through_a_narrowing_cast_is_caught(monkeypatch):
    """Mutation 2: treat fp32 -> bf16 as exact, so that Partial summands are rounded before the sum."""
    monkeypatch.setattr(partial, "exact_cast", lambda src, dst: True)
    text = _catches(TABLE[aten._to_copy], Sample(aten._to_copy.default, (t(3, 5),), {"dtype": torch.bfloat16}))
    assert "P -> P" in text


def test_mutation_tril_without_the_shard_offset_is_caught(monkeypatch):
    """Mutation 3: run tril on a row/column shard without shifting its diagonal (position-dependent op
    treated as elementwise)."""
    monkeypatch.setattr(localize, "_shift_diagonal", lambda ctx, args, kwargs: tuple(args[:2]) or (args[0], 0))
    text = _catches(TABLE[aten.tril], Sample(aten.tril.default, (t(5, 7),)))
    assert "S(0) -> S(0)" in text or "S(1) -> S(1)" in text


def _written_positions(sample: Sample) -> set[int]:
    """Positions of the top-level tensor arguments whose version counter a call of the op bumps."""
    args, kwargs = sample.materialize(0)
    before = [a._version if isinstance(a, torch.Tensor) else None for a in args]
    sample.op(*args, **kwargs)
    return {i for i, (a, v) in enumerate(zip(args, before)) if v is not None and a._version != v}


# calls that write an input although their rule refuses them (no sample can run them through the harness)
_WRITING_CALLS = [Sample(aten.instance_norm.default, (t(3, 4, 5), None, None, T((4,), grad=False), pos(4, grad=False),
                                                      True, 0.1, 1e-5, False))]


def test_every_input_an_op_writes_is_known_as_written():
    """The planner keeps a written input where it lives (no redistribution on the way to it) and the harness
    compares it, only for the positions `mutated_args` knows: the schema's `Tensor(a!)` annotations plus the
    composites that hide a write. instance_norm's running statistics were missing (a channel-sharded plan
    sliced them per rank and updated the slices: running_var 0.14 off after 2 steps, silently). Every sample
    of every row, and calls the rules refuse, are run eagerly and the version counters of their arguments
    compared with that list."""
    unknown = []
    for sample in [s for e in ENTRIES for s in e.samples] + _WRITING_CALLS:
        written = _written_positions(sample)
        known = set(mutated_args(torch.fx.Graph().call_function(sample.op, ())))
        if written - known:
            unknown.append((str(sample.op), sorted(written - known)))
    assert not unknown, unknown
