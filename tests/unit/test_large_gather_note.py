"""A plan that gathers a large value whole over a mesh axis to return it (a language model's logits, vocab-sharded
by a column-parallel lm_head) says so in its notes, with the bytes and the remedy (trial r9c).

GPT-2 (vocabulary 50257, batch 8 x 1024 tokens) on tp=2 all-gathers 1.6 GB of fp32 logits per step to return
them, with or without labels= (transformers returns the logits beside the loss), and nothing said so. Shapes on
`meta`: nothing is allocated.
"""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer.errors import InfeasiblePlanError
from parallelizer import zoo

B, T, V = 8, 1024, 50257


class _LossOnly(torch.nn.Module):
    """The remedy the note gives for a model that returns its logits beside its loss."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids, labels):
        return self.m(input_ids=input_ids, labels=labels).loss


def _plan(labels: bool, loss_only: bool = False, vocab: int = V):
    model, (ids,), *kw = zoo.gpt2(n_layer=1, n_embd=64, n_head=2, vocab_size=vocab, batch=B, seq_len=T,
                                  device="meta", labels=labels)
    traced = (parallelizer.trace(_LossOnly(model), (ids, kw[0]["labels"])) if loss_only else
              parallelizer.trace(model, (ids,), *kw))
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(traced, {"tp": 2}, axis_roles={"tp": "tp"})


def _gathered_into_output(p):
    return sum(s.nbytes for e in p.edges if e.dst == "output" for s in e.steps if s.kind == "all_gather")


@pytest.mark.parametrize("labels,hint", [(False, "pass labels="), (True, "return only the loss")])
def test_gathered_logits_are_noted_with_their_bytes_and_the_remedy(labels, hint):
    p = _plan(labels)
    assert _gathered_into_output(p) == B * T * V * 4  # the fp32 logits, whole (independent count)
    (note,) = [n for n in p.notes() if n.startswith("large gather")]
    assert f"({B}, {T}, {V}) float32" in note and "1.6 GB per step" in note and hint in note, note
    if labels:  # the model's own loss already runs on the vocabulary shards
        (ce,) = [x for x in p.nodes.values() if "cross_entropy" in x.op]
        assert ce.inputs[0] != "R", ce


def test_the_remedy_removes_the_gather_and_the_note():
    p = _plan(True, loss_only=True)
    assert _gathered_into_output(p) == 0
    assert not [n for n in p.notes() if n.startswith("large gather")]


def test_a_small_gather_is_not_noted():
    p = _plan(False, vocab=512)  # 16 MiB of logits
    assert 0 < _gathered_into_output(p) < 64 * 2**20
    assert not [n for n in p.notes() if n.startswith("large gather")]


def test_the_gathered_output_is_in_the_memory_per_device_and_the_note_says_so():
    """Every rank holds the whole returned value after the gather (trial r14e: Llama-3-8B on dp=8 x tp=8, 64 x
    8192 tokens, planned at 64.1 GB of 80 GB while each rank materialises 269 GB of fp32 logits; here 0.48 GB
    planned beside 1.65 GB held), so the plan counts it ("outputs": the logits and the loss) in its memory per
    device, the budget binds on it, and the note says it is counted."""
    model, (ids,), kw = zoo.gpt2(n_layer=1, n_embd=64, n_head=2, vocab_size=V, batch=B, seq_len=T, device="meta",
                                 labels=True)
    traced = parallelizer.trace(model, (ids,), kw)
    whole = B * T * V * 4  # the fp32 logits, counted independently
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(traced, {"tp": 2}, axis_roles={"tp": "tp"}, memory_budget_bytes=80e9, precision="fp32")
    mem = p.cost.memory_bytes
    assert mem["outputs"] == whole + 4  # and the scalar loss
    (note,) = [n for n in p.notes() if n.startswith("large gather")]
    assert "1.6 GB, counted in the plan's memory per device as outputs" in note, note
    with pytest.raises(InfeasiblePlanError, match="memory"):  # 1.5 GB held the plan before outputs were counted
        with contextlib.redirect_stdout(io.StringIO()):
            parallelizer.plan(traced, {"tp": 2}, axis_roles={"tp": "tp"}, memory_budget_bytes=1.5e9, precision="fp32")


def test_a_pipeline_plan_notes_its_logits_summed_whole_per_microbatch():
    """Trial r14e: a pipeline plan's graph is one microbatch, and its logits may reach the output as a Partial
    all-reduced whole over tp (a row-parallel lm_head): not noted at all, while the last stage's ranks then hold
    them whole every microbatch (a searched Llama-3-8B plan: 33.6 GB per microbatch); a gather's bytes were said
    to be "per step". Without labels= (round 16, r16e: with them the last stage returns the loss alone, below)."""
    model, (ids,) = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, vocab_size=V, batch=B // 2, seq_len=T, device="meta")
    traced = parallelizer.trace(model, (ids,))
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(traced, {"pp": 2, "tp": 2}, axis_roles={"tp": "tp"}, global_batch=B, microbatches=2)
    whole = B // 2 * T * V * 4  # one microbatch's fp32 logits, counted independently
    moved = [s for e in p.edges if e.dst == "output" for s in e.steps if s.nbytes >= whole]
    assert moved, "the logits are not made whole for the output on this plan: pick another mesh for this test"
    (note,) = [n for n in p.notes() if n.startswith("large gather")]
    assert f"{whole / 1e6:.1f} MB per microbatch, 2 per step" in note and "every rank of the last stage" in note, note
    if all(s.kind == "all_reduce" for s in moved):
        assert "summed (all-reduce of a Partial) whole over tp" in note, note


def test_a_pipeline_plan_of_a_model_returning_its_loss_first_notes_no_logits_gather():
    """Round 16 (r16e): with labels= the model's first output is its loss and the last stage returns that alone
    (`pm.step` reads nothing else), so the logits are not gathered and not noted."""
    model, (ids,), kw = zoo.gpt2(n_layer=2, n_embd=64, n_head=2, vocab_size=V, batch=B // 2, seq_len=T, device="meta",
                                 labels=True)
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(parallelizer.trace(model, (ids,), kw), {"pp": 2, "tp": 2}, axis_roles={"tp": "tp"},
                              global_batch=B, microbatches=2)
    assert not [n for n in p.notes() if n.startswith("large gather")]


class _SoftTargets(torch.nn.Module):
    """A vocabulary-wide head and a KL loss on soft targets: log_softmax needs the vocabulary dim whole."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(64, V, bias=False)

    def forward(self, x, soft):
        return torch.nn.functional.kl_div(torch.nn.functional.log_softmax(self.head(x), -1), soft, reduction="batchmean")


def test_a_value_gathered_over_one_axis_is_noted_with_the_shard_each_rank_holds():
    """On dp=2 x tp=2 the logits feeding log_softmax are re-sharded from the vocabulary to the rows: each rank
    holds a quarter of them (2048 of 8192 rows); before round 16 the note said every rank held all 1.6 GB."""
    with torch.device("meta"):
        model, x, soft = _SoftTargets(), torch.randn(B * T, 64), torch.rand(B * T, V)
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(parallelizer.trace(model, (x, soft)), {"dp": 2, "tp": 2},
                              axis_roles={"dp": "ddp", "tp": "tp"})
    (note,) = [n for n in p.notes() if n.startswith("large gather")]
    (edge,) = [e for e in p.edges if e.dst != "output" and any(s.kind in ("all_gather", "all_to_all") for s in e.steps)
               and "log_softmax" in p.nodes[e.dst].op]
    rows = B * T // 4  # independent count: the dst layout shards the rows over both axes
    assert edge.dst_layout == "S(0)S(0)", edge
    assert f"holds its S(0)S(0) shard ({rows}, {V})" in note and "411.7 MB)" in note, note
