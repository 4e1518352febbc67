"""The values a module returns are held whole on every rank (the program gathers them: `strategies.build_spaces`
takes every output replicated), so they are memory the plan must count (round 14, r14e: a Llama-3-8B shape's
logits, 269 GB per rank, were outside a plan that said 64 GB of 80). Closed forms: the returned tensor's
numel x bytes per element, in the ILP's budget, in `show`'s table, on the pipeline's last stage per microbatch."""
import contextlib
import io

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer import zoo
from parallelizer.errors import InfeasiblePlanError
from parallelizer.pipeline_memory import pipeline_rank_memory
from parallelizer.planner import plan_pipeline
from parallelizer.planner.plan_text import memory_rows


class Wide(nn.Module):
    """A (1024, 16) input to a (1024, 4096) output: 16.8 MB returned, about 1 MB of training state."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 4096)

    def forward(self, x):
        return self.proj(x)


def _quiet(fn, *a, **k):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*a, **k)


def test_a_returned_output_is_counted_whole_on_every_rank():
    traced = parallelizer.trace(Wide(), (torch.randn(1024, 16),))
    p = _quiet(parallelizer.plan, traced, {"dp": 2}, precision="fp32")
    mem = p.cost.memory_bytes
    assert mem["outputs"] == 1024 * 4096 * 4
    assert mem["total"] == sum(v for k, v in mem.items() if k not in ("total", "peak", "reserve"))  # "peak": a moment
    assert ("outputs", 1024 * 4096 * 4) in memory_rows(p)  # `show`'s memory table
    # a budget that holds the training state and activations but not the returned output cannot be met
    with pytest.raises(InfeasiblePlanError, match="memory") as err:
        _quiet(parallelizer.plan, traced, {"dp": 2}, precision="fp32", memory_budget_bytes=8_000_000,
               memory_reserve_bytes=0)
    assert "Remedies: return less: the module's returned values take 16.8 MB on every rank" in str(err.value)


def test_a_pipelines_last_stage_holds_one_microbatch_of_the_outputs():
    model, inputs = zoo.gpt2(device="meta", n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=8, seq_len=16)
    traced = parallelizer.trace(model, inputs)  # returns its logits: (8, 16, 256) fp32
    found = _quiet(plan_pipeline, traced, "h100:1x4", global_batch=8, pp=2, tp=1, num_microbatches=2,
                   schedules=("1f1b",), zero1=False, precision="fp32", progress=False)
    assert found.dp == 2 and found.microbatch_size == 2
    per_microbatch = 2 * 2 * 16 * 256 * 4  # microbatch of 2 per replica, gathered over dp = 2
    for r in found.ranks:
        state = sum(found.stages[s].state_bytes for s in r.stages)
        act = sum(found.stages[s].activation_bytes for s in r.stages)
        held = per_microbatch if len(found.stages) - 1 in r.stages else 0
        assert r.memory_bytes == pytest.approx(state + held + r.inflight_microbatches * act, abs=8)
    last = next(k for k in found.stage_kinds if len(found.stages) - 1 in k.stages)
    assert last.memory_bytes["outputs"] == per_microbatch
    plan = _quiet(parallelizer.plan, traced, cluster="h100:1x4", global_batch=8, mesh={"pp": 2, "dp": 2},
                  precision="fp32")
    ranks = pipeline_rank_memory(plan, parallelizer.trace(*zoo.gpt2(
        device="meta", n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=4, seq_len=16)))
    assert [m["outputs"] for m in ranks] == [0, 4 * 16 * 256 * 4]  # the traced microbatch, whole


def test_a_pipeline_of_a_model_with_its_own_loss_holds_the_loss_alone():
    """GPT-2 given labels= returns (loss, logits). `pm.step` (loss_fn=None) reads the loss alone, so the last
    stage returns the loss and nothing else: its program does not gather the logits and the plan prices 4 bytes
    of outputs (round 16, r16e: it gathered the logits over dp every microbatch, and the search and
    `pipeline_rank_memory` counted one microbatch of them, 4 x 16 x 256 x 4 + 4 bytes here). A model that
    returns no loss keeps every output (the loss_fn reads them): the test above."""
    from parallelizer.runtime.pipeline import cut_stages, stage_graph
    sizes = dict(device="meta", n_layer=4, n_embd=64, n_head=4, vocab_size=256, seq_len=16, labels=True)
    model, inputs, kwargs = zoo.gpt2(batch=8, **sizes)
    traced = parallelizer.trace(model, inputs, kwargs)
    found = _quiet(plan_pipeline, traced, "h100:1x4", global_batch=8, pp=2, tp=1, num_microbatches=2,
                   schedules=("1f1b",), zero1=False, precision="fp32", progress=False)
    last = next(k for k in found.stage_kinds if len(found.stages) - 1 in k.stages)
    assert last.memory_bytes["outputs"] < 100  # the loss (scaled by the search's microbatch factors), no logits
    micro = parallelizer.trace(*zoo.gpt2(batch=4, **sizes)[:2], zoo.gpt2(batch=4, **sizes)[2])
    cut = cut_stages(micro, 2)
    assert len(cut.model_outputs) == 2 and cut.outputs[-1] == cut.model_outputs[:1]
    out = stage_graph(micro, cut, 1).graph_module.graph.output_node()
    assert [a.name for a in out.args[0]] == list(cut.model_outputs[:1])
    plan = _quiet(parallelizer.plan, traced, cluster="h100:1x4", global_batch=8, mesh={"pp": 2, "dp": 2},
                  precision="fp32")
    assert [m["outputs"] for m in pipeline_rank_memory(plan, micro)] == [0, 4]  # one fp32 loss
