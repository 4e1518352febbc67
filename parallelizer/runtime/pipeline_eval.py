"""Evaluation forward of a pipeline plan: `pm.eval(); with torch.no_grad(): out = pm(*inputs)` on a
`PipelineModule`, the validation loss a training loop computes every N steps (Megatron-LM's and torchtitan's
forward-only pipeline passes).

A pipeline's stages run the programs traced in the mode the model was traced in (train: dropout drawing, BatchNorm
updating its running statistics), inside torch's training schedules, which run forward and backward together. An
evaluation needs other programs, so, as `ParallelModule` does for a mode (`runtime.modes`):

1. the model's storage-free skeleton (`modes.Retracer`, kept by `build_pipeline_module`) is traced again on ONE
   microbatch of the call with its modules in the modes of the PipelineModule's mirrors (after `pm.eval()`: every
   module in eval mode; dropout off, BatchNorm reading its running statistics);
2. the plan's intra-stage decisions are carried over to that graph (`modes.carry_over`: same stored layouts, same
   strategy for every op that computes the same thing; an op only this mode has runs replicated, with a warning);
3. it is cut at the plan's blocks (`stage_cut.cut_stages` with the plan's blocks per stage), and each stage this
   rank runs in evaluation gets its program (`rewriter.apply.rewrite` of `stage_graph` / `stage_spec`), reading the
   SAME local parameter and buffer tensors as the training stage module (nothing is copied or gathered);
4. the call's batch is split into microbatches of the traced microbatch size (any number of them: an evaluation
   batch need not be the training batch), and each runs through the stages in order: stage k's sub-mesh ranks
   send the values stage k + 1 receives to the ranks with the same (dp, tp) coordinates that run it (blocking
   send / recv over the default group, in the same global order on every rank, so it cannot deadlock), forward
   only, under `torch.no_grad`: no gradient, no `.grad` and no optimizer state is touched;
5. the last stage's outputs of the microbatches are merged (outputs with the microbatch in dim 0: concatenated;
   the model's own loss, a 0-d first output: weighted by each microbatch's item count as `PipelineModule.step`
   weighs it, `loss_weight.own_loss_weighting`, so it is one device's loss of the whole batch) and broadcast over
   the pipeline group from the rank that ran the last stage: EVERY rank returns the model's output structure,
   full tensors, detached, as the unparallelised model returns it (at the price of sending the outputs to every
   pp rank: for large logits, evaluate a loss, e.g. the model's own with labels=).

Which copy runs a stage in evaluation: stage k on the pp rank that holds it (`stage_pp_rank`; for BitPipe, which
keeps two copies of every stage, the copy of its first pipeline direction, copy 0).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from ..errors import PipelineError
from ..rewriter.apply import RankProgram, rewrite
from ..rewriter.collectives import carried_view, find_group
from ..rewriter.spec import ShardingSpec, spec_from_plan
from ..rewriter.verify import verify
from ..tracer.graph import TracedGraph
from ..tracer.leaves import unflatten_in_order
from .in_place import broadcast_in_place
from .loss_weight import own_loss_weighting, returns_scalar_loss
from .microbatch_loss import batch_loss
from .microbatches import global_tensor_inputs, microbatch_of
from .modes import autocast_exactly, carry_over
from .pipeline import _examples, boundary_dtypes, stage_spec
from .precision import autocast
from .stage_cut import StageCut, cut_stages, stage_graph, stage_pp_rank


@dataclass
class EvalPipeline:
    """The evaluation programs of one (modes, microbatch input shapes) key on this rank.

    traced / spec / cut: the model traced in the evaluation modes on one microbatch, the plan's whole-graph
        intra-stage spec carried over to it, and its cut at the plan's blocks.
    holder: model stage k -> the pp rank that runs it in evaluation.
    programs: model stage k -> (its program, the training StageModule whose local tensors it reads), for the
        stages this rank runs.
    dtypes: the dtype of every value crossing a stage boundary (under the plan's precision recipe).
    replicated: ops of the evaluation graph the plan has no counterpart for (run replicated).
    """

    traced: TracedGraph
    spec: ShardingSpec
    cut: StageCut
    holder: list[int]
    programs: dict[int, tuple[RankProgram, torch.nn.Module]]
    dtypes: dict[str, torch.dtype]
    replicated: tuple[str, ...]


def stage_holders(schedule: str, pp: int, microbatches: int, num_stages: int) -> tuple[list[int], dict]:
    """(model stage k -> the pp rank running it in evaluation, model stage k -> the index of its module in that
    rank's `PipelineRun.stages`). torch's schedules: `stage_pp_rank`, a rank's modules in stage order; BitPipe:
    copy 0 of stage k (`planner.bitpipe.bitpipe_actions`' stage_to_rank), a rank's modules in copy order."""
    if schedule == "bitpipe":
        from ..planner.bitpipe import bitpipe_actions
        to_rank = dict(bitpipe_actions(pp, microbatches).stage_to_rank)
    else:
        to_rank = {k: stage_pp_rank(schedule, k, num_stages, pp) for k in range(num_stages)}
    holder = [to_rank[k] for k in range(num_stages)]
    index = {k: sorted(x for x in to_rank if to_rank[x] == holder[k]).index(k) for k in range(num_stages)}
    return holder, index


def build_eval(pm, modes: dict[str, bool], args: tuple, kwargs: dict, microbatches: int) -> EvalPipeline:
    """This rank's `EvalPipeline` for a call (`args`, `kwargs`: global, `microbatches` x the traced batch) with the
    modules in `modes` (module name -> training; "" the root). Module docstring, steps 1-3.

    Raises:
        PlanMismatchError / TraceError: as `ParallelModule` tracing another mode (`modes.Retracer.trace`).
        PipelineError: the evaluation graph's inputs are not the training graph's, or a stage would read a
            parameter or buffer the plan put on another stage (names it and the remedy).
    """
    plan, run = pm.plan, pm.run
    pipe = plan.pipeline
    micro_args, micro_kwargs = microbatch_of(args, kwargs, microbatches)
    with autocast_exactly(pm.traced.autocast):  # as the planned graph was traced (`modes.autocast_exactly`)
        traced = pm._retracer.trace(modes, micro_args, micro_kwargs,
                                    allow_frozen_host_random=pm.traced.allow_frozen_host_random)
    if list(traced.input_names) != list(pm.traced.input_names):
        raise PipelineError(f"PipelineModule evaluation: the model traced in eval mode takes the inputs "
                            f"{list(traced.input_names)}, the trained pipeline {list(pm.traced.input_names)}. Remedy: "
                            "evaluate with the inputs the model was traced with")
    spec, replicated = carry_over(spec_from_plan(plan), pm.traced, traced)
    num_stages = len(pipe.stages)
    cut = cut_stages(traced, num_stages, tuple(len(st.blocks) for st in pipe.stages))
    holder, index = stage_holders(pipe.schedule, pipe.pp, pipe.microbatches, num_stages)
    width = plan.mesh.world_size
    p, local = divmod(dist.get_rank(), width)
    programs = {}
    last = num_stages - 1
    for k in (k for k in range(num_stages) if holder[k] == p):
        outputs = (cut.model_outputs or None) if k == last else None
        tg = stage_graph(traced, cut, k, outputs)
        k_spec = stage_spec(spec, traced, cut, k, p * width, outputs)
        module = run.stages[index[k]]
        foreign = sorted(f for f, info in tg.parameters.items()
                         if not info.is_constant and f not in module.traced.parameters)
        if foreign:
            raise PipelineError(f"PipelineModule evaluation: stage {k} of the model traced in eval mode reads "
                                f"{foreign[:4]}, which the plan keeps on another stage (the eval graph uses them "
                                "elsewhere than the training graph). Remedy: evaluate the model on one device "
                                "(model.load_state_dict(pm.full_state_dict())), or a plan without 'pp'")
        frozen = frozenset(f for f, info in tg.parameters.items() if not info.is_buffer)  # forward only: no sync
        program = rewrite(tg, k_spec, local, grad_bucket_bytes=0, frozen=frozen)
        verify(program, tg, k_spec)
        programs[k] = (program, module)
    return EvalPipeline(traced, spec, cut, holder, programs, boundary_dtypes(traced, cut, spec.autocast), replicated)


def run_eval(pm, ev: EvalPipeline, flat: list[torch.Tensor], microbatches: int) -> list[tuple] | None:
    """Forward every microbatch of the global tensor inputs `flat` (traced order) through the stages (module
    docstring, step 4), under torch.no_grad. Collective over the pipeline: call on every rank. Returns each
    microbatch's tuple of the model's outputs (full tensors) on the ranks that ran the last stage, else None."""
    width = pm.plan.mesh.world_size
    p, local = divmod(dist.get_rank(), width)
    cut, names = ev.cut, ev.traced.input_names
    last = cut.num_stages - 1
    outs = []
    with torch.no_grad():
        for j in range(microbatches):
            values = dict(zip(names, (t.tensor_split(microbatches)[j] for t in flat)))
            for k in range(cut.num_stages):
                if k and ev.holder[k] != ev.holder[k - 1]:
                    _transfer(ev, k, p, local, width, values)
                if ev.holder[k] != p:
                    continue
                program, module = ev.programs[k]
                received = [values[n] for n in cut.inputs[k]]
                state = module._state(program)
                with autocast(ev.spec.autocast, state[0].device.type if state else "cpu"):
                    out = program.graph_module(*state, *received)
                sent = (cut.model_outputs or cut.outputs[k]) if k == last else cut.outputs[k]
                values = {**dict(zip(names, (t.tensor_split(microbatches)[j] for t in flat))),
                          **dict(zip(sent, out))}
                if k == last:
                    outs.append(tuple(out))
    return outs if ev.holder[last] == p else None


def _transfer(ev: EvalPipeline, k: int, p: int, local: int, width: int, values: dict) -> None:
    """Send the values stage k receives from the ranks running stage k - 1 to those running stage k (same (dp, tp)
    coordinates), in `cut.outputs[k - 1]` order; the receiver fills `values`."""
    names = ev.cut.outputs[k - 1]
    if p == ev.holder[k - 1]:
        for n in names:
            dist.send(carried_view(values[n].contiguous()), dst=ev.holder[k] * width + local)
    elif p == ev.holder[k]:
        layouts = stage_spec(ev.spec, ev.traced, ev.cut, k, p * width).inputs
        for n, buf in zip(names, _examples(ev.traced, names, layouts, ev.spec, local, ev.dtypes)):
            buf = buf.detach()
            dist.recv(carried_view(buf), src=ev.holder[k - 1] * width + local)
            values[n] = buf


def evaluate(pm, args: tuple, kwargs: dict) -> object:
    """The model's outputs for the global call `pm(*args, **kwargs)` in the PipelineModule's current modes,
    on every rank (module docstring). Collective: call on every rank with the same inputs.

    Raises:
        PipelineError: a tensor whose dim 0 is not a multiple of the traced microbatch size; an output that is
            neither batch-major nor the model's 0-d own loss when the call has several microbatches.
        TraceError / PlanMismatchError: as tracing the model in eval mode does.
    """
    batch = pm.run.microbatch_size
    tensors = [t for t in pytree.tree_leaves((tuple(args), kwargs)) if isinstance(t, torch.Tensor)]
    size = tensors[0].shape[0] if tensors and tensors[0].ndim else 0
    if not size or size % batch:
        shape = tuple(tensors[0].shape) if tensors else ()
        raise PipelineError(f"PipelineModule evaluation: the batch (dim 0 of {shape}) is not a multiple of the "
                            f"microbatch size {batch} the model was traced with; evaluation runs microbatches of that "
                            f"size. Remedy: pad or cut the evaluation batch to a multiple of {batch}")
    m = size // batch
    flat = global_tensor_inputs(pm.traced, args, kwargs, m)  # checks the call against the trace
    modes = {name: module.training for name, module in pm.run.stages[0].named_modules()}
    shapes = tuple((tuple(t.shape), t.dtype) for t in flat)
    key = (tuple(sorted(modes.items())), tuple(s[1] for s in shapes), tuple(s[0][1:] for s in shapes))
    cache = pm.__dict__.setdefault("_evals", {})
    if key not in cache:
        cache.clear()  # one evaluation configuration kept: a new one traces again
        cache[key] = build_eval(pm, modes, args, kwargs, m)
        if cache[key].replicated:
            warnings.warn(f"PipelineModule evaluation: {len(cache[key].replicated)} op(s) of the eval-mode graph the "
                          f"plan does not have run replicated: {', '.join(cache[key].replicated[:5])}", stacklevel=3)
    ev = cache[key]
    outs = run_eval(pm, ev, flat, m)
    names = list(ev.cut.model_outputs or ev.cut.outputs[-1])
    merged = _merge(pm, ev, names, outs, flat, m) if outs is not None else None
    return unflatten_in_order(_broadcast(pm, ev, names, merged, m), ev.traced.exported.call_spec.out_spec)


def _merge(pm, ev: EvalPipeline, names: list[str], outs: list[tuple], flat: list[torch.Tensor], m: int) -> list:
    """The microbatches' outputs as one call's: batch-major outputs concatenated along dim 0; the model's own
    loss (a 0-d first output) weighted by the microbatches' item counts (`own_loss_weighting`, as `step`)."""
    if m == 1:
        return list(outs[0])
    batch = pm.run.microbatch_size
    merged = []
    for i, name in enumerate(names):
        shape = tuple(ev.traced.node(name).outputs[0].shape)
        if shape and shape[0] == batch:
            merged.append(torch.cat([o[i] for o in outs]))
        elif not shape and i == 0 and returns_scalar_loss(ev.traced):
            weighting = pm._own_weighting or own_loss_weighting(pm.traced, pm._doubled_trace())
            pm._own_weighting = weighting
            counts = weighting.counts(flat, m).to(torch.float64)
            weights = torch.ones(m, dtype=torch.float64) if weighting.kind == "sum" else counts / counts.sum()
            # summed in `sum_dtype` and rounded once (float32 for float16 / bfloat16: round 26, before each weighted
            # loss was rounded to the loss's dtype and added there), as `step`'s batch loss
            merged.append(batch_loss([(o[0], w) for o, w in zip(outs, weights.tolist())]))
        else:
            raise PipelineError(f"PipelineModule evaluation: output {i} ({name}, shape {shape}) is neither batch-major "
                                f"(dim 0 = the microbatch size {batch}) nor the model's own 0-d loss, so its "
                                f"{m} microbatch values have no single-device merge. Remedy: evaluate batches of "
                                f"{batch} (one microbatch) and combine them yourself")
    return merged


def _broadcast(pm, ev: EvalPipeline, names: list[str], merged: list | None, m: int) -> list[torch.Tensor]:
    """`merged` (on the ranks that ran the last stage) on every rank: broadcast over the pipeline group of this
    rank's (dp, tp) coordinates, dtypes first (a precision recipe may change them)."""
    from .pipeline_module import _DTYPES, _code

    width = pm.plan.mesh.world_size
    p, local = divmod(dist.get_rank(), width)
    ranks = [q * width + local for q in range(pm.plan.pipeline.pp)]
    if len(ranks) == 1:
        return merged
    src = ev.holder[-1] * width + local
    group = find_group(ranks)
    codes = torch.tensor([_code(t.dtype) for t in merged] if merged is not None else [0] * len(names),
                         dtype=torch.float64)
    broadcast_in_place(codes, src, group=group)
    out = []
    batch = pm.run.microbatch_size
    for i, name in enumerate(names):
        if merged is not None:
            t = merged[i].contiguous()
        else:
            shape = tuple(ev.traced.node(name).outputs[0].shape)
            shape = (batch * m, *shape[1:]) if shape and shape[0] == batch else shape
            t = torch.empty(shape, dtype=_DTYPES[int(codes[i]) - 1])
        broadcast_in_place(t, src, group=group)
        out.append(t)
    return out

