"""The bf16 mixed-precision recipe of the runtime (`runtime.precision`) on one process: a plan made with
precision="bf16" for an fp32 model records "autocast_bf16" and runs its forward in bf16 (bf16 logits) with
fp32 parameters and fp32 gradients, equal to the eager model under torch.autocast(bfloat16) at bf16's
tolerance; plans in fp32 or with a defaulted precision run the traced dtypes, equal to eager at 1e-5.
The rehearsal's recipe bound (`recipe_excess`) accepts rounding and rejects a wrong term. Pipeline stages under
the recipe send the dtypes an eager autocast run of the stages produces (`runtime.pipeline.boundary_dtypes`)."""
import copy
import types

import pytest
import torch

import parallelizer
from parallelizer import zoo
from parallelizer.core.layout import Layout
from parallelizer.errors import PrecisionError
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline import (_boundaries, _examples, _on_wire, boundary_codecs, boundary_dtypes,
                                           cut_stages, stage_graph)
from parallelizer.runtime.precision import autocast
from parallelizer.runtime.rehearsal import recipe_excess
from parallelizer.runtime.tolerance import excess

GPT = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64, block_size=8, batch=4, seq_len=8)


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    """auto_parallelize outside a launcher creates a one-process gloo group; do not leak it to other tests."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _logits(out):
    return out[0] if isinstance(out, tuple) else out


def test_bf16_plan_runs_autocast_with_fp32_weights_and_gradients():
    model, (ids,) = zoo.gpt(**GPT)
    reference = zoo.gpt(**GPT)[0]
    pm = parallelizer.auto_parallelize(model, (ids,), cluster="h100:1x1", precision="bf16")
    assert pm.plan.config["mixed_precision"] == "autocast_bf16" and pm.spec.autocast == "autocast_bf16"
    logits = _logits(pm(ids))
    assert logits.dtype == torch.bfloat16  # the lm_head matmul ran in bf16
    logits.float().pow(2).mean().backward()
    with autocast("autocast_bf16"):
        expected = _logits(reference(ids))
    expected.float().pow(2).mean().backward()
    torch.testing.assert_close(logits, expected, rtol=1.6e-2, atol=0.25)  # bf16 rounding of |logits| ~ 10
    for name, p in pm.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name  # fp32 main weights and grads
        ref = reference.get_parameter(name).grad
        assert (p.grad - ref).abs().max() <= 2e-2 * ref.abs().max() + 1e-5, name


@pytest.mark.parametrize("precision", ["fp32", None])
def test_fp32_and_defaulted_precision_run_the_traced_dtypes(precision):
    model, (ids,) = zoo.gpt(**GPT)
    reference = zoo.gpt(**GPT)[0]
    pm = parallelizer.auto_parallelize(model, (ids,), cluster="h100:1x1", precision=precision)
    assert "mixed_precision" not in pm.plan.config and pm.spec.autocast is None
    assert pm.plan.config["precision"] == (precision or "bf16")  # a defaulted bf16 only prices bf16
    logits = _logits(pm(ids))
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, _logits(reference(ids)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision,runs,dtype", [(None, "runs: float32", torch.float32),
                                                   ("fp32", "runs: float32", torch.float32),
                                                   ("bf16", "runs: torch.autocast(bfloat16)", torch.bfloat16)])
def test_show_and_summary_say_what_runs(precision, runs, dtype):
    """`show` printed "precision bf16: bf16 params and activations ..." for a defaulted bf16 (GPU preset: the
    default cluster of auto_parallelize and of `plan` without --cluster) while the program ran float32 (trial
    r9c). The text now says what the runtime runs; the dtype of the logits checks it."""
    from parallelizer.plan_io import plan_text

    model, (ids,) = zoo.gpt(**GPT)
    pm = parallelizer.auto_parallelize(model, (ids,), cluster="h100:1x1", precision=precision)
    assert _logits(pm(ids)).dtype == dtype
    row = next(line for line in plan_text(pm.plan).splitlines() if line.startswith("precision "))
    assert runs in row and runs in pm.plan.summary(), row
    if precision is None:
        assert "as priced" in row and "--precision bf16" in row, row


def test_recipe_bound_accepts_rounding_and_rejects_a_wrong_term():
    exact = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rounded = exact.to(torch.bfloat16).double()
    jitter = 1e-3 * torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    other = (exact + jitter).to(torch.bfloat16).double()  # another computation of the values, rounded
    assert recipe_excess(rounded, rounded, exact) == 0.5
    assert recipe_excess(other, rounded, exact) <= 1.0
    assert recipe_excess(rounded + 0.1 * exact, rounded, exact) > 1.0  # a term of 10% of the values
    assert recipe_excess(rounded + 1e-3, exact, exact) == float("inf")  # no rounding to hide behind
    assert recipe_excess(exact, exact, exact) == 0.0


def test_unknown_recipe_raises():
    with pytest.raises(PrecisionError, match="autocast_fp8"):
        autocast("autocast_fp8")


class IndexAddExperts(torch.nn.Module):
    """Top-1 experts dispatched with index_add into an fp32 zeros_like (pytorch#160285's MoE shape): under bf16
    autocast the bmm output is bf16, and index_add raises on one device too."""

    def __init__(self, cast: bool = False) -> None:
        super().__init__()
        self.cast = cast
        self.router = torch.nn.Linear(8, 4, bias=False)
        self.w = torch.nn.Parameter(torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(0)) * 0.3)

    def forward(self, x):                                 # (N, 8)
        p, idx = self.router(x).softmax(-1).max(-1)
        y = torch.bmm(x.unsqueeze(1), self.w[idx]).squeeze(1) * p.unsqueeze(-1)
        out = torch.zeros_like(x, dtype=y.dtype if self.cast else None)
        return out.index_add(0, torch.arange(x.shape[0]), y).float().pow(2).mean()


def test_a_model_that_raises_under_the_recipe_is_refused_before_any_forward():
    """trial r10b: precision="bf16" for a model whose forward raises under torch.autocast made a plan, and every
    rank raised torch's RuntimeError (index_add: Float self, BFloat16 source) in its first forward; now
    auto_parallelize and rehearse raise PrecisionError quoting the program's error; so they do for a model whose
    trace fixed a dtype in fp32 (zeros_like(x, dtype=y.dtype) runs eagerly under autocast, not as traced)."""
    from parallelizer.runtime.pipeline_rehearsal import rehearse_pipeline
    from parallelizer.runtime.rehearsal import checked_spec

    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="same scalar type"), torch.autocast("cpu", dtype=torch.bfloat16):
        IndexAddExperts()(x)  # one device raises too
    with pytest.raises(PrecisionError, match="index_add_.*same scalar type.*precision='fp32'"):
        parallelizer.auto_parallelize(IndexAddExperts(), (x,), cluster="h100:1x1", precision="bf16")
    plan = parallelizer.plan(parallelizer.trace(IndexAddExperts(), (x,)), {"dp": 1}, cluster="h100:1x1",
                             precision="bf16")
    assert plan.config["mixed_precision"] == "autocast_bf16"
    for given in (plan, spec_from_plan(plan)):
        with pytest.raises(PrecisionError, match="index_add_"):
            checked_spec(given, lambda: (IndexAddExperts(), (x,)), {})
    with pytest.raises(PrecisionError, match="index_add_"):  # raised before any pipeline rank starts
        rehearse_pipeline(lambda: (IndexAddExperts(), (torch.cat([x, x]),)), {}, spec_from_plan(plan),
                          types.SimpleNamespace(microbatches=2, pp=2))
    model = IndexAddExperts(cast=True)  # runs eagerly under autocast, but the trace fixed zeros_like's fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    with pytest.raises(PrecisionError, match="fixed a dtype in float32"):
        parallelizer.auto_parallelize(model, (x,), cluster="h100:1x1", precision="bf16")


def _eager_stage_dtypes(model, traced, cut):
    """Run each stage graph eagerly on real values under torch.autocast(bfloat16), chaining the stages: the
    dtype of every value sent, and of the gradient each stage's received values get back (what flows over the
    boundary backwards)."""
    full = {**dict(model.named_parameters()), **dict(model.named_buffers()), **traced.constant_values()}
    by_placeholder = {ph: full[fqn].detach() for fqn, p in traced.parameters.items() for ph in p.placeholders}
    ids = zoo.gpt(**GPT)[1][0]
    values, sent, grads = {traced.input_names[0]: ids}, {}, {}
    for k in range(cut.num_stages):
        tg = stage_graph(traced, cut, k)
        received = {n: values[n].detach().requires_grad_(values[n].is_floating_point()) for n in cut.inputs[k]}
        args = [by_placeholder[n.name] if n.name in by_placeholder else received[n.name]
                for n in tg.graph_module.graph.find_nodes(op="placeholder")]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = tg.graph_module(*args)
        floats = [t for t in out if t.requires_grad]
        torch.autograd.backward(floats, [torch.ones_like(t) for t in floats])
        grads.update((n, t.grad.dtype) for n, t in received.items() if t.grad is not None)
        values.update(zip(cut.outputs[k], out))
        sent.update((n, t.dtype) for n, t in zip(cut.outputs[k], out))
    return sent, grads


def test_boundary_dtypes_under_the_recipe_equal_an_eager_autocast_run():
    """`runtime.pipeline.boundary_dtypes` (fake tensors under autocast) gives every boundary value the dtype an
    eager autocast run of the stages gives it, and its gradient comes back in that dtype: at block boundaries
    (a residual sum: fp32) and at a cut right after a linear layer (bf16); without a recipe, the traced dtypes."""
    model = zoo.gpt(**{**GPT, "n_layer": 2})[0]
    traced = parallelizer.trace(model, zoo.gpt(**GPT)[1])
    first_linear, after_linear = _cut_after_first_linear(traced)
    seen = set()
    for cut in (cut_stages(traced, 2), after_linear):
        inferred = boundary_dtypes(traced, cut, "autocast_bf16")
        sent, grads = _eager_stage_dtypes(model, traced, cut)
        assert {n: inferred[n] for n in sent} == sent
        assert grads and all(grads[n] == sent[n] for n in grads), (grads, sent)  # gradients in the value's dtype
        assert boundary_dtypes(traced, cut, None) == {n: traced.node(n).outputs[0].dtype for n in inferred}
        seen |= {sent[n] for n in cut.outputs[0]}
    assert {torch.bfloat16, torch.float32} <= seen  # both kinds of boundary value occur
    assert inferred[first_linear] == torch.bfloat16 and traced.node(first_linear).outputs[0].dtype == torch.float32


def _cut_after_first_linear(traced):
    first_linear = next(i.name for i in traced.compute_nodes() if i.block == traced.blocks[0].members[0]
                        and "linear" in str(i.target))
    names = [i.name for i in traced.compute_nodes()]
    return first_linear, _boundaries(traced, {n: int(j > names.index(first_linear)) for j, n in enumerate(names)}, 2)


@pytest.mark.parametrize("kind", ["int8", "lowrank"])
def test_boundary_codecs_under_the_recipe_code_the_bf16_values_sent(kind):
    """Pipeline-boundary compression under the recipe: a codec is made for the dtype the stage sends (bf16 after
    a linear layer), its wire tensor has the dtype torch's stage allocates (`_on_wire`), and the value and its
    gradient go through encode / decode in bf16 (int8: packed into fp32 words)."""
    model = zoo.gpt(**{**GPT, "n_layer": 2})[0]
    traced = parallelizer.trace(model, zoo.gpt(**GPT)[1])
    first_linear, cut = _cut_after_first_linear(traced)
    dtypes = boundary_dtypes(traced, cut, "autocast_bf16")
    spec = spec_from_plan(parallelizer.plan(traced, {"dp": 1}, precision="bf16"))
    codecs = boundary_codecs(traced, cut, 0, {}, spec, 0, (kind,), 4, dtypes)
    codec = codecs[cut.outputs[0].index(first_linear)]
    assert codec is not None and codec.dtype == torch.bfloat16
    example = _examples(traced, cut.outputs[0], dict.fromkeys(cut.outputs[0], Layout.replicate(1)), spec, 0, dtypes)
    wire_example = _on_wire(example, codecs)[cut.outputs[0].index(first_linear)]
    x = torch.randn(codec.shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).requires_grad_()
    wire = codec.encode(x)
    assert wire.dtype == wire_example.dtype == codec.wire_dtype == (torch.float32 if kind == "int8" else torch.bfloat16)
    received = wire.detach().requires_grad_()
    decoded = codec.decode(received)
    assert decoded.dtype == torch.bfloat16
    decoded.backward(torch.ones_like(decoded))
    assert received.grad.dtype == wire.dtype
    wire.backward(received.grad)
    assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape


def test_autocast_keeps_about_2_bytes_per_parameter_of_bf16_weights_for_backward():
    """The memory the recipe adds to fp32 params + grads + Adam (16 B/param): the bf16 weight copies autocast
    makes and autograd saves, about 2 B per matrix parameter, so the peak matches BYTES_PER_PARAM's 18."""
    model, (ids,) = zoo.gpt(**{**GPT, "batch": 3})  # 24 tokens: no activation has a weight's shape
    pm = parallelizer.auto_parallelize(model, (ids,), cluster="h100:1x1", precision="bf16")
    shapes = {s for p in pm.parameters() if p.ndim == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    saved = {}

    def pack(t):
        if t.dtype == torch.bfloat16 and tuple(t.shape) in shapes:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = _logits(pm(ids)).float().pow(2).mean()
    loss.backward()
    matrices = sum(p.numel() for p in pm.parameters() if p.ndim == 2)
    assert 1.9 <= sum(saved.values()) / matrices <= 2.0, (sum(saved.values()), matrices)


class _Conv1D(torch.nn.Module):
    """transformers' GPT-2 Conv1D: torch.addmm(bias, x, weight)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_in, n_out) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


@pytest.mark.parametrize("layer", ["linear", "addmm"])
def test_a_users_autocast_around_pm_gives_eagers_dtypes_after_a_split_bias(layer):
    """The tracer splits a bias off linear / addmm (added after a row-parallel all-reduce); under a torch.autocast
    the trace did not see (around pm(...)), the plain add promoted the bf16 product to float32: the output, and the
    MLP's hidden activation, were float32 where eager's are bf16 (round 16 new-user trial). The program now adds
    the bias in the product's dtype, as linear / addmm do."""
    torch.manual_seed(0)
    make = (lambda i, o: torch.nn.Linear(i, o)) if layer == "linear" else _Conv1D
    model = torch.nn.Sequential(make(16, 32), torch.nn.GELU(), make(32, 8))
    reference = copy.deepcopy(model)
    x = torch.randn(4, 16)
    pm = parallelizer.auto_parallelize(model, (x,), cluster="h100:1x1")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = pm(x), reference(x)
    assert expected.dtype == torch.bfloat16 and out.dtype == expected.dtype
    assert excess(out, expected) <= 1.0  # bf16's rtol of the tensor's scale: the sum is rounded twice here
    out.float().sum().backward()
    expected.float().sum().backward()
    for name, p in pm.named_parameters():
        ref = reference.get_parameter(name).grad
        assert p.grad.dtype == ref.dtype == torch.float32, name
        assert (p.grad - ref).abs().max() <= 2e-2 * ref.abs().max() + 1e-5, name
    plain = pm(x)  # without autocast the cast is a no-op: float32 as traced, as eager
    assert plain.dtype == torch.float32
    torch.testing.assert_close(plain, reference(x))
