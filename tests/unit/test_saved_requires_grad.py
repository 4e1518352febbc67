"""A product keeps an operand only for its partner's gradient (round 27, r27e; `cost_model.memory._Partners`).

torch's autograd saves mm's first operand only when its second requires grad, and the reverse (derivatives.yaml,
gen_variable_type.py `guard_for`), and linear / matmul / bmm / addmm / baddbmm / einsum decompose into such
products; convolution's one joint formula keeps both. Before round 27 `cost_model.memory` kept both operands of
every product whatever required grad: a frozen weight's layer was charged its input, and an FSDP plan re-gathered a
first layer's weight in backward (`rewriter.reshard`) that nothing keeps. Checked here against autograd itself:

- the rule (`saved_slots`) against the tensors `torch.autograd.graph.saved_tensors_hooks` sees each op keep, for
  every op and every choice of operands requiring grad (first operand, second, both);
- the plan's saved bytes (`local_storage.local_saved_bytes`, the replay `api.to_plan` prices) against the bytes the
  hooks see an eager one-device step keep, on small models with a first layer on the input and frozen middle layers
  (linear, einsum, bmm / baddbmm with a frozen operand, conv);
- the FSDP re-gather: neither priced (`rewriter.reshard.regathered` with the graph's requires_grad) nor run (the
  refill's partners checked at run time) for a first layer, and still both for a middle layer.
"""
from __future__ import annotations

import contextlib
import io

import pytest
import torch
import torch.fx
from torch import nn

import parallelizer
from cost_model.memory import backward_nodes, saved_slots
from parallelizer.core.redistribute import Step
from parallelizer.rewriter.reshard import regathered, reshard_after_forward

aten = torch.ops.aten


def _operands(op):
    """(args builder, kwargs) of one op, small odd sizes; the builder takes which operand indices require grad."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    return {
        "mm": lambda: [r(3, 5), r(5, 4)],
        "bmm": lambda: [r(2, 3, 5), r(2, 5, 4)],
        "matmul": lambda: [r(2, 3, 5), r(5, 4)],
        "linear": lambda: [r(2, 3, 5), r(4, 5)],
        "linear_bias": lambda: [r(2, 3, 5), r(4, 5), r(4)],
        "addmm": lambda: [r(4), r(3, 5), r(5, 4)],
        "baddbmm": lambda: [r(2, 3, 4), r(2, 3, 5), r(2, 5, 4)],
        "mul": lambda: [r(3, 5), r(3, 5)],
        "conv2d": lambda: [r(1, 2, 5, 5), r(3, 2, 3, 3)],
    }[op]


TARGETS = {"mm": aten.mm.default, "bmm": aten.bmm.default, "matmul": aten.matmul.default,
           "linear": aten.linear.default, "linear_bias": aten.linear.default, "addmm": aten.addmm.default,
           "baddbmm": aten.baddbmm.default, "mul": aten.mul.Tensor, "conv2d": aten.conv2d.default}
OPERANDS = {"addmm": (1, 2), "baddbmm": (1, 2), "linear_bias": (0, 1)}  # the product's two operands


def _kept_by_autograd(target, args: list[torch.Tensor]) -> set[int]:
    """Indices of `args` whose storage autograd keeps for backward (a saved view counts as its base: linear keeps
    weight.t(), matmul a reshaped view)."""
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        target(*args)
    ptrs = {t.untyped_storage().data_ptr() for t in saved}
    return {i for i, a in enumerate(args) if a.untyped_storage().data_ptr() in ptrs}


@pytest.mark.parametrize("op", list(TARGETS))
@pytest.mark.parametrize("grads", ["first", "second", "both"])
def test_the_rule_keeps_what_autograd_keeps(op, grads):
    i, j = OPERANDS.get(op, (0, 1))
    needs = {"first": {i}, "second": {j}, "both": {i, j}}[grads]
    args = [a.requires_grad_(k in needs) for k, a in enumerate(_operands(op)())]
    target = TARGETS[op]
    out = target(*args)
    kept, _ = saved_slots(target, tuple(args), {}, out, frozenset(needs))
    assert set(kept) == _kept_by_autograd(target, args), (op, grads)


def test_einsum_keeps_at_most_the_operands_the_rule_names():
    """einsum's rule names its operand list (arg 1) as a whole: an upper bound of what autograd keeps; nothing when no
    operand requires grad is impossible (no backward), so: both named whenever one requires grad."""
    for needs in ({0}, {1}, {0, 1}):
        a, b = torch.randn(2, 3, 5), torch.randn(2, 5, 4)
        a.requires_grad_(0 in needs), b.requires_grad_(1 in needs)
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = torch.einsum("bij,bjk->bik", a, b)
        kept, _ = saved_slots(aten.einsum.default, ("bij,bjk->bik", [a, b]), {}, out, frozenset({1}))
        assert kept == (1,) and len(saved) == len(needs)  # bmm keeps one operand per operand requiring grad


# --- the plan's saved bytes against an eager step's ---------------------------------------------------------------


class FirstLinear(nn.Module):
    """x (8, 6) -> linear (6 -> 10) -> relu -> linear (10 -> 3): the first layer's input needs no gradient."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(6, 10), nn.Linear(10, 3)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x))).sum()


class FrozenMiddle(nn.Module):
    """x -> linear -> gelu -> FROZEN linear -> gelu -> linear: the frozen layer keeps no input."""

    def __init__(self):
        super().__init__()
        self.l1, self.mid, self.l3 = nn.Linear(6, 10), nn.Linear(10, 12), nn.Linear(12, 3)
        self.mid.requires_grad_(False)

    def forward(self, x):
        return self.l3(nn.functional.gelu(self.mid(nn.functional.gelu(self.l1(x))))).sum()


class FrozenProducts(nn.Module):
    """einsum, bmm and baddbmm each with one frozen operand (a frozen parameter), the other requiring grad."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 10)
        self.w = nn.Parameter(torch.randn(10, 7), requires_grad=False)
        self.b = nn.Parameter(torch.randn(2, 7, 5), requires_grad=False)
        self.c = nn.Parameter(torch.randn(2, 4, 7))

    def forward(self, x):                                  # x (2, 4, 6)
        h = torch.tanh(self.inp(x))                        # (2, 4, 10), requires grad
        e = torch.einsum("bij,jk->bik", h, self.w)         # keeps the frozen w only
        m = torch.bmm(torch.sin(e), self.b)                # keeps the frozen b only
        return torch.baddbmm(self.c, torch.cos(m), self.b.transpose(1, 2)).sum()  # keeps b only


class FirstConv(nn.Module):
    """image -> conv (first layer: its input is kept for the weight's gradient) -> relu -> FROZEN conv (its input AND
    weight kept: convolution's joint formula) -> sum."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(2, 4, 3), nn.Conv2d(4, 3, 3)
        self.c2.requires_grad_(False)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x))).sum()


CASES = {"first linear": (FirstLinear, (8, 6)), "frozen middle linear": (FrozenMiddle, (8, 6)),
         "frozen einsum / bmm / baddbmm": (FrozenProducts, (2, 4, 6)),
         "first and frozen conv": (FirstConv, (1, 2, 7, 7))}


def _eager_saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the storages autograd keeps for backward in one eager step (unique storages, whole, parameters and
    buffers left out, the input included as the plan's replay counts it)."""
    state = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(x)
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved
                if t.untyped_storage().data_ptr() not in state}.values())


@pytest.mark.parametrize("case", list(CASES))
def test_the_plans_saved_bytes_are_an_eager_steps(case):
    cls, shape = CASES[case]
    torch.manual_seed(0)
    model, x = cls(), torch.randn(*shape)
    traced = parallelizer.trace(model, (x,))
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"dp": 1}, precision="fp32")
    assert plan.cost.memory_bytes["activations"] == _eager_saved_bytes(model, x), case


# --- FSDP: a first layer's weight is neither re-gathered nor priced so ----------------------------------------------


def test_a_first_layers_weight_is_not_priced_as_regathered():
    torch.manual_seed(0)
    model = FirstLinear()
    traced = parallelizer.trace(model, (torch.randn(8, 6),))
    trained = [ph for p in traced.parameters.values() if p.requires_grad for ph in p.placeholders]
    live = backward_nodes(traced.graph_module, trained)
    weight = {p.fqn: p.placeholders[0] for p in traced.parameters.values()}
    kept = {fqn: regathered(traced.nodes[ph].node, lambda n: n.name in live) for fqn, ph in weight.items()}
    assert kept == {"l1.weight": False, "l1.bias": False, "l2.weight": True, "l2.bias": False}
    assert regathered(traced.nodes[weight["l1.weight"]].node)  # without the graph's requires_grad: the upper answer


REGATHERS: list[int] = []


def gather(w: torch.Tensor) -> torch.Tensor:
    """A local copy standing for the all-gather (as tests/unit/test_reshard_after_backward.py); counts its runs."""
    REGATHERS.append(int(torch.is_grad_enabled()))
    return w * 1.0


def _two_layers() -> torch.fx.GraphModule:
    """(w1, w2 (8, 8), x (4, 8)) -> mm(tanh(mm(x, G1.t())), G2.t()).sum(), G1 / G2 gathered from w1 / w2."""
    graph = torch.fx.Graph()
    w1, w2, x = graph.placeholder("w1"), graph.placeholder("w2"), graph.placeholder("x")
    gathered = []
    for w in (w1, w2):
        g = graph.call_function(gather, (w,))
        g.meta["step"] = Step("all_gather", "dp", 0, None, "S(0)", "R", 0, "reduce_scatter", 0, regather=True)
        gathered.append(g)
    h = graph.call_function(aten.mm.default, (x, graph.call_function(aten.t.default, (gathered[0],))))
    y = graph.call_function(aten.mm.default, (graph.call_function(aten.tanh.default, (h,)),
                                              graph.call_function(aten.t.default, (gathered[1],))))
    graph.output(graph.call_function(aten.sum.default, (y,)))
    assert reshard_after_forward(graph, {w1, w2}) == 2
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("x_grad", [False, True])
def test_a_first_layers_weight_is_regathered_only_when_its_input_needs_a_gradient(x_grad):
    REGATHERS.clear()
    torch.manual_seed(0)
    w1, w2 = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=x_grad)
    loss = _two_layers()(w1, w2, x)
    assert REGATHERS == [1, 1]
    loss.backward()
    assert REGATHERS == [1, 1, 0] + [0] * x_grad  # w2's G always (tanh(h) needs its gradient); w1's only with x's
    rw1, rw2, rx = (t.detach().clone().requires_grad_(t.requires_grad) for t in (w1, w2, x))
    (torch.tanh(rx @ rw1.t()) @ rw2.t()).sum().backward()
    torch.testing.assert_close(w1.grad, rw1.grad)
    torch.testing.assert_close(w2.grad, rw2.grad)
    if x_grad:
        torch.testing.assert_close(x.grad, rx.grad)
