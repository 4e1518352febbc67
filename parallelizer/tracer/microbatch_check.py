"""Does cutting the batch into microbatches change what the model computes? (pipeline plans)

A pipeline runs each stage on one microbatch at a time (the global batch / microbatches along dim 0), so a
forward that mixes the samples of its batch computes another function there than the model called on the
whole batch: BatchNorm normalises by each microbatch's statistics in training, `x - x.mean(0)` centres each
microbatch on its own mean, an in-batch softmax or contrastive term sees a quarter of the batch. A buffer the
forward writes (BatchNorm's running statistics, an EMA, a counter) is written once per microbatch instead of
once per batch. `auto_parallelize` would then train such a model to other numbers than one device, with no
error (public reports of the class: GPipe / torchgpipe's "deferred batch norm", pytorch#175024 and #1051 for
a BatchNorm called twice per step; trial r10b: batch centering in a block on pp=2 x dp=2, loss 1.7e-2 off one
device at the first step, 1580x the float32 bound; BatchNorm1d in the blocks: running means 1.4e4x the bound
off after 3 steps). The runtime's reference for pipelines is gradient accumulation over the microbatches
(README, pipeline rehearsal); this check makes the difference visible where the user did not ask for it.

`microbatch_mixing` runs the model once on the whole batch and once per microbatch in order, records the
tensor outputs of every module call (forward hooks: innermost modules first), and reports the first call
whose outputs on the microbatches, concatenated along dim 0, differ from its output on the whole batch by
more than 10x torch.testing's default tolerance of the dtype (`eager_check._worst`), then the first buffer
that ends elsewhere. Outputs that are not batch-major (scalars, a loss, tensors whose concatenation has
another shape, such as a (T, T) mask) are not compared; mixing in the root module's own code is seen only
through its per-sample outputs (a scalar loss is weighted by `runtime.loss_weight` instead). Skipped (None)
for meta models, models over `eager_check.MAX_ELEMENTS` parameter elements and forwards that draw random
numbers (the microbatches would draw other masks; found by a second whole-batch call from another generator
state). Buffers, parameters (a parameter the forward writes in place, such as MoCo's EMA key encoder, is
compared like a buffer) and torch's RNG state are restored afterwards.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

from .eager_check import _fresh, _on_meta, _state_kept, _too_large, _worst, state_tensors
from .graph import carries_grad
from .slots import one_process_view


def microbatch_mixing(model: torch.nn.Module, args: tuple, kwargs: dict, microbatches: int,
                      loss_weights: torch.Tensor | None = None) -> tuple[str, str] | None:
    """(where, message) when `model` computes other values on the whole batch `args`/`kwargs` (dim 0 of every
    tensor is the batch) than on its `microbatches` microbatches one at a time (module docstring), else None.
    `loss_weights` (shape (microbatches,)): how the pipeline weighs each microbatch's own loss (the model's 0-d
    first output; `runtime.loss_weight`); given, the whole batch's loss is compared with the weighted sum of
    the microbatches' losses too, which finds a loss that mixes the samples in the model's own code (an in-batch
    contrastive loss: trial r10b, CLIP's logits a @ b.T with a cross-entropy against the diagonal, pm.step 1.44
    where one device gives 2.16 on pp=2 x dp=2).
    A forward that computes otherwise when called twice on the whole batch from other generator states draws
    random numbers (dropout, numpy): skipped (None). Raises nothing of its own; the model's own exceptions
    are not caught (the caller traced it already)."""
    if microbatches <= 1 or _on_meta(model, args, kwargs) or _too_large(model):
        return None
    parts = _split(args, kwargs, microbatches)
    if parts is None:
        return None
    with _state_kept(model) as restore, torch.no_grad():
        whole, whole_buffers = _record(model, [(args, kwargs)])
        restore()
        torch.manual_seed(int(torch.randint(2**62, ())))  # other generator states (every device): a random forward
        again, again_buffers = _record(model, [(args, kwargs)])  # differs from itself
        if (_first_module(whole, again, 1) or _weighted_loss(whole, again, torch.ones(1))
                or _first_buffer(whole_buffers, again_buffers, 1)):
            return None
        restore()
        micro, micro_buffers = _record(model, parts)
    return (_cut_across_batch(whole, micro, microbatches, parts) or _first_module(whole, micro, microbatches)
            or _weighted_loss(whole, micro, loss_weights) or _first_buffer(whole_buffers, micro_buffers, microbatches))


def _cut_across_batch(whole, micro, microbatches: int, parts) -> tuple[str, str] | None:
    """(where, message) when an output of the model has the batch in dim 0 on the whole batch but not on a
    microbatch (trial r13a): a pipeline cuts dim 0 of every tensor input, so an input whose batch is in another
    dim (mRoPE position ids of shape (3, B, T), a sequence-first (T, B, D) tensor) whose dim 0 happens to split
    was cut across something else and broadcast against the others: each microbatch paired the wrong values and
    the pipeline trained another function, silently (a pp=2 step gave loss 0.881 where one device gives 1.259).
    Such outputs are not batch-major in the microbatch run, so the module comparison skips them."""
    root, per_micro = whole.get(("", 0)), micro.get(("", 0), [])
    if root is None or len(per_micro) != microbatches:
        return None
    first = next(t for t in pytree.tree_leaves(parts[0]) if isinstance(t, torch.Tensor))
    batch = first.shape[0] * microbatches
    (_, outputs), = root
    for i, full in enumerate(outputs):
        shapes = {tuple(p[1][i].shape) for p in per_micro if i < len(p[1])}
        expected = (batch // microbatches, *full.shape[1:])
        if full.ndim and full.shape[0] == batch and shapes and shapes != {expected}:
            return "the model", (
                f"pipeline with {microbatches} microbatches: the model's output {i} has shape {tuple(full.shape)} "
                f"on the whole batch (dim 0 = the batch, {batch}) but {sorted(shapes)[0]} on a microbatch, not "
                f"{expected}: a pipeline cuts dim 0 of every tensor input, so an input whose batch is in another dim "
                "(e.g. position ids of shape (3, B, T), a sequence-first (T, B, D) tensor) was cut across something "
                "else and each microbatch paired the wrong values. Remedy: pass every input with its batch in dim 0 "
                "(permute it there, and back inside forward), or a mesh without 'pp'")
    return None


def _weighted_loss(whole, micro, loss_weights: torch.Tensor | None) -> tuple[str, str] | None:
    """(where, message) when the model's 0-d first output on the whole batch differs from the microbatches'
    first outputs weighted by `loss_weights` (the pipeline's batch loss), else None."""
    root = whole.get(("", 0))
    if loss_weights is None or root is None or not root[0][1] or root[0][1][0].ndim:
        return None
    parts = [outputs[0] for _, outputs in micro.get(("", 0), []) if outputs and outputs[0].ndim == 0]
    if len(parts) != len(loss_weights):
        return None
    full = root[0][1][0]
    combined = _combined(parts, loss_weights.tolist()).to(full.dtype)
    worst = _worst([(0, combined, full)])
    if worst is None:
        return None
    m = len(parts)
    return "the model's loss", (
        f"pipeline with {m} microbatches: the model's loss on the whole batch is {full.item():.6g}, its "
        f"{m} microbatches' losses weighted as the pipeline weighs them give {combined.item():.6g} (|difference| "
        f"{worst[1]:.3g}): the loss mixes the samples of the batch in the model's own code (an in-batch "
        "contrastive or ranking loss: a @ b.T over the batch, a batch statistic), so on the pipeline it sees only "
        "each microbatch's samples and trains another function than your model on the whole batch. Remedy: a "
        "mesh without 'pp', or return the per-sample outputs and compute such a loss on the whole batch "
        "outside the model")


def _combined(losses: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """The batch loss a pipeline computes from its microbatch losses (float64): sum_j w_j loss_j, where a
    microbatch of weight 0 (it counts no item: every label -100, an all-zero mask) adds exactly 0, as
    `runtime.microbatch_loss.weighted_loss` adds it; its mean is 0/0 = NaN, and NaN x 0 made this check warn that a right
    per-sample loss "mixes the samples of the batch" (round 22, r22b)."""
    return sum((torch.zeros((), dtype=torch.float64) if w == 0 else loss.double() * w
                for loss, w in zip(losses, weights)), torch.zeros((), dtype=torch.float64))


def _split(args: tuple, kwargs: dict, microbatches: int) -> list[tuple[tuple, dict]] | None:
    """The microbatches of a global call (dim 0 of every tensor cut in `microbatches` equal parts, as the
    pipeline cuts them), or None when some tensor's dim 0 does not split."""
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if not tensors or any(t.ndim == 0 or t.shape[0] % microbatches for t in tensors):
        return None
    chunks = [pytree.tree_map_only(torch.Tensor, lambda t, j=j: t.tensor_split(microbatches)[j], (args, kwargs))
              for j in range(microbatches)]
    return [(tuple(a), k) for a, k in chunks]


def _record(model: torch.nn.Module, calls: list[tuple[tuple, dict]]):
    """Run `model` on each call in order; return {(module name, call index): [per call: (its tensor inputs, its
    tensor outputs)]} (innermost modules first, in the order of the first call) and the buffers and parameters
    after the last call."""
    seen: dict[tuple[str, int], list[list[torch.Tensor]]] = {}
    count: dict[str, int] = {}

    def hook(name):
        def record(_module, inputs, output):
            index = count.get(name, 0)
            count[name] = index + 1
            seen.setdefault((name, index), []).append(tuple(
                [t.detach().clone() for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]
                for x in (inputs, output)))
        return record
    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules()]
    try:
        with one_process_view([]):  # as on one device, also on ranks (`slots.one_process_view`)
            for args, kwargs in calls:
                count.clear()
                model(*_fresh(args), **_fresh(kwargs))
    finally:
        for h in handles:
            h.remove()
    return seen, {name: t.detach().clone() for name, t in state_tensors(model)}


def _batch_major_pairs(whole: list[torch.Tensor], per_micro: list[list[torch.Tensor]], microbatches: int):
    """(index, the microbatches' tensors concatenated along dim 0, the whole batch's) for each floating tensor
    that is batch-major in both runs (its microbatch pieces concatenate to the whole batch's shape)."""
    pairs = []
    for i, full in enumerate(whole):
        pieces = [p[i] for p in per_micro if i < len(p)]
        if full.ndim == 0 or len(pieces) != microbatches or any(p.ndim != full.ndim for p in pieces):
            continue
        joined = torch.cat(pieces, 0)
        if joined.shape == full.shape and joined.dtype == full.dtype and carries_grad(full.dtype):
            pairs.append((i, joined, full))
    return pairs


def _first_module(whole, micro, microbatches: int) -> tuple[str, str] | None:
    """(where, message) of the first module call (innermost first) whose batch-major outputs differ; where its
    inputs differ already, the mixing happened in its parent's own code before the call, which is named."""
    for (name, index), ((inputs, outputs),) in whole.items():
        per_micro = micro.get((name, index), [])
        if len(per_micro) != microbatches:
            continue
        worst = _worst(_batch_major_pairs(outputs, [p[1] for p in per_micro], microbatches))
        if worst is not None:
            i, diff, shape = worst
            where = f"module '{name or 'the model'}'"
            if _worst(_batch_major_pairs(inputs, [p[0] for p in per_micro], microbatches)) is not None:
                parent = name.rsplit(".", 1)[0] if "." in name else ""
                where = f"the code of module '{parent or 'the model'}' before its call of '{name}'"
            return name or "the model", (
                f"pipeline with {microbatches} microbatches: {where} computes other values on the whole "
                f"batch than on its {microbatches} microbatches one at a time (output {i} of shape {shape}: max "
                f"|whole batch - microbatches| = {diff:.3g}): its forward mixes the samples of the batch (BatchNorm "
                "statistics in training, a mean or softmax over the batch dim, an in-batch loss), or dim 0 of the "
                "inputs is not their batch (a sequence-first input, nn.LSTM / nn.Transformer's default layout: the "
                "microbatches then cut every sequence), so the pipeline trains another function than your model on "
                f"the whole batch, as gradient accumulation over {microbatches} microbatches would for a batch in "
                "dim 0. Remedy: a mesh without 'pp' (data and tensor parallelism synchronise batch statistics, e.g. "
                "BatchNorm as SyncBatchNorm), a per-sample layer (LayerNorm, GroupNorm), inputs passed batch-first "
                "(transpose inside forward), or keep the pipeline if gradient-accumulation semantics are what you "
                "want and dim 0 is the batch")
    return None


def _first_buffer(whole: dict, micro: dict, microbatches: int) -> tuple[str, str] | None:
    pairs = [(name, micro[name], b) for name, b in whole.items()  # integer counters too (exact: `_worst`)
             if name in micro and micro[name].shape == b.shape]
    worst = _worst(pairs)
    if worst is None:
        return None
    name, diff, shape = worst
    return name, (f"pipeline with {microbatches} microbatches: buffer or parameter '{name}' (shape {shape}), which "
                  f"the forward writes, ends {diff:.3g} away from its value after one call on the whole batch: it is "
                  f"updated once per microbatch ({microbatches} times per step) instead of once per batch (running "
                  "statistics, an EMA, a counter), as in gradient accumulation over the microbatches. Remedy: a "
                  "mesh without 'pp', or keep the pipeline if gradient-accumulation semantics are what you want")


def loss_fn_mixing(loss: Callable, outputs: list[torch.Tensor], batch_major: list[bool], target: torch.Tensor,
                   weight: Callable[[torch.Tensor], float], microbatches: int) -> str | None:
    """A message when the user's loss on the whole batch differs from its microbatch losses weighted as the
    pipeline weighs them, on the given outputs (random values of the global batch's shapes), else None.

    `loss(outputs, target) -> 0-d`: the loss as `PipelineModule.step` applies it to one microbatch's outputs;
    `batch_major[i]`: output i has the batch as dim 0 (cut in `microbatches` chunks, else passed whole);
    `weight(target_j)`: microbatch j's weight (n_j / N, or 1 for a sum). A loss_fn that mixes the samples of
    the batch (CLIP's logits a @ b.T over the batch with a cross-entropy against the diagonal: trial r10b,
    pm.step 1.44 where one device gives 2.16 on pp=2 x dp=2) sees only each microbatch's samples on a
    pipeline. Errors of the loss on these values (e.g. a log of negative random values) skip the check."""
    try:
        with torch.no_grad():
            whole = loss(tuple(outputs), target)
            cut = [t.tensor_split(microbatches) if major else [t] * microbatches
                   for t, major in zip(outputs, batch_major)]
            parts = [loss(tuple(c[j] for c in cut), target.tensor_split(microbatches)[j]) for j in range(microbatches)]
            combined = _combined(parts, [float(weight(t)) for t in target.tensor_split(microbatches)])
    except Exception:  # noqa: BLE001 - advisory: the step itself runs the loss on real values
        return None
    if not isinstance(whole, torch.Tensor) or whole.ndim or not whole.is_floating_point():
        return None
    worst = _worst([(0, combined.to(whole.dtype), whole)])
    if worst is None or not torch.isfinite(whole):
        return None
    return (f"pipeline with {microbatches} microbatches: loss_fn gives {whole.item():.6g} on the whole batch of "
            f"(random) outputs and {combined.item():.6g} weighted over its {microbatches} microbatches as the "
            "pipeline weighs them: it mixes the samples of the batch (an in-batch contrastive or ranking loss: "
            "a @ b.T over the batch, a batch statistic), so on the pipeline it sees only each microbatch's samples "
            "and trains another function than one device. Remedy: a mesh without 'pp', or compute such a loss "
            "outside pm.step on the whole batch's outputs")
