"""Rehearsal of a pipeline plan: run `runtime.pipeline` on local gloo ranks and compare with one device.

Each rank builds the model at the GLOBAL batch (microbatches x the traced microbatch; a seeded builder, so
every rank and the reference hold the same weights), traces it on the first microbatch, cuts the stages the
plan records (`Plan.pipeline.blocks_per_stage`) and builds its `PipelineRun` with the plan's intra-stage
spec. One `step` per optimizer step runs the schedule over all microbatches; the reference model runs the
same microbatches one after the other, accumulating gradients (eager gradient accumulation), each
microbatch's loss weighted as `PipelineModule.step` weighs it (`runtime.loss_weight`: the model's own
cross-entropy that ignores some labels (-100) by n_j / N, its non-ignored targets; the fallback loss by 1 / m),
so the pipeline's batch loss is the single-device loss of the whole batch. The pipeline's loss is also compared
with the whole batch run at once on one device (an independent check of the weights), judged only where that is a
comparison of the plan (`runtime.whole_batch`: not for a forward that writes state, draws random numbers or mixes
the samples of its batch, where the report shows it labelled NOT JUDGED with the reason).
Compared (`runtime.rehearsal.RehearsalReport`), the worst over all steps and ranks: the loss of every step
(the weighted sum of the microbatch losses, on the ranks holding a last stage, the only ones that compute it, against the
reference's; also reported as "output", the only output a pipeline returns), every gradient of every step
(each rank's shard of the reference gradient, tied copies included, after their sum over stages), every
buffer of every stage copy a rank holds after every step (a buffer updated in forward: a counter, an EMA,
BatchNorm's running statistics), and the parameters after `steps` AdamW steps.
The reference updates a forward-mutated buffer once per MICROBATCH, in microbatch order (eager gradient
accumulation over the plan's microbatches, below), which is what a pipeline computes: one device running the
global batch at once updates it once per batch instead (a different EMA; BatchNorm also normalises by the
batch's statistics), so a pipeline plan of such a model trains like gradient accumulation, not like the
full batch.
The loss is the model's own scalar output when it returns one first (presets trace with labels: a causal-LM
loss), else the weighted mean of squares of the first output (`rehearsal._loss`). Tolerances:
`runtime.tolerance` for the least precise dtype of the computation that reaches each compared tensor
(`runtime.reach`).
An fp32 or 16-bit plan without a recipe that some rank finds outside that bound runs again judged also against
a float64 copy of the model over the same microbatches (`_rank_judged`, `runtime.rehearsal.float64_excess`, as
rehearsals on one mesh do): a gradient that is a sum of large terms cancelling to a small one (a bias before a
norm that removes any shift) carries fp32 rounding of the terms' size, which dp or tp ranks summing in another
order reproduce with other digits; a value then matches when it lies from float64's no further than 8x one
device's own rounding (16-bit models only when the forward draws no random numbers, `runtime.rehearsal.wide_judged`).
A case still outside is replayed in float64 (`replay_pipeline`, as `runtime.replay64` does on one mesh), and the
report says whether the replay equals the float64 model (rounding) or not (a wrong program). A float32 model that
casts values to 16 bits inside (`runtime.reach.narrows_inside`), judged at 16 bits where the casts reach, is
replayed in float64 even when it matches, and the replay's ratio joins the verdict (round 19: a pipeline 0.1% off
one device matched at ratio 0.87 before).
A plan with a mixed-precision recipe (`spec.autocast`, `runtime.precision`: precision="bf16" for an fp32 model)
runs its stages under the recipe (`runtime.pipeline.StageModule`), and the reference is the single-device model
under the same autocast over the same microbatches (each microbatch's forward under torch.autocast(bfloat16),
the loss and backward outside, as the non-pipeline rehearsal runs it, `runtime.rehearsal`), judged as there: at
bfloat16's tolerance, or no further from the model run without the recipe (a third copy, accumulated over the
same microbatches) than twice the single-device recipe (`runtime.rehearsal.recipe_excess`), with AdamW's eps at
least `RECIPE_ADAM_EPS`; the report names the reference.
A plan with pipeline-boundary compression (`Plan.pipeline.compression`) runs compressed, so the report
shows the codec's measured deviation from one device (and does not match within the tolerance).
"""
from __future__ import annotations

from collections.abc import Callable

import warnings

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from ..planner.boundary import build_options
from ..rewriter.spec import ShardingSpec
from ..rewriter.state import shard_tensor
from ..tracer.graph import TracedGraph
from ..tracer.trace import trace
from .grad_reach import presence_mismatch
from .launch import spawn
from .module_copy import copy_module, reference_copy
from .loss_weight import batch_target, model_loss_weighting, returns_scalar_loss
from .microbatches import global_tensor_inputs, microbatch_of
from .microbatch_loss import counts_no_item, weighted_loss
from .pipeline import PipelineRun, build, plan_cut
from .precision import RECIPES, autocast, check_recipe_runs
from .whole_batch import labelled, left_out, nonfinite_accumulation, own_difference, whole_batch_loss
from .widen import as_float64, widening
from .rehearsal import (RECIPE_ADAM_EPS, random_ops, RehearsalReport, float64_excess, _any_rank_outside, _float64_run,
                        _grad_or_zeros, _loss, _max_diff, _report, tensor_leaves, unjudged_codec, unused_float64,
                        wide_judged, widened)
from .reach import narrows_inside, reach_dtypes
from .kinks import locate_pipeline
from .replay64 import REPLAY_ERRORS, failure, replay_kinks
from .tolerance import compute_dtype, loosest
from .zero1 import plan_optimizer, runs_zero1


def pipeline_loss(output, target=None) -> torch.Tensor:
    """The rehearsal's loss of a last-stage output tuple: the model's scalar loss when its first tensor is one,
    else the weighted mean of squares of the first tensor (`rehearsal._loss`; `target` unused; torch's schedules
    pass one)."""
    return _loss(output)


def rehearse_pipeline(model_fn: Callable, model_kwargs: dict, spec: ShardingSpec, pipeline, *, steps: int = 3,
                      lr: float = 1e-3, eps: float = 1e-3, timeout_s: float = 300.0) -> RehearsalReport:
    """Run a pipeline plan on pp x `spec.mesh.world_size` local gloo ranks and compare with one device.

    Args:
        model_fn: module-level builder `model_fn(**model_kwargs) -> (model, args[, kwargs])` (seeded) whose
            inputs are the GLOBAL batch (microbatches x the batch the plan was traced with; dim 0 of every
            tensor input is the batch).
        spec: the intra-stage spec (`spec_from_plan(plan)`); pipeline: `plan.pipeline` (`PipelineSection`).
        steps, lr, eps: as `runtime.rehearsal.rehearse` (AdamW; eps 1e-3 on purpose, see there).
    Raises:
        DistributedError: a rank failed or timed out (names the rank, with its traceback); a batch that does
            not split into the microbatches fails there with the remedy.
        PrecisionError: a recipe under which the traced program raises (`precision.check_recipe_runs`).
    Warns:
        MicrobatchWarning: the microbatches change what the model computes (`tracer.microbatch_check`).
    """
    warned = _warn_microbatch_mixing(model_fn, model_kwargs, pipeline.microbatches)
    if spec.autocast is not None:  # a program that raises under the recipe: typed here, not on every rank
        model, args, *rest = model_fn(**model_kwargs)
        micro_args, micro_kwargs = microbatch_of(tuple(args), rest[0] if rest else {}, pipeline.microbatches)
        check_recipe_runs(trace(model, micro_args, micro_kwargs, allow_frozen_host_random=True), micro_args,
                          micro_kwargs, spec.autocast)
    world = pipeline.pp * spec.mesh.world_size
    lossy, note = _lossy_codecs(spec, pipeline, steps)
    per_rank = spawn(_rank_judged, world, model_fn, model_kwargs, spec, pipeline.to_dict(), steps, lr, eps, bool(lossy),
                     timeout_s=timeout_s)
    found = next((r["mixing"] for r in per_rank if r.get("mixing")), None)  # with the loss weights (ranks')
    if found is not None and not warned:
        _warn_microbatch_mixing(model_fn, model_kwargs, pipeline.microbatches, found)
    return _report(world, per_rank, lossy, spec.autocast, note)


def _rank_judged(rank: int, world_size: int, model_fn, model_kwargs: dict, spec: ShardingSpec, pipe: dict,
                 steps: int, lr: float, eps: float, lossy: bool) -> dict:
    """`_rank_main`, run again with a float64 copy of the model as a second judge (`wide`) when some rank
    finds a value outside its dtype's bound (fp32 and 16-bit models, `runtime.rehearsal.wide_judged`), as
    `runtime.rehearsal` does for one mesh (all ranks decide together: `rehearsal._any_rank_outside`). Not for a
    mixed-precision recipe (its own judge) or a lossy codec (it deviates by design)."""
    result = _rank_main(rank, world_size, model_fn, model_kwargs, spec, pipe, steps, lr, eps)
    if spec.autocast is not None or lossy:
        return result
    if _any_rank_outside(result):
        result = _rank_main(rank, world_size, model_fn, model_kwargs, spec, pipe, steps, lr, eps, wide=True)
        if _any_rank_outside(result) and not result["random"]:  # rounding beyond 8x, or a wrong program
            result["float64_replay"] = replay_pipeline(model_fn, model_kwargs, spec, pipe)
            result["kinks"] = replay_kinks(result["float64_replay"],  # rounding at a kink? (`runtime.kinks`)
                                           lambda: locate_pipeline(model_fn, model_kwargs, spec, pipe))
    elif result["narrows"] and not result["random"]:  # judged at 16 bits where its casts reach: blind to 0.1%
        result["float64_replay"], result["replay_judges"] = replay_pipeline(model_fn, model_kwargs, spec, pipe), True
    return result


def replay_pipeline(model_fn, model_kwargs: dict, spec: ShardingSpec, pipe: dict) -> tuple[float, str, float] | str:
    """`runtime.replay64.replay` for a pipeline plan: this rank's (worst |diff|, its name, worst ratio to float64's
    bound) over the batch loss (on a last stage) and this rank's gradient shards of ONE pipeline step of the plan
    run on the float64 copy of the model (`runtime.widen`: parameters, inputs and every dtype its forward names
    widened; traced and cut anew by the plan's stages) against that copy's eager gradient accumulation over the
    same microbatches; or why it could not run (a str). A right program lands ~1e-13 from it whatever its
    summation order; a wrong term stays as far off as in float32 (where a float32 model casting to 16 bits inside
    is judged at the 16-bit bound, blind to an error of 0.1%). Collective: every rank of the plan calls it."""
    torch.manual_seed(0)
    model, inputs, *rest = model_fn(**model_kwargs)
    model = as_float64(model)
    reference = reference_copy(model)  # computes as on one device, under the ranks' group too
    inputs, kwargs = widened((tuple(inputs), rest[0] if rest else {}))
    try:
        with widening():  # the graph's own factories and casts traced (and run) in float64
            run, traced, flat, _ = pipeline_run(model, inputs, kwargs, spec, pipe)
            target, count, weights = _weighting(traced, flat, pipe["microbatches"], model)
            loss = run.step(*flat, target=target, item_count=count)
    except REPLAY_ERRORS as error:  # the verdict stands
        return failure(error)
    try:  # the eager float64 copy may lack a kernel the traced program does not call (`replay64.EAGER_ONLY_NOTE`)
        with widening():
            ref_loss = _accumulated_reference(reference, inputs, kwargs, weights)
    except REPLAY_ERRORS as error:  # every rank runs the same eager model on the same inputs: all return here
        return failure(error)
    worst = _max_diff([("loss", loss, ref_loss)], torch.float64) if run.last else (0.0, "", 0.0)
    with widening():  # NaN on both sides is no match where one device's whole batch is finite (`_rank_main`)
        nan = nonfinite_accumulation(reference, traced, inputs, kwargs) or worst
    return max(worst, nan, stage_diffs(run, reference, spec, torch.float64, grads=True), key=lambda r: r[2])


def _warn_microbatch_mixing(model_fn: Callable, model_kwargs: dict, microbatches: int,
                            found: tuple[str, str] | None = None) -> bool:
    """Warn `MicrobatchWarning` when the model computes otherwise on its microbatches than on the whole batch
    (`tracer.microbatch_check`, as `auto_parallelize` does): this rehearsal's reference is gradient accumulation
    over the same microbatches, so such a model reports a match although the plan trains another function than
    the model on the whole batch (BatchNorm in training: running means 1.4e4x the bound off, trial r10b).
    `found`: the check's (where, message) already made (by the ranks, with the pipeline's loss weights, which
    find a loss that mixes the samples in the model's own code: an in-batch contrastive loss); None: checked here
    on its modules. Returns whether it warned."""
    from ..errors import MicrobatchWarning
    from ..tracer.microbatch_check import microbatch_mixing

    if found is None:
        torch.manual_seed(0)
        model, args, *rest = model_fn(**model_kwargs)
        found = microbatch_mixing(model, tuple(args), rest[0] if rest else {}, microbatches)
    if found is not None:
        warnings.warn(MicrobatchWarning(f"rehearse_pipeline: {found[1]} (this rehearsal compares with gradient "
                                        "accumulation over the same microbatches)", found[0]), stacklevel=3)
    return found is not None


def _lossy_codecs(spec: ShardingSpec, pipeline, steps: int) -> tuple[str, str]:
    """(the lossy codecs a run of `steps` steps uses, e.g. "powersgd:4:0, boundary int8" ("" for none); the note
    `rehearsal.unjudged_codec` gives a gradient codec that stays exact over them): gradient compression
    (`spec.compression`; PowerSGD within its warm-up is exact) and pipeline-boundary compression
    (`pipeline.compression`) deviate by design."""
    gradient, note = unjudged_codec(spec, steps)
    codecs = [gradient] if gradient else []
    boundary = getattr(pipeline, "compression", None)
    if boundary is not None:
        kinds = sorted({c.codec for c in boundary.boundaries if c.codec != "none"})
        codecs += [f"boundary {'/'.join(kinds)}"] if kinds else []
    return ", ".join(codecs), note


def stage_diffs(run, reference: torch.nn.Module, spec: ShardingSpec, compute, *,
                grads: bool = False, buffers: bool = False, exact: torch.nn.Module | None = None, judge=None
                ) -> tuple[float, str, float]:
    """(largest |diff|, its FQN, largest diff / tolerance) between this rank's stage parameters (or their
    gradients, None counting as zeros where both sides have None; a gradient None on one side only is a mismatch,
    `grad_reach.presence_mismatch`; or with `buffers` its stage buffers) and its shard of the reference model's,
    over every stage (and stage copy) it holds, judged at `compute(fqn)` (`runtime.reach`; or one dtype for all).
    Buffers compared: those of the reference's `named_buffers()` (lifted constants are not state). `exact`: the
    model run without the plan's mixed-precision recipe, or a float64 copy of the model, judged by `judge` (`_max_diff`: by default
    `runtime.rehearsal.recipe_excess`; `float64_excess` for the float64 copy)."""
    models = [reference] + ([exact] if exact is not None else [])
    if buffers:
        refs = [dict(m.named_buffers()) for m in models]
        pairs = ((s, fqn, b.detach(), *(r[fqn] for r in refs)) for s in run.stages for fqn, b in s.named_buffers()
                 if fqn in refs[0])
    else:
        refs = [dict(m.named_parameters()) for m in models]
        missing = grads and presence_mismatch((fqn, p.grad, *(r[fqn].grad for r in refs))
                                              for s in run.stages for fqn, p in s.named_parameters())
        if missing:  # a zero gradient where one device has None (or the reverse) is no match (`grad_reach`)
            return missing
        pick = (lambda p: _grad_or_zeros(p).detach()) if grads else (lambda p: p.detach())
        pairs = ((s, fqn, pick(p), *(pick(r[fqn]) for r in refs)) for s in run.stages for fqn, p in s.named_parameters())
    return _max_diff(((fqn, mine, *(shard_tensor(full, spec.params[fqn], spec.mesh, s.coords) for full in fulls))
                      for s, fqn, mine, *fulls in pairs), compute, judge)


def _worse(a: tuple[float, str, float], b: tuple[float, str, float], step: int | None = None
           ) -> tuple[float, str, float]:
    """Combine two `_max_diff` results: the larger |diff| with its name (tagged with `step`) and the larger
    ratio to the bound (the verdict), which may come from the other."""
    diff, name = max((a[0], a[1]), (b[0], b[1] if step is None or not b[1] else f"{b[1]} (step {step})"))
    return diff, name, max(a[2], b[2])


def _accumulated_reference(reference: torch.nn.Module, inputs: tuple, kwargs: dict, weights: torch.Tensor,
                           recipe: str | None = None) -> torch.Tensor:
    """Eager gradient accumulation over the same microbatches (`len(weights)` of them): backward of microbatch
    j's loss x weights[j], each forward under the mixed-precision `recipe` (`runtime.precision.autocast`; the
    loss and backward outside it, as `pm.step`); returns the weighted sum of the microbatch losses (the
    pipeline's batch loss)."""
    total = torch.zeros((), dtype=torch.float64)
    m = len(weights)
    for j, w in enumerate(weights.tolist()):
        args, kw = pytree.tree_map(lambda t: t.tensor_split(m)[j] if isinstance(t, torch.Tensor) else t,
                                   (tuple(inputs), kwargs))
        with autocast(recipe):
            out = reference(*args, **kw)
        loss = _loss(out)
        if not counts_no_item(loss, w):  # as `MicrobatchLoss`: such a microbatch adds zero gradients
            (loss * w).backward()
        total = total + weighted_loss(loss.detach().double(), w)
    return total


def _weighting(traced: TracedGraph, flat: list[torch.Tensor], m: int, model: torch.nn.Module):
    """(target, item_count, weights) of `pm.step`'s weighting for the rehearsal: the model's own 0-d loss is
    weighted as `PipelineModule.step` weighs it (`runtime.loss_weight`: n_j / N for a cross-entropy that ignores
    some labels, 1 for a sum, 1 / m for a sum divided by the microbatch size, with the same second trace of
    `model` on twice the microbatch when the loss needs it); the fallback loss (weighted mean of squares of the first output) weighs every microbatch
    1 / m. Raises StepError as `pm.step` does for a loss whose per-microbatch weight the graph does not show."""
    if not returns_scalar_loss(traced):
        return torch.zeros(flat[0].shape[0]), None, torch.full((m,), 1.0 / m, dtype=torch.float64)
    weighting = model_loss_weighting(model, traced)
    target, count = batch_target(weighting, flat, m)
    counts = weighting.counts(flat, m).double()
    weights = torch.ones(m, dtype=torch.float64) if weighting.kind == "sum" else counts / counts.sum()
    return target, count, weights


def _float64_reference(model: torch.nn.Module, inputs: tuple, kwargs: dict, microbatches: int,
                       compute: torch.dtype | None) -> tuple[torch.nn.Module, tuple[tuple, dict]] | str:
    """(a float64 copy of `model` (`runtime.widen.as_float64`), float64 copies of its floating `inputs` /
    `kwargs`) when that copy computes what the model in its own dtypes (computing in `compute`) does
    (`runtime.rehearsal.same_computation` on the first microbatch's outputs, run on copies so that no buffer of
    `model` moves), else why not (`runtime.rehearsal.unused_float64`): it draws other random numbers, takes
    another branch or cannot run in float64 (`runtime.rehearsal._float64_run`)."""
    first = microbatch_of(tuple(inputs), kwargs, microbatches)
    with torch.no_grad():
        own = copy_module(model)(*first[0], **first[1])
        fp64 = _float64_run(copy_module(model), *first)
    return unused_float64(fp64, own, compute) or (as_float64(copy_module(model)), widened((tuple(inputs), kwargs)))


def pipeline_run(model: torch.nn.Module, inputs: tuple, kwargs: dict, spec: ShardingSpec,
                 pipe: dict) -> tuple[PipelineRun, TracedGraph, list[torch.Tensor], int]:
    """This rank's `PipelineRun` of a pipeline plan, built as `rehearse_pipeline` runs it: the model traced on
    ONE microbatch (the first `batch / microbatches` samples of the global `inputs` / `kwargs`), cut into the
    plan's stages. Returns (run, traced microbatch graph, the global input tensors in the traced order, global
    batch). Must be called on every rank (it creates groups).

    Raises:
        PipelineError: the global batch does not split into `pipe["microbatches"]` (remedy in the text).
    """
    m = pipe["microbatches"]
    # a frozen numpy / Python draw is named next to a DIFFER (`rehearsal.random_ops`), not refused
    traced = trace(model, *microbatch_of(inputs, kwargs, m), allow_frozen_host_random=True)
    run = build(traced, spec, plan_cut(traced, pipe["stages"]), model, pp=pipe["pp"],
                schedule=pipe["schedule"], microbatches=m, loss_fn=pipeline_loss,
                **build_options(pipe.get("compression")))  # lossy: the report then shows its deviation
    flat = global_tensor_inputs(traced, inputs, kwargs, m)
    return run, traced, flat, flat[0].shape[0]


def _rank_main(rank: int, world_size: int, model_fn, model_kwargs: dict, spec: ShardingSpec, pipe: dict,
               steps: int, lr: float, eps: float, wide: bool = False) -> dict:
    """This rank's comparison (module docstring); `wide`: also judge by a float64 copy of the model
    (`_float64_reference`, `runtime.rehearsal.float64_excess`)."""
    recipe = spec.autocast
    if recipe is not None:
        eps = max(eps, RECIPE_ADAM_EPS)  # `runtime.rehearsal.rehearse`: rounding noise in tiny gradients
    torch.manual_seed(0)
    model, inputs, *rest = model_fn(**model_kwargs)
    kwargs = rest[0] if rest else {}
    m = pipe["microbatches"]
    reference = reference_copy(model)  # computes as on one device, under the ranks' group too
    exact = reference_copy(model) if recipe is not None else None  # without the recipe (`recipe_excess`)
    exact_inputs, judge, unjudged = (inputs, kwargs), None, ""
    run, traced, flat, batch = pipeline_run(model, inputs, kwargs, spec, pipe)
    compute = loosest(compute_dtype(traced), RECIPES.get(recipe))  # the whole program's: `wide_judged` only
    reach = reach_dtypes(traced).with_recipe(RECIPES.get(recipe))  # the judge's dtype per tensor
    if wide and recipe is None and wide_judged(compute, traced):  # fp32, or 16-bit without random draws
        found = _float64_reference(reference, inputs, kwargs, m, compute)  # `reference` is untouched so far
        if isinstance(found, str):
            unjudged = found
        else:
            exact, exact_inputs, judge = *found, float64_excess
    target, count, weights = _weighting(traced, flat, m, model)
    # the whole batch at once: a comparison of the plan only where one device computes the same function both ways
    why, mixing = left_out(reference, traced, inputs, kwargs, weights) if run.last else ("", None)
    opt = plan_optimizer((p for s in run.stages for p in s.parameters()), spec, run.stages[0], lr, eps)  # ZeRO-1 too
    ref_opts = [torch.optim.AdamW(r.parameters(), lr=lr, eps=eps) for r in (reference, exact) if r is not None]
    loss = grad = bufs = whole = (0.0, "", 0.0)
    for step in range(steps):  # every step: a wrong update shows in the step after it, or in buffers only
        opt.zero_grad()
        for o in ref_opts:
            o.zero_grad()
        full = whole_batch_loss(reference, traced, inputs, kwargs, recipe)
        # its second judge: the same whole batch of the float64 copy / the model without the recipe (`whole_batch`)
        full_exact = () if full is None or exact is None else (whole_batch_loss(exact, traced, *exact_inputs),)
        batch_loss = run.step(*flat, target=target, item_count=count)
        ref_loss = _accumulated_reference(reference, inputs, kwargs, weights, recipe)
        exact_loss = () if exact is None else (_accumulated_reference(exact, *exact_inputs, weights),)
        if not step and (nan := nonfinite_accumulation(reference, traced, inputs, kwargs, recipe)) is not None:
            grad = _worse(grad, nan, step)  # a NaN on both sides is no match where one device is finite
        if run.last:
            # every step's loss: the one after steps (`ReachDtypes.final_loss` covers the first's too)
            loss = _worse(loss, _max_diff([(f"step {step}", batch_loss, ref_loss, *exact_loss)], reach.final_loss,
                                          judge))
            if full is not None and not step and not why:  # one device's own two computations must agree
                why = own_difference(ref_loss, full, m, reach.final_loss)
            if full is not None:  # the microbatch weights themselves, against the whole batch at once
                whole = _worse(whole, _max_diff([(f"step {step} (whole batch)", batch_loss, full, *full_exact)],
                                                reach.final_loss, judge))
        # the first step's gradients read the initial weights; later ones the stepped weights (`after_steps`)
        grad = _worse(grad, stage_diffs(run, reference, spec, reach.param if step else reach.grad, grads=True,
                                        exact=exact, judge=judge), step)
        bufs = _worse(bufs, stage_diffs(run, reference, spec, reach.whole, buffers=True, exact=exact, judge=judge),
                      step)
        opt.step()
        for o in ref_opts:
            o.step()
    params = stage_diffs(run, reference, spec, reach.param, grads=False, exact=exact, judge=judge)
    collectives: dict = {}
    for s in run.stages:
        for kind, n in s.program.collectives.items():
            collectives[kind] = collectives.get(kind, 0) + n
    dist.barrier()
    return {"output": loss, "loss": loss, "grad": grad, "params": params, "buffers": bufs, "collectives": collectives,
            # judged only where it compares the plan; else shown with why (`whole_batch.left_out`)
            "whole_batch": (whole[0], whole[1], 0.0) if why else whole, "whole_batch_note": labelled(whole, why),
            "mixing": mixing, "microbatches": m,
            "float64_judge": judge is not None, "float64_unused": unjudged, "narrows": narrows_inside(traced),
            "zero1": spec.zero1 if runs_zero1(spec) else None,
            "random": random_ops(traced), "code": run.stages[0].program.graph_module.code if rank == 0 else ""}
