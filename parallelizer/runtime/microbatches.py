"""A pipeline call's global batch and its microbatches: what a pipeline plan is traced on (`microbatch_of`), the
check that every input splits into equal microbatches (`check_batch`), and a global call's tensors in the traced
order (`global_tensor_inputs`). Used by `runtime.pipeline` (each step), `PipelineModule`, the pipeline rehearsal
and `auto_parallelize`."""
from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from ..errors import PipelineError, PlanMismatchError
from ..tracer.graph import TracedGraph


def check_batch(tensors, microbatches: int, microbatch_size: int, names=None) -> None:
    """Raise PipelineError unless dim 0 of every tensor is `microbatches` x `microbatch_size`; `names`: what
    each tensor is, for the message ("input 'ids'", "target"; None: "an input or target")."""
    tensors = list(tensors)
    for t, name in zip(tensors, names or [None] * len(tensors)):
        what = name or "an input or target"
        if t.ndim == 0 or t.shape[0] != microbatches * microbatch_size:
            if t.ndim == 0:
                raise PipelineError(f"pipeline step: {what} is a 0-d tensor (one value for the whole batch, e.g. "
                                    "transformers' num_items_in_batch), which cannot be split into "
                                    f"{microbatches} microbatches: every tensor input of a pipeline carries the "
                                    "batch in dim 0. Remedy: pass it as a Python number (held as a constant of the "
                                    "traced program, the same for every microbatch), or leave it out (a pipeline "
                                    "weighs each microbatch's loss by its own count of items); expanding it to the "
                                    "batch changes what the model computes with it")
            if t.shape[0] == 1 and microbatches * microbatch_size > 1:
                raise PipelineError(f"pipeline step: {what} of shape {tuple(t.shape)} has no batch dim "
                                    f"to split into {microbatches} microbatches (a dim 0 of 1 broadcast over the "
                                    "batch, e.g. position_ids of shape (1, T)): every tensor input "
                                    "of a pipeline carries the batch in dim 0. Remedy: expand it to the batch "
                                    f"(x.expand({microbatches * microbatch_size}, ...)), or leave it out / pass a "
                                    "Python value")
            raise PipelineError(f"pipeline step: {what} of shape {tuple(t.shape)} does not split into "
                                f"{microbatches} microbatches of {microbatch_size} (the batch size the model was "
                                f"traced with): dim 0 must be {microbatches * microbatch_size}. Remedy: pass "
                                "batches of microbatches x the traced batch (drop or pad a short last batch), "
                                "or re-trace")


def microbatch_of(args: tuple, kwargs: dict, microbatches: int) -> tuple[tuple, dict]:
    """The first microbatch of a global call (every tensor's dim 0 cut to batch / microbatches): what a
    pipeline plan is traced on. Raises PipelineError when a tensor's dim 0 does not split (`check_batch`)."""
    paths, _ = pytree.tree_flatten_with_path((tuple(args), kwargs))
    named = [(_call_name(path, ()), t) for path, t in paths if isinstance(t, torch.Tensor)]
    tensors = [t for _, t in named]
    batch = next((t.shape[0] for t in tensors if t.ndim), 0)
    if not batch or batch % microbatches:
        raise PipelineError(f"pipeline: the example batch (dim 0 of {tuple(tensors[0].shape) if tensors else ()}) "
                            f"does not split into {microbatches} microbatches. Remedy: a batch that is a multiple "
                            f"of {microbatches}, or microbatches= a divisor of the batch")
    check_batch(tensors, microbatches, batch // microbatches, [f"input {name!r}" for name, _ in named])
    return pytree.tree_map(lambda t: t[:batch // microbatches] if isinstance(t, torch.Tensor) else t,
                           (tuple(args), kwargs))


def global_tensor_inputs(traced: TracedGraph, args: tuple, kwargs: dict, microbatches: int) -> list[torch.Tensor]:
    """The tensor leaves of a GLOBAL call `model(*args, **kwargs)` in the traced input order, for a graph
    traced on one microbatch. The call's structure and constants are checked by `TracedGraph.tensor_inputs`
    on the first microbatch.

    Raises PipelineError when a tensor's dim 0 is not `microbatches` x the traced batch (`check_batch`), TypeError /
    ValueError / PlanMismatchError as `tensor_inputs` for another structure, constant or shape."""
    paths, _ = pytree.tree_flatten_with_path((tuple(args), kwargs))
    leaves = [leaf for _, leaf in paths]
    check_batch([t for t in leaves if isinstance(t, torch.Tensor)], microbatches,
                traced.node(traced.input_names[0]).outputs[0].shape[0],
                [f"input {_call_name(path, traced.forward_positional)!r}" for path, t in paths
                 if isinstance(t, torch.Tensor)])
    micro = microbatch_of(args, kwargs, microbatches)
    position = {id(t): i for i, t in enumerate(pytree.tree_leaves(micro))}
    flat = [leaves[position[id(t)]] for t in traced.tensor_inputs(*micro, microbatches=microbatches)]
    return [_traced_integer_width(name, t, traced.node(name).outputs[0].dtype)
            for name, t in zip(traced.input_names, flat)]


def _call_name(path, positional: tuple[str, ...]) -> str:
    """A tensor leaf of a call `((args), {kwargs})` named as the caller wrote it: `ids` (a positional input, by
    the forward's parameter name), `mask`, `batch['x']`."""
    first, *rest = path[1:]
    key = getattr(first, "key", getattr(first, "idx", None))
    if path[0].idx == 0:
        key = positional[key] if isinstance(key, int) and key < len(positional) else f"args[{key}]"
    return str(key) + pytree.keystr(tuple(rest))


def _traced_integer_width(name: str, t: torch.Tensor, want: torch.dtype) -> torch.Tensor:
    """`t` in the traced dtype when only its integer width differs (`tensor_inputs` lets int32 ids through): a
    pipeline's stages receive values in buffers made for the traced dtypes, so an int32 tensor sent into an int64
    buffer was read as other numbers (GPT-2's labels on pp=2 x dp=2: "Target 21474836506 is out of bounds" on one
    rank, its peers waiting for ever; an integer mask would have been silently wrong). Raises PlanMismatchError
    when a value does not fit the traced dtype."""
    if t.dtype == want:
        return t
    cast = t.to(want)
    if not torch.equal(cast.to(t.dtype), t):
        raise PlanMismatchError(f"input {name!r} has dtype {t.dtype} but the pipeline was traced (and planned) with "
                                f"{want}, which cannot hold all of its values: a pipeline's stages send and receive "
                                f"the traced dtypes. Remedy: trace and plan again with inputs of dtype {t.dtype}")
    return cast
