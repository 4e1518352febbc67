"""The training-step contract shared by `ParallelModule.step` and `PipelineModule.step`.

    loss = pm.step(*inputs, target=target, loss_fn=loss_fn, **kwargs)   # forward + loss + backward
    optimizer.step(); optimizer.zero_grad()

The same user loop runs every plan: `step` runs the forward of the global batch, the loss and its backward,
ADDS the gradients to `.grad` (so several steps accumulate, as several `loss.backward()` of the eager model)
and returns the loss of the whole batch, detached, on every rank.

The loss: `loss_fn(output, target) -> scalar`, `output` in the model's own output structure (e.g. a
transformers `CausalLMOutput`, a tensor, a tuple); the MEAN over the items the loss counts (tokens, samples).
With `loss_fn=None` the model's first output must be its scalar loss (a transformers model given labels).

Microbatches (pipeline plans): the loss of the batch is the loss of microbatch j weighted by n_j / N, where
n_j = `item_count(target_j)` is the number of items microbatch j's loss averages over and N the batch's
(token-weighted, as Megatron-LM with `calculate_per_token_loss`: each microbatch's loss sum is divided by
the token count of the whole batch). A batch with no counted item gives NaN, as cross_entropy does; a microbatch with none (every label -100)
adds 0, not its NaN mean (`microbatch_loss.weighted_loss`). With a mean loss this equals the single-device loss of the whole batch exactly, also when
microbatches count different numbers of tokens (labels -100); a plain mean of the microbatch means does not.
By default n_j is read from the loss's graph (`runtime.loss_weight`): the model's own loss op when
loss_fn is None (e.g. a transformers causal-LM loss, which shifts the labels), else loss_fn's ATen graph;
`count_items` only when loss_fn cannot be traced; a loss whose count its graph does not show raises StepError.
Pass `item_count=` (with `target=`) when the loss counts items differently.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

from ..errors import ParallelizerError
from ..tracer.graph import TracedGraph

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index (torch docs), used by transformers

LossFn = Callable[[object, object], torch.Tensor]
STEP_KEYWORDS = ("target", "loss_fn", "item_count")  # step's own keyword arguments: never passed to the model


class StepError(ParallelizerError, ValueError):
    """`step` cannot compute a loss: no `loss_fn` and the model returns no scalar loss, or a non-scalar loss."""


def count_items(target) -> torch.Tensor | int:
    """How many items a mean loss over `target` averages over (default `item_count` of `step`).

    An integer target (class indices, token labels) counts its entries that are not `IGNORE_INDEX` (-100: the
    entries cross_entropy skips); a floating target counts its elements (mean squared error and the like);
    None (no target) counts 1, so microbatches weigh equally. Returns an int or a 0-d integer tensor.
    """
    if target is None:
        return 1
    leaves = [t for t in pytree.tree_leaves(target) if isinstance(t, torch.Tensor)]
    if not leaves:
        return 1
    first = leaves[0]
    if first.dtype.is_floating_point or first.dtype.is_complex:
        return first.numel()
    return (first != IGNORE_INDEX).sum()


def check_grad_enabled(where: str) -> None:
    """Raise StepError, on every rank alike and before any communication, when gradients are off
    (`torch.no_grad()`, `torch.inference_mode()`): a step runs backward. Before, a ParallelModule raised autograd's
    "element 0 of tensors does not require grad" from `backward`, and a pipeline torch's schedule error."""
    if not torch.is_grad_enabled():
        raise StepError(f"{where} under torch.no_grad() / torch.inference_mode(): a step runs backward. Remedy: call "
                        "step with gradients on; to evaluate, call the module itself: pm.eval(), then pm(*inputs) "
                        "under torch.no_grad(), then pm.train() (a PipelineModule too: `runtime.pipeline_eval`)")


def check_loss_source(traced: TracedGraph, loss_fn: LossFn | None, where: str, kwargs: dict | None = None,
                      given: tuple[str, ...] = ()) -> None:
    """Raise StepError, on every rank alike (it reads only the traced graph), when `loss_fn` is None and the
    model's first output is not a scalar loss. `where` names the caller in the message. `kwargs`: the step's
    keyword inputs; one the model was not traced with (`labels=` given to step but not in `example_kwargs`) is
    named with its remedy (before, the message told such a caller to pass labels=, which they had). `given`: the
    names of step's own arguments (`STEP_KEYWORDS`) the call gave; one the model was traced with as a keyword input
    (a forward(x, target)) is a StepError: step keeps it, so the model would be called without it."""
    spec = traced.exported.call_spec.in_spec
    traced_keywords = set(spec.child(1).context or ()) if spec is not None and spec.num_children == 2 else set()
    taken = sorted(traced_keywords.intersection(given) - set(kwargs or {}))
    if taken:  # step consumed them (before: "missing keyword(s) ['target']" told the caller to pass what they had)
        raise StepError(f"{where}: the model was traced with the keyword input(s) {taken}, which step takes as its "
                        f"own argument(s) ({', '.join(STEP_KEYWORDS)}), so the model would be called without them. "
                        f"Remedy: pass them to step positionally in the forward's order (pm.step(x, y) for forward(x, "
                        f"{taken[0]})), or rename the model's parameter")
    if loss_fn is not None:
        return
    out = traced.graph_module.graph.output_node()
    names = []
    torch.fx.node.map_arg(out.args, lambda a: names.append(a.name))
    shape = tuple(traced.node(names[0]).outputs[0].shape) if names and traced.node(names[0]).outputs else None
    if shape != ():
        known = traced_keywords | set(traced.call_inputs or traced.input_names)
        extra = sorted(k for k in (kwargs or {}) if k not in known)
        if extra:
            raise StepError(f"{where}: loss_fn=None, but the model's first output has shape {shape}, not a scalar "
                            f"loss: the model was traced without the keyword input(s) {extra} passed here, so its "
                            "traced program computes no loss from them (the call would also be refused as another "
                            f"structure). Remedy: trace with them, auto_parallelize(model, inputs, example_kwargs="
                            f"{{{extra[0]!r}: ...}}), then pass them to step as now; or pass loss_fn=lambda output, "
                            "target: ... with target=")
        raise StepError(f"{where}: loss_fn=None, but the model's first output has shape {shape}, not a scalar loss. "
                        "Remedy: pass loss_fn=lambda output, target: ... (a mean over the items it counts), or "
                        "call the model so that it returns its loss first (e.g. transformers models given labels=)")


def compute_loss(output, target, loss_fn: LossFn | None) -> torch.Tensor:
    """`loss_fn(output, target)`, or the model's own loss (the first tensor of `output`) when loss_fn is None.

    Raises StepError when the result is not a 0-d tensor (names its shape)."""
    if loss_fn is None:
        loss = next(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
    else:
        loss = loss_fn(output, target)
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise StepError(f"step: the loss must be a scalar tensor (a mean over the items it counts), got {shape}. "
                        "Remedy: reduce it in loss_fn (e.g. .mean(), or cross_entropy's default reduction='mean')")
    return loss
