"""Pieces of nn.Module's contract and of bf16 support that need no ranks (issue 12 items 5-7, 11): what the
tracer records (requires_grad, persistence, mode), autocast regions made explicit, the bias split in bf16
within bfloat16's tolerance, dtype-aware tolerances, and the spec carried over to another mode's graph."""
import sys
from pathlib import Path

import torch
from torch import nn

import parallelizer
from parallelizer.runtime.modes import carry_over
from parallelizer.runtime.tolerance import compute_dtype, excess, tolerances
from parallelizer.rewriter.spec import spec_from_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from contract_workers import branchy, conv_bn, frozen  # noqa: E402
from precision_models import autocast_mlp  # noqa: E402


def _plan(traced, mesh):
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(traced, mesh)


def test_tracer_records_requires_grad_persistence_and_mode():
    model, inputs = frozen()
    model.register_buffer("scratch", torch.zeros(2), persistent=False)
    model.register_buffer("kept", torch.zeros(2))
    model.forward = lambda x: model.train_me(model.frozen(x)) + model.scratch + model.kept
    traced = parallelizer.trace(model, inputs)
    p = traced.parameters
    assert (p["frozen.weight"].requires_grad, p["train_me.weight"].requires_grad) == (False, True)
    assert (p["scratch"].persistent, p["kept"].persistent, p["frozen.weight"].persistent) == (False, True, True)
    assert traced.training and not parallelizer.trace(model.eval(), inputs).training


def test_autocast_region_is_inlined_with_torch_casts():
    model, (x,) = autocast_mlp()
    traced = parallelizer.trace(model, (x,))
    ops = [n.op_name for n in traced.compute_nodes()]
    assert "wrap_with_autocast" not in " ".join(ops) and ops.count("aten.to.dtype") == 6  # x, 2 W, 2 b, back
    assert any("torch.autocast('cpu', dtype=torch.bfloat16" in note for note in traced.notes)
    state = [*model.parameters()]
    out = traced.graph_module(*state, x)[0]
    assert out.dtype == torch.float32 and compute_dtype(traced) == torch.bfloat16
    assert excess(out, model(x), torch.bfloat16) <= 1.0


def test_bias_split_in_bf16_is_within_one_ulp():
    """The tracer rounds the matmul before adding the bias (eager rounds once): half an ulp of the matmul plus
    half an ulp of the sum, so at most 2^-7 of the larger of the two (an ulp is at most 2^-7 of a value),
    which is within bfloat16's tolerance (rtol 1.6e-2 of the tensor's scale)."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 64).to(torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    traced = parallelizer.trace(layer, (x,))
    split = traced.graph_module(layer.weight, layer.bias, x)[0]
    eager = layer(x)
    diff = (split.float() - eager.float()).abs()
    product = (x.float() @ layer.weight.float().T).abs()
    ulp = torch.finfo(torch.bfloat16).eps * torch.maximum(product, eager.float().abs())  # 2^-7 |value|
    assert diff.max() > 0 and bool((diff <= ulp).all())
    assert tolerances(torch.bfloat16) == (1.6e-2, 1e-5) and excess(split, eager) <= 1.0


def test_tolerances_follow_torch_testing_and_catch_real_errors():
    assert tolerances(torch.float32) == (1.3e-6, 1e-5)
    b = torch.linspace(-1, 1, 101)
    assert excess(b + 1e-6, b) <= 1.0 and excess(b + 1e-4, b) > 1.0
    wrong = b.clone().to(torch.bfloat16)
    wrong[50] += 0.1  # one element off by 10% of the tensor's scale
    assert excess(wrong, b.to(torch.bfloat16)) > 1.0
    assert excess(b.to(torch.bfloat16) * (1 + 2**-8), b.to(torch.bfloat16)) <= 1.0
    assert excess(torch.tensor([1, 2]), torch.tensor([1, 3])) == float("inf")


def test_eval_graph_reuses_the_plan_and_replicates_only_new_ops():
    model, inputs = conv_bn()
    train = parallelizer.trace(model, inputs)
    spec = spec_from_plan(_plan(train, {"dp": 2}))
    evaluated = parallelizer.trace(model.eval(), inputs)
    new, replicated = carry_over(spec, train, evaluated)
    assert replicated == () and new.params == spec.params
    bn = next(n for n in evaluated.compute_nodes() if n.op_name == "aten.batch_norm.default")
    assert bn.node.args[5] is False and new.nodes[bn.name] == spec.nodes[bn.name]
    model, inputs = branchy()
    train = parallelizer.trace(model, inputs)
    spec = spec_from_plan(_plan(train, {"dp": 2}))
    new, replicated = carry_over(spec, train, parallelizer.trace(model.eval(), inputs))
    assert replicated == ("mul",) and str(new.nodes["mul"].output) == "R"
