"""bf16 mixed precision at run time: the one recipe the runtime implements, and its context manager.

Recipe "autocast_bf16" (recorded as `Plan.config["mixed_precision"]` when a plan is made with
precision="bf16" explicitly for a model traced in fp32; `planner.api.to_plan`): PyTorch's automatic mixed
precision, `torch.autocast(device_type, dtype=torch.bfloat16)` around the FORWARD of the emitted program
(`ParallelModule.forward`), with nothing else changed:

  * weights: the parameters stay fp32 (they ARE the main weights; the optimizer steps them, in fp32);
    inside the forward autocast casts each weight to bf16 where an op of its lower-precision list (matmul,
    linear, addmm, bmm, baddbmm, conv, ...) reads it, and that bf16 copy is what autograd saves for backward;
  * activations: the outputs of those ops are bf16, so the activations between them, the activation
    collectives of tensor parallelism (a row-parallel Partial sum: each rank's product bf16, summed in fp32 and
    rounded once, `core.redistribute.sum_dtype`) and most saved
    activations are bf16; ops outside autocast's lists run in their inputs' dtype (fp32 + bf16 -> fp32 by
    type promotion, e.g. a residual add);
  * gradients: autograd returns each fp32 parameter's gradient in fp32 (the backward of autocast's cast), so
    gradient accumulation across steps and microbatches and the gradient reduction over data-parallel axes
    (all-reduce / reduce-scatter of `rewriter.grad_sync`) run in fp32, as Megatron-LM does by default
    ("bfloat16 requires gradient accumulation and all-reduce to be done in fp32").
  * FSDP (parameters stored Shard over a data axis): the all-gather moves the fp32 shards and autocast casts
    after it; FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` would gather in bf16 (half
    the bytes). The planner prices what runs (round 25, r25b: `planner.autocast_dtypes`): parameter collectives
    at 4 B/element, activations in the dtypes autocast gives each op (before, everything at bf16's 2 B: the
    all-gathers ran twice the priced bytes and a narrow GPT held 14% more than priced on an H200).

Memory against `cost_model.memory.BYTES_PER_PARAM[("bf16", "adamw")]` = (2, 4, 12) = 18 B/param (Megatron's
bf16 params + fp32 main params + fp32 grads + Adam m, v): this runtime holds 4 (fp32 param = main weight)
+ 4 (fp32 grad) + 8 (Adam m, v) = 16 B/param persistently, plus the 2 B/param bf16 weight copies autocast
makes in the forward and autograd keeps until the backward has used them: 18 B/param at the peak of a step
(the moment that bounds memory), 16 between steps. Measured (saved-tensor hooks, the in-repo GPT with 1.73 M
parameters, 2 layers of width 256, one process): 1.973 B/param of bf16 weight copies saved, i.e. 17.97 B/param
at the peak (tests/unit/test_mixed_precision_runtime.py checks 1.9-2.0 per matrix parameter). Weights read by ops outside autocast's list (biases added
by aten.add, norm weights) get no bf16 copy. Megatron instead keeps the bf16 copy persistently and the fp32
main weights in the optimizer: the same 18 B/param at peak.

Pipeline plans (`runtime.pipeline`, `runtime.bitpipe`): every stage's program runs under this context
(`StageModule.forward`), the loss outside it as above; the stages' send / receive buffers (and boundary codecs)
are in the dtypes the stages produce under autocast (`runtime.pipeline.boundary_dtypes`: each stage graph run
under autocast on fake tensors), e.g. fp32 for a GPT's residual stream, bf16 for a bias-free matmul's output;
activation gradients come back in their activation's dtype.

Not implemented: fp16 (needs a gradient scaler).
"""
from __future__ import annotations

import contextlib

import torch

from ..errors import PrecisionError

AUTOCAST_BF16 = "autocast_bf16"
RECIPES = {AUTOCAST_BF16: torch.bfloat16}


def autocast(recipe: str | None, device_type: str = "cpu"):
    """The context the emitted program's forward runs in: `torch.autocast(device_type, bfloat16)` for
    "autocast_bf16", a no-op context for None (the traced dtypes, e.g. fp32).

    Raises:
        PrecisionError: an unknown recipe (a plan from a newer version): names the known ones.
    """
    if recipe is None:
        return contextlib.nullcontext()
    if recipe not in RECIPES:
        raise PrecisionError(f"mixed precision recipe {recipe!r} is not known to this runtime (known: "
                             f"{', '.join(RECIPES)}). Remedy: re-plan with precision='bf16' or 'fp32'")
    return torch.autocast(device_type, dtype=RECIPES[recipe])


def describe(recipe: str | None) -> str:
    """What the single-device reference of a rehearsal runs, in words."""
    if recipe is None:
        return "the single-device model in its traced dtypes"
    return f"the single-device model under torch.autocast(bfloat16) ({recipe}: fp32 weights and gradients)"



def check_recipe_runs(traced, args: tuple, kwargs: dict, recipe: str | None) -> None:
    """Raise PrecisionError when the traced program raises under the recipe's autocast on the example inputs
    (`traced.exported`, one call, no_grad, torch's RNG restored; skipped for meta models and models over
    `tracer.eager_check.MAX_ELEMENTS` parameter elements, as `eager_check` skips them). Autocast makes matmul /
    linear outputs bfloat16, and an op that needs operands of one dtype then fails: `index_add` of a bf16 expert
    output into an fp32 `zeros_like` ("index_add_(): self (Float) and source (BFloat16) must have the same
    scalar type"), which the model itself raises under torch.autocast, or a dtype the trace fixed in fp32
    (`zeros_like(x, dtype=y.dtype)` is traced with y in fp32, so the program keeps fp32 where the eager model
    under autocast takes bf16). Before, such a bf16 plan was made and every rank raised torch's RuntimeError
    in its first forward (trial r10b: an index_add expert dispatch, precision="bf16" on tp=2 and fsdp dp=2).

    Raises:
        PrecisionError: quotes the error and gives the remedy.
    """
    if recipe is None:
        return
    from ..tracer.eager_check import _fresh, _on_meta, _too_large

    model = traced.exported.module()
    if _on_meta(model, args, kwargs) or _too_large(model):
        return
    tensor = next(iter([*model.parameters(), *model.buffers()]), None)
    try:
        with torch.random.fork_rng(), torch.no_grad(), autocast(recipe, tensor.device.type if tensor is not None
                                                                  else "cpu"):
            model(*_fresh(args), **_fresh(kwargs))
    except PrecisionError:
        raise
    except Exception as err:  # noqa: BLE001 (the program's error under the recipe, quoted)
        raise PrecisionError(
            f"the traced program raises under the mixed-precision recipe {recipe!r} (torch.autocast to bfloat16) "
            f"on the example inputs: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. "
            "Autocast makes matmul / linear outputs bfloat16, and an op that needs operands of one dtype fails: "
            "the model raises the same under torch.autocast, or the trace fixed a dtype in float32 (a dtype= "
            "read from a tensor while tracing in fp32). Remedy: plan with precision='fp32' (--precision fp32), "
            "or cast explicitly in the model (e.g. index_add(..., y.to(out.dtype)))") from err
