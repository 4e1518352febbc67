"""Activation recomputation in the emitted program, on one device (`rewriter.recompute`; the gloo ranks of
tests/distributed/test_recompute.py check dp=2 / tp=2 and users' own checkpoint regions).

The in-repo GPT (fused SDPA with attention dropout, residual dropout) recomputed "full" and "selective" (the
SDPA op alone) gives the same loss and gradients as without recomputation, with the same RNG (dropout masks
replayed), runs the recomputed ops twice, and keeps fewer tensors for backward. Bad decisions are typed errors.
"""
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import parallelizer
from parallelizer import zoo
from parallelizer.core.mesh import MeshSpec
from parallelizer.errors import PlanMismatchError, UnsupportedOpError
from parallelizer.rewriter import rewrite
from parallelizer.rewriter.baselines import batch_parallel_spec
from parallelizer.rewriter.recompute import recompute_within

GPT = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=64, block_size=16, dropout=0.1, batch=2, seq_len=16,
           with_targets=True)
BLOCKS = ("h.0", "h.1")


def _one_device(traced):
    return batch_parallel_spec(traced, MeshSpec(("dp",), (1,)))


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func] = self.calls.get(func, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def traced():
    model, inputs = zoo.gpt(**GPT)
    return model, inputs, parallelizer.trace(model, inputs)


def _run(model, inputs, traced, recompute):
    spec = dataclasses.replace(_one_device(traced), recompute=recompute)
    program = rewrite(traced, spec, 0)  # verified, on the flat view of the program
    state = {**dict(model.named_parameters()), **dict(model.named_buffers()), **traced.constant_values()}
    params = [state[f].detach().clone().requires_grad_(not traced.parameters[f].is_buffer)
              for f in program.state_fqns]
    saved, count = {}, _Count()  # storage -> bytes of the tensors saved for backward (alive until backward)
    torch.manual_seed(7)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: (saved.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()), t)[1],
            lambda t: t), count:
        loss = program.graph_module(*params, *inputs)[-1]
        loss.backward()
    return program, loss, [p.grad for p in params], sum(saved.values()), count.calls


def test_full_and_selective_recompute_match_and_run_twice(traced):
    model, inputs, tg = traced
    plain, loss, grads, saved, calls = _run(model, inputs, tg, {})
    sdpa = torch.ops.aten._safe_softmax.default  # what SDPA (math kernel on CPU, dropout on) dispatches to
    for mode, regions in (("full", BLOCKS), ("selective", tuple(b + "#attention0" for b in BLOCKS))):
        program, loss_r, grads_r, saved_r, calls_r = _run(model, inputs, tg, {b: mode for b in BLOCKS})
        assert program.recomputed == regions
        assert program.graph_module.code.count("torch.utils.checkpoint.checkpoint(") == 2
        torch.testing.assert_close(loss_r, loss, rtol=0, atol=1e-6)
        for g, g_r in zip(grads, grads_r):
            torch.testing.assert_close(g_r, g, rtol=0, atol=1e-6)  # dropout masks replayed
        assert calls_r[sdpa] == 2 * calls[sdpa] == 4, (mode, calls_r[sdpa])
        assert saved_r < saved, (mode, saved_r, saved)


def test_bad_recompute_decisions_are_typed_errors(traced):
    _, _, tg = traced
    spec = _one_device(tg)
    with pytest.raises(PlanMismatchError, match="'h.9' has no op"):
        rewrite(tg, dataclasses.replace(spec, recompute={"h.9": "full"}), 0)
    with pytest.raises(ValueError, match="use 'selective' or 'full'"):
        rewrite(tg, dataclasses.replace(spec, recompute={"h.0": "some"}), 0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4), torch.nn.ReLU())
    mtg = parallelizer.trace(mlp, (torch.randn(2, 4),))
    region = mtg.blocks[0].members[0]
    with pytest.raises(UnsupportedOpError, match="no attention core"):
        rewrite(mtg, dataclasses.replace(_one_device(mtg), recompute={region: "selective"}), 0)


def test_a_pipeline_stage_keeps_the_decisions_of_its_own_regions(traced):
    _, _, tg = traced
    stage0 = [n.name for n in tg.compute_nodes() if n.block in (None, "h.0")][:40]
    assert recompute_within({"h.0": "full", "h.1": "selective"}, stage0, tg) == {"h.0": "full"}
