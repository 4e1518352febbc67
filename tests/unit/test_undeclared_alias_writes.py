"""In-place writes through ops whose ATen schema declares a fresh result but which return their input or a view
of it in eager torch 2.13 (`tracer.graph.UNDECLARED_ALIASES`: einsum, type_as, atleast_Nd, sum_to_size, the
dropouts in eval or at p=0, unsafe_chunk / unsafe_split). torch.export keeps these ops and the in-place op
after them (no functionalization in the training IR), so `F.dropout(h, 0.0, False).relu_()` writes `h`. Code that
follows writes back to what they write walked only declared views (`is_view`): the tracer wrote the relu_ out of
place as if the dropout output were fresh and dropped it as dead code (traced loss off by 7.3 of 20.6), a buffer
written as `torch.atleast_1d(buf).mul_(0.9)` kept its old value, a parameter written through `atleast_2d` under
no_grad was not a written placeholder (r18h). The right values come from the same module run eagerly."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.planner.strategies import mutation_edges, written_placeholders
from parallelizer.rewriter.apply import _written_later
from parallelizer.tracer.cache_output import drop_dead_code
from parallelizer.tracer.fresh_writes import out_of_place_fresh_writes
from parallelizer.tracer.graph import Role, alias_source, written_through


class _Writes(nn.Module):
    """(4, 6, 8) -> Linear -> an in-place write through an undeclared alias of h (or of a buffer / parameter
    under no_grad) -> Linear -> sum."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.lin, self.out = nn.Linear(8, 8), nn.Linear(8, 8)
        self.register_buffer("running", torch.ones(8))

    def forward(self, x):
        h, w = self.lin(x), self.which
        if w == "dropout_eval":
            F.dropout(h, p=0.0, training=False).relu_()
        elif w == "dropout_p0":
            F.dropout(h, p=0.0, training=True).relu_()
        elif w == "einsum":
            torch.einsum("bij->bij", h).add_(1)
        elif w == "einsum_transpose":
            torch.einsum("bij->bji", h).mul_(2)
        elif w == "unsafe_chunk":
            torch.unsafe_chunk(h, 2, dim=-1)[0].mul_(2)
        elif w == "unsafe_split":
            torch.unsafe_split(h, 4, dim=-1)[1].mul_(2)
        elif w == "buffer_atleast_1d":
            with torch.no_grad():
                torch.atleast_1d(self.running).mul_(0.9)
            h = h * self.running
        elif w == "param_atleast_2d":
            with torch.no_grad():
                torch.atleast_2d(self.out.weight).mul_(0.99)
        elif w == "param_dropout":
            with torch.no_grad():
                F.dropout(self.out.bias, 0.0, False).add_(0.01)
        return self.out(h).sum()


WHICH = ("dropout_eval", "dropout_p0", "einsum", "einsum_transpose", "unsafe_chunk", "unsafe_split",
         "buffer_atleast_1d", "param_atleast_2d", "param_dropout")


def _build(which):
    torch.manual_seed(0)
    return _Writes(which), (torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(1)),)


def _raw(which):
    """export's own graph (before our normalisations): the alias op and the in-place op after it."""
    model, inputs = _build(which)
    return torch.export.export(model, inputs, strict=False).graph_module


def _node(gm, packet):
    return next(n for n in gm.graph.nodes if getattr(n.target, "overloadpacket", None) is packet)


@pytest.mark.parametrize("which", WHICH)
def test_a_write_through_an_undeclared_alias_keeps_eager_values_in_the_traced_program(which):
    """The traced program (after tracer normalisations) against the module on one device: the output and every
    parameter / buffer after one forward. Two op graphs, so torch.testing's float32 tolerance; the writes change
    the loss by 0.4 to 32 and a state entry by 0.0035 to 0.1, far outside it."""
    model, inputs = _build(which)
    eager = copy.deepcopy(model)
    want = eager(*inputs)
    traced = parallelizer.trace(model, inputs)
    program = traced.exported.module()
    torch.testing.assert_close(program(*inputs), want)
    state = program.state_dict()
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(state[name], value, msg=lambda m: f"{name}: {m}")


def test_out_of_place_fresh_writes_keeps_a_write_through_dropout_of_a_value_read_later():
    """`F.dropout(h, 0.0, False).relu_()` writes h, which the second Linear reads: the relu_ is no write of a
    fresh value and stays in place (it was rewritten to relu and its result read by nobody)."""
    gm = _raw("dropout_eval")
    out_of_place_fresh_writes(gm, [])
    assert any(n.target is torch.ops.aten.relu_.default for n in gm.graph.nodes), gm.graph


def test_drop_dead_code_keeps_a_write_through_einsum_whose_input_is_read():
    """`torch.einsum('bij->bij', h).add_(1)`: the add_ writes h's storage, which the second Linear reads."""
    gm = _raw("einsum")
    drop_dead_code(gm)
    assert any(n.target is torch.ops.aten.add_.Tensor for n in gm.graph.nodes), gm.graph


def test_written_through_and_written_later_follow_undeclared_aliases():
    """h = linear(x) is written by relu_ through dropout / by mul_ through unsafe_chunk's getitem."""
    for which in ("dropout_eval", "unsafe_chunk"):
        gm = _raw(which)
        h = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.linear.default)
        assert written_through(h) and _written_later(h), which


def test_alias_source_of_einsum_is_its_single_operand_and_none_for_a_contraction():
    gm = _raw("einsum")
    assert alias_source(_node(gm, torch.ops.aten.einsum)).target is torch.ops.aten.linear.default
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    assert alias_source(g.call_function(torch.ops.aten.einsum.default, ("ij,jk->ik", [a, b]))) is None


def test_a_buffer_written_through_atleast_1d_is_a_mutated_buffer():
    traced = parallelizer.trace(*_build("buffer_atleast_1d"))
    assert traced.mutated_buffers() == {"running": "mul_"}


def test_a_parameter_written_through_atleast_2d_or_dropout_is_a_written_placeholder():
    """The planner keeps a parameter written in forward where the write lands (`written_placeholders`)."""
    for which, placeholder in (("param_atleast_2d", "p_out_weight"), ("param_dropout", "p_out_bias")):
        traced = parallelizer.trace(*_build(which))
        assert placeholder in {p for p, _ in written_placeholders(traced, Role.PARAMETER)}, which


def test_mutation_edges_pin_the_input_of_an_undeclared_alias_that_is_written():
    """relu_ writes h through dropout: redistributing h on the dropout's input edge would write a copy."""
    traced = parallelizer.trace(*_build("dropout_eval"))
    dropout = next(n for n in traced.graph_module.graph.nodes
                   if getattr(n.target, "overloadpacket", None) is torch.ops.aten.dropout)
    assert (dropout.name, 0) in mutation_edges(traced)
