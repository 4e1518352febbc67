"""The pipeline rehearsal's whole-batch loss: when one device running the global batch at once is a comparison.

A pipeline runs each stage on one microbatch at a time, so what it computes is gradient accumulation over its
microbatches, each microbatch's loss weighted as `PipelineModule.step` weighs it (`runtime.loss_weight`). The
rehearsal's comparison of the plan is with one device's gradient accumulation over the same microbatches
(`pipeline_rehearsal._accumulated_reference`): the batch loss of every step, every gradient, buffer and
parameter, like for like whatever the model computes. Beside it, the pipeline's batch loss is compared with one
device running the whole batch at once: an independent check of the microbatch weights, and a comparison of the
plan only when one device computes the same function both ways. It is not (`left_out` says why, and the report
shows the measured |diff| labelled NOT JUDGED instead of folding it into the loss) when:
- the forward writes buffers or parameters (BatchNorm's running statistics, an EMA teacher): then it is not run,
  since running it would move the reference's state (r13b);
- the forward draws random numbers (dropout p > 0, a rand_like router): the whole batch draws other numbers;
- the model mixes the samples of its batch (`tracer.microbatch_check.microbatch_mixing` with the pipeline's
  microbatch weights: BatchNorm in training, an in-batch contrastive loss, a loss normalised by the whole batch's
  count): the pipeline trains another function than the model on the whole batch by construction, which the
  rehearsal warns about (MicrobatchWarning) and cannot judge the plan by. Round 22 (r22f): SegGPT's pp=2 / pp=4
  reports showed "loss 3.19e+00" / "9.56e+00" (that pair, about 1000x its bound) next to "numerics match".
The judged pair's second judge (the float64 copy, or the model without the plan's recipe) is that copy's own
whole batch (`exact`), never its gradient accumulation: the float64 judge allows 8x |one device - float64| of
the same tensor (`judge.float64_excess`), and with the accumulated float64 loss in that place the allowance was
|whole batch - accumulation|, so any whole-batch difference judged itself a match (how SegGPT's 3.19 passed).
"""
from __future__ import annotations

import torch

from ..tracer.graph import TracedGraph
from ..tracer.microbatch_check import microbatch_mixing
from .judge import _loss, _max_diff, random_ops
from .precision import autocast

NOT_RUN_STATE = ("not run: the forward writes buffers or parameters, which the pipeline writes once per microbatch "
                 "(running the whole batch would also move the reference's state)")
"""`left_out`'s reason for a forward that mutates state (`TracedGraph.mutated_state`)."""
RANDOM_DRAWS = "not comparable: the forward draws random numbers ({}), so the whole batch draws other numbers"
"""`left_out`'s reason for a forward drawing random numbers (`judge.random_ops`)."""
MIXES = ("not comparable: the model mixes the samples of its batch ({}; MicrobatchWarning), so one device's whole "
         "batch is another function than the gradient accumulation over the {} microbatches that the pipeline "
         "computes; compared per microbatch instead")
"""`left_out`'s reason for a model whose microbatches compute otherwise than its whole batch."""
OWN_DIFFERENCE = ("not comparable: one device's own whole batch differs from its own gradient accumulation over the "
                  "same {} microbatches by {:.2e} ({:.3g}x the bound): the model's loss is not the weighted sum of its "
                  "microbatches' losses (it mixes the samples of its batch, or is weighted otherwise), so that "
                  "difference is the model's, not the plan's; compared per microbatch instead")
"""`own_difference`'s reason (the microbatch check skipped the model or found nothing)."""


def whole_batch_loss(model: torch.nn.Module, traced: TracedGraph, inputs: tuple, kwargs: dict,
                     recipe: str | None = None) -> torch.Tensor | None:
    """The loss (`judge._loss`, float64, 0-d) of `model` on the whole batch at once (its forward under the
    mixed-precision `recipe`, `runtime.precision.autocast`), or None when the forward updates buffers or
    parameters (`NOT_RUN_STATE`: a per-block EMA teacher written once more per step left the fp32 reference 0.1
    away; r13b)."""
    if traced.mutated_state():
        return None
    with torch.no_grad():
        with autocast(recipe):
            out = model(*inputs, **kwargs)
        return _loss(out).double()


def left_out(model: torch.nn.Module, traced: TracedGraph, inputs: tuple, kwargs: dict, weights: torch.Tensor
             ) -> tuple[str, tuple[str, str] | None]:
    """(why the whole-batch pair is no comparison of the plan, "" when it is one; the microbatch check's
    (where, message) when it found the model mixing the samples of its batch, else None), for `model` in its
    state before any step, on the global batch `inputs` / `kwargs` (dim 0 of every tensor) cut into
    `len(weights)` microbatches weighted by `weights` (shape (m,), `pipeline_rehearsal._weighting`). The check
    restores the model's buffers, parameters and torch's RNG state (`tracer.microbatch_check`)."""
    if traced.mutated_state():
        return NOT_RUN_STATE, None
    if random := random_ops(traced):
        return RANDOM_DRAWS.format(random), None
    try:
        found = microbatch_mixing(model, tuple(inputs), kwargs, len(weights), weights)
    except Exception as error:  # noqa: BLE001 - the model's own error on the whole batch: said, not judged
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"not judged: the microbatch check could not run ({type(error).__name__}: {first})", None
    if found is None:
        return "", None
    return MIXES.format(found[0], len(weights)), found


def labelled(measured: tuple[float, str, float], why: str) -> str:
    """The report's note for a whole-batch pair left out of the verdict: `why` (`left_out`) with its measured
    |diff| and ratio to the bound (`measured`: `judge._max_diff`'s (|diff|, name, ratio); |diff| None: not
    run)."""
    if not why or measured[1] == "":  # judged: no note (before, " (measured ...)" read NOT JUDGED with no reason)
        return why
    return f"{why} (measured |diff| {measured[0]:.2e}, {measured[2]:.3g}x the bound, not judged)"


def own_difference(accumulated: torch.Tensor, whole: torch.Tensor, microbatches: int, compute) -> str:
    """`OWN_DIFFERENCE` when one device's gradient accumulation over the microbatches (`accumulated`, the batch
    loss) and its whole batch at once (`whole`) differ beyond the bound at dtype `compute` (`judge._max_diff`),
    else "": the first step's direct evidence that the whole-batch pair cannot judge the plan, for a model the
    microbatch check skips (over `eager_check.MAX_ELEMENTS` parameter elements) or whose mixing it does not
    see. Then |plan - whole batch| <= |plan - accumulated| + |accumulated - whole| keeps a judged whole-batch
    pair from ever flipping a verdict that the per-step pair did not."""
    diff, _, ratio = _max_diff([("whole batch on one device", accumulated, whole)], compute)
    return OWN_DIFFERENCE.format(microbatches, diff, ratio) if ratio > 1 else ""
