"""The bf16 mixed-precision recipe of the runtime (`runtime.precision`) on one process: a plan made with
precision="bf16" for an fp32 model records "autocast_bf16" and runs its forward in bf16 (bf16 logits) with
fp32 parameters and fp32 gradients, equal to the eager model under torch.autocast(bfloat16) at bf16's
tolerance; plans in fp32 or with a defaulted precision run the traced dtypes, equal to eager at 1e-5.
The rehearsal's recipe bound (`recipe_excess`) accepts rounding and rejects a wrong term."""
import pytest
import torch

import parallelizer
from parallelizer import zoo
from parallelizer.errors import PipelineError, PrecisionError
from parallelizer.runtime.precision import autocast
from parallelizer.runtime.rehearsal import recipe_excess

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


def test_unknown_recipe_and_pipeline_under_autocast_raise():
    with pytest.raises(PrecisionError, match="autocast_fp8"):
        autocast("autocast_fp8")
    traced = parallelizer.trace(*zoo.gpt(device="meta", **{**GPT, "n_layer": 2}))
    from parallelizer.rewriter.spec import spec_from_plan
    from parallelizer.runtime.pipeline import build, cut_stages
    plan = parallelizer.plan(traced, {"dp": 1}, precision="bf16")
    with pytest.raises(PipelineError, match="mixed-precision"):
        build(traced, spec_from_plan(plan), cut_stages(traced, 2), None, pp=2, schedule="1f1b", microbatches=2,
              loss_fn=None)


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
