"""`rewriter.reshard` frees a re-gathered weight after its LAST backward use (step 3; round 26, r26c), on one process:
the pass applied to a hand-built program whose "gather" is a local copy (no ranks), with the weight G read by two
matmuls (one a chain away from the other) and looked up by an embedding (a reader in forward only, as a tied
embedding), and a probe on the first matmul's output gradient, which autograd computes after the second matmul's
backward and before the first's.

Checked: the gradients equal eager torch's; G is whole at the probe (the first matmul still needs it) and freed when
backward has returned, the loss still held (before r26c it stayed whole while the graph lived); a backward split in
an input pass and a weight pass (`retain_graph`, as zero-bubble schedules run it) keeps G for the second pass and
frees it after; under bf16 autocast (the matmuls keep bf16 copies, not G) the gradients match eager autocast; and G
emptied by something else after its refill is a typed error, not a read of freed memory."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from parallelizer.core.redistribute import Step
from parallelizer.errors import UnsupportedOpError
from parallelizer.rewriter.reshard import reshard_after_forward

aten = torch.ops.aten
GATHERED: list[torch.Tensor] = []  # the forward's gathered value (a local copy standing for an all-gather)
PROBES: list = []                  # callbacks run on the gradient of the first matmul's output


def gather(w: torch.Tensor) -> torch.Tensor:
    out = w * 1.0
    if torch.is_grad_enabled():
        GATHERED.append(out)
    return out


def probe(t: torch.Tensor) -> torch.Tensor:
    if t.requires_grad:
        t.register_hook(_run_probes)
    return t


def _run_probes(grad: torch.Tensor) -> None:
    for callback in PROBES:
        callback()


def program() -> torch.fx.GraphModule:
    """(w (8, 8), x (4, 8), ids (3,)) -> mm(tanh(probe(mm(x, G.t()))), G.t()).sum() + embedding(G, ids).sum()."""
    graph = torch.fx.Graph()
    w, x, ids = graph.placeholder("w"), graph.placeholder("x"), graph.placeholder("ids")
    g = graph.call_function(gather, (w,))
    g.meta["step"] = Step("all_gather", "dp", 0, None, "S(0)", "R", 0, "reduce_scatter", 0, regather=True)
    a = graph.call_function(probe, (graph.call_function(aten.mm.default, (x, graph.call_function(aten.t.default, (g,)))),))
    b = graph.call_function(aten.mm.default, (graph.call_function(aten.tanh.default, (a,)),
                                              graph.call_function(aten.t.default, (g,))))
    e = graph.call_function(aten.embedding.default, (g, ids))
    graph.output(graph.call_function(aten.add.Tensor, (graph.call_function(aten.sum.default, (b,)),
                                                        graph.call_function(aten.sum.default, (e,)))))
    assert reshard_after_forward(graph, {w}) == 1
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def eager(w, x, ids):
    g = w * 1.0
    return (torch.tanh(x @ g.t()) @ g.t()).sum() + torch.nn.functional.embedding(ids, g).sum()


def inputs():
    torch.manual_seed(0)
    return torch.randn(8, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True), torch.tensor([1, 5, 5])


@pytest.fixture(autouse=True)
def _clear():
    GATHERED.clear(), PROBES.clear()
    yield
    GATHERED.clear(), PROBES.clear()


def test_freed_after_its_last_backward_reader_and_exact():
    w, x, ids = inputs()
    loss = program()(w, x, ids)
    storage = StorageWeakRef(GATHERED[0].untyped_storage())
    GATHERED.clear()
    whole_at_probe = []
    PROBES.append(lambda: whole_at_probe.append(
        not storage.expired() and torch.UntypedStorage._new_with_weak_ptr(storage.cdata).nbytes() == 8 * 8 * 4))
    loss.backward()
    assert whole_at_probe == [True]  # the first matmul's backward had not run yet: refilled and kept for it
    assert storage.expired()  # freed after it, while `loss` (and so the graph) is still held
    assert_like_eager(loss, w, x, ids, contextlib.nullcontext())


def assert_like_eager(loss, w, x, ids, context) -> None:
    """`loss` and the gradients of `w` and `x` equal eager torch's (`eager`) in `context` (torch's default tolerances:
    the same ops in the same order, but one program's matmuls read a refilled copy)."""
    rw, rx = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    with context:
        ref = eager(rw, rx, ids)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(w.grad, rw.grad)
    torch.testing.assert_close(x.grad, rx.grad)


def test_split_input_then_weight_backward_keeps_it_for_the_second_pass():
    w, x, ids = inputs()
    loss = program()(w, x, ids)
    storage = StorageWeakRef(GATHERED[0].untyped_storage())
    GATHERED.clear()
    (gx,) = torch.autograd.grad(loss, [x], retain_graph=True)  # the input pass
    assert not storage.expired()  # the retained graph keeps the matmuls' saved G for the weight pass
    (gw,) = torch.autograd.grad(loss, [w])
    assert storage.expired()
    rw, rx = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    ref_gw, ref_gx = torch.autograd.grad(eager(rw, rx, ids), [rw, rx])
    torch.testing.assert_close(gx, ref_gx)
    torch.testing.assert_close(gw, ref_gw)


def test_bf16_autocast_matches_eager_autocast():
    w, x, ids = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = program()(w, x, ids)
    loss.backward()
    assert_like_eager(loss, w, x, ids, torch.autocast("cpu", dtype=torch.bfloat16))


def test_emptied_after_its_refill_is_a_typed_error():
    w, x, ids = inputs()
    loss = program()(w, x, ids)
    storage = GATHERED[0].untyped_storage()
    GATHERED.clear()
    PROBES.append(lambda: storage.resize_(0))  # something other than the pass frees it before its last reader
    with pytest.raises(UnsupportedOpError, match="refilled in backward and then released again"):
        loss.backward()
