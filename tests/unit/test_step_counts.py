"""`parallelizer show` and `rehearse` count the same steps, and say what they count (trial r9c).

A user saw `show` print 30 + 5 all-gathers and 8 local slices for a GPT-2 (dp=2 fsdp x tp=2) plan while
`rehearse` printed "collectives {'all_gather': 34, ..., 'local_slice': 10}", with no word on why: `show` counted
the plan's edges (one per use of a value: the tied wte / lm_head weight gathered alike twice) and `rehearse` the
steps emitted in rank 0's program (one per value and target layout, plus the slices of the user inputs, which
arrive whole). `show` now prints both columns with what each counts; `Plan.program_steps` gives the emitted
count per mesh axis, checked here against the rewriter's own count on every rank.
"""
import contextlib
import io
from collections import Counter

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.plan_io import plan_text


def _gpt2():
    model, inputs, kw = zoo.gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=64, batch=4, seq_len=8, labels=True)
    return parallelizer.trace(model, inputs, kw)


def _mlp():
    return parallelizer.trace(*zoo.mlp(depth=2, batch=6, dim=16, hidden=32, in_features=8))


CASES = [("gpt2 fsdp x tp", _gpt2, {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}),
         ("gpt2 ddp", _gpt2, {"dp": 2}, {"dp": "ddp"}),
         ("mlp tp=3 (an input that may require grad)", _mlp, {"tp": 3}, {"tp": "tp"}),
         ("mlp fsdp dp=4", _mlp, {"dp": 4}, {"dp": "fsdp"})]


@pytest.mark.parametrize("name,build,mesh,roles", CASES, ids=[c[0] for c in CASES])
def test_program_steps_equal_what_each_rank_emits(name, build, mesh, roles):
    traced = build()
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(traced, mesh, axis_roles=roles)
    per_kind = Counter()
    for (kind, _axis), n in p.program_steps().items():
        per_kind[kind] += n
    for rank in range(p.mesh.world_size):
        assert dict(per_kind) == parallelizer.rewrite(traced, p, rank=rank).collectives, (name, rank)


def test_show_prints_both_counts_with_what_they_count():
    traced = _gpt2()
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(traced, {"dp": 2, "tp": 2}, axis_roles={"dp": "fsdp", "tp": "tp"})
    edges = Counter((s.kind, s.mesh_axis) for _, s in p.steps())
    program = p.program_steps()
    assert edges != program  # the tied weight (one gather, two uses) and the input slices differ
    assert program[("local_slice", "dp")] > edges[("local_slice", "dp")]
    text = plan_text(p)
    assert "plan edges" in text and "in each rank's program" in text and "one per use of a value" in text
    for (kind, axis) in program:
        assert any(line.split()[:4] == [kind, axis, str(edges.get((kind, axis), 0)), str(program[(kind, axis)])]
                   for line in text.splitlines()), (kind, axis)
