"""`auto_parallelize`: trace, plan on rank 0 (`api.plan`) or apply a saved plan, broadcast it, and build this
rank's `ParallelModule` or `PipelineModule`; with the checks a saved plan and its options get before it is applied
(`_refuse_options_beside_plan`, `_check_pipeline`) and the warnings rank 0 gives about the chosen plan
(`NoParallelismWarning`, `MicrobatchWarning`). Split out of `api.py` in round 25 (the module had grown past 600
lines); `parallelizer.auto_parallelize` is this function.
"""
from __future__ import annotations

import os
import warnings

import torch

from cost_model.topology import Cluster

from .api import plan as _plan
from .config import PlanConfig
from .core.mesh import MeshSpec
from .errors import MicrobatchWarning, NoParallelismWarning, ParallelizerError, PlanMismatchError, rank0_failure
from .fingerprint import check_plan
from .planner import Plan
from .planner.stages import PP_AXIS, split_mesh
from .rewriter.grad_sync import DEFAULT_BUCKET_BYTES
from .tracer import TracedGraph, trace

__all__ = ["auto_parallelize"]

def auto_parallelize(model: torch.nn.Module, example_inputs: tuple, *, mesh: MeshSpec | dict | None = None,
                     cluster: Cluster | str | None = None, memory_budget: int | None = None,
                     optimizer: str = "adamw", plan: Plan | str | os.PathLike | None = None,
                     example_kwargs: dict | None = None, grad_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                     allow_frozen_host_random: bool = False, **plan_options):
    """Trace, plan (or apply a saved plan) and build this rank's `ParallelModule` (or `PipelineModule`).

    Under torchrun (torch.distributed initialised, or RANK/WORLD_SIZE set: then `runtime.init_from_env()` is
    called) the mesh sub-groups are created and the module is built for `dist.get_rank()`; rank 0 plans and
    broadcasts the plan as JSON so every rank uses the same one. Without a launcher it runs on one device
    (it then initialises a one-process gloo group, which the program's size-1 collectives need).
    Every rank must pass the same global `example_inputs` (the module slices its part).
    With a "pp" axis (first: {"pp": 2, "dp": 2}) or a saved pipeline plan, the model is traced on ONE
    microbatch (dim 0 of every tensor input / microbatches; `microbatches=` in plan_options, default pp) and
    this rank's stages are built on torch.distributed.pipelining (`runtime.pipeline_module`).
    Training: `loss = pm.step(*inputs, target=..., loss_fn=...)` (forward, loss, backward; the batch loss on
    every rank, gradients in `.grad`) works alike for both kinds of module (`runtime.step`).

    Args:
        model: a module with real weights identical on every rank (seed it), or on `meta`: then each rank
            initialises only its own shards (`ParallelModule`; buffers must be real).
        example_inputs / example_kwargs: as for `parallelizer.trace`.
        mesh: MeshSpec or {"dp": 2, "tp": 2} or {"pp": 2, "dp": 2}; default: the given plan's (its full mesh for a
            pipeline plan), else 1-D {"dp": world size}.
        cluster: what to price on (`resolve_cluster`); default: DGX H100 devices, one per rank.
        memory_budget: per-device bytes (None: the device's memory). optimizer: "adamw", "adam" or "sgd".
        plan: a `Plan` or a path to a saved one: applied without re-solving, after `check_plan` against this
            model and mesh (the mesh then defaults to the plan's); planning options beside it must be the plan's.
        grad_bucket_bytes: bucket size of the asynchronous gradient sync of replicated parameters (default
            25 MiB as DDP; 0 = one synchronous all-reduce per parameter), see `ParallelModule`.
        allow_frozen_host_random: as `parallelizer.trace`: train a forward that draws from numpy's or Python's
            random generator (SpecAugment with mask_time_prob > 0) with its one traced draw repeated at every
            step (warned) instead of the TraceError that names the draw and its config switch.
        plan_options: other `PlanConfig` fields (axis_roles={"dp": "fsdp"}, time_limit_s=, batch_dims=, ...);
            with a "pp" axis also schedule=, microbatches=, virtual_stages= (`plan`).
    Returns:
        The `ParallelModule`, or for a pipeline plan the `runtime.pipeline_module.PipelineModule` of this rank's
        stages; `.plan` is the `Plan`.
    Raises:
        PlanMismatchError: the given plan was made for another model, shapes or mesh (says what differs).
        Any planning error of rank 0 (InfeasiblePlanError, ValueError...) is raised on rank 0 and, as a
        ParallelizerError quoting it, on every other rank.
        InfeasiblePlanError: nothing fits the memory budget.
        ParallelizerError: a mesh whose size differs from the world size (remedy: torchrun --nproc-per-node).
        PipelineError: a pipeline mesh whose example batch does not split into the microbatches; the errors of
            `plan` for pipeline meshes.
        PrecisionError: a bf16 plan whose traced program raises under torch.autocast (quotes the error).
    Warns (rank 0):
        NoParallelismWarning: the plan leaves a mesh axis unused.
        MicrobatchWarning: a pipeline plan whose microbatches change what the model computes (its forward mixes
            the samples of the batch, e.g. BatchNorm in training, or writes a buffer once per call): it trains as
            gradient accumulation over the microbatches (`tracer.microbatch_check`).
    """
    import torch.distributed as dist

    from .rewriter.spec import all_axis_groups, hierarchical_sub_groups, spec_from_plan
    from .runtime import create_groups, init_from_env
    from .runtime.module import ParallelModule
    from .runtime.microbatches import microbatch_of
    from .runtime.pipeline_module import build_pipeline_module
    from .runtime.model_attrs import remember as remember_model
    from .runtime.optimizer_check import remember_wrapped
    from .runtime.stale_model import watch
    from .runtime.precision import check_recipe_runs
    from .runtime.replicas import check_same_weights

    if not dist.is_initialized() and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        init_from_env()
    distributed = dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if not distributed:  # the emitted program's collectives (size-1 groups) still need a process group
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    given = plan if isinstance(plan, Plan) or plan is None else Plan.load(plan)
    if given is not None:
        _refuse_options_beside_plan(given, cluster, memory_budget, optimizer, plan_options)
    if mesh is None:
        mesh = (given.mesh if given.pipeline is None else given.pipeline.mesh) if given is not None else MeshSpec(
            ("dp",), (world,))
    mesh = MeshSpec.of(mesh)
    if mesh.world_size != world:
        raise ParallelizerError(f"mesh {mesh} has {mesh.world_size} devices but this job has {world} rank(s). "
                                f"Remedy: launch with `torchrun --nproc-per-node {mesh.world_size}` or pass a mesh "
                                f"of {world} devices.")
    microbatches = _microbatches(mesh, given, plan_options)
    global_call = (tuple(example_inputs), dict(example_kwargs or {}))
    if microbatches is not None:  # a pipeline plan is made for, and runs, one microbatch at a time
        example_inputs, example_kwargs = microbatch_of(example_inputs, example_kwargs or {}, microbatches)
    traced = trace(model, example_inputs, example_kwargs, allow_frozen_host_random=allow_frozen_host_random)
    if given is not None:
        _check_pipeline(given, mesh)
        check_plan(given, traced, split_mesh(mesh)[1] if PP_AXIS in mesh.axis_names else mesh)
        check_recipe_runs(traced, example_inputs, example_kwargs or {}, given.config.get("mixed_precision"))
        chosen = given
    else:
        outcome, failure = None, None
        if rank == 0:
            try:
                made = _plan_for(traced, mesh, cluster, memory_budget, optimizer, plan_options)
                check_recipe_runs(traced, example_inputs, example_kwargs or {}, made.config.get("mixed_precision"))
                outcome = ("ok", made.to_json())
            except Exception as exc:  # every rank must hear of it, or they wait in the broadcast until the timeout
                failure, outcome = exc, ("error", f"{type(exc).__name__}: {exc}",
                                         f"{type(exc).__module__}:{type(exc).__qualname__}")
        if distributed:
            box = [outcome]
            dist.broadcast_object_list(box, src=0)
            outcome = box[0]
        if failure is not None:
            raise failure
        if outcome[0] == "error":
            raise rank0_failure(outcome[2], outcome[1], rank)  # rank 0's class, so except clauses agree
        chosen = Plan.from_json(outcome[1])
    if distributed:
        check_same_weights(model)
    if rank == 0:
        _warn_idle_axes(chosen)
        if chosen.pipeline is not None:
            _warn_microbatch_mixing(model, global_call, chosen.pipeline.microbatches, traced)
    if chosen.pipeline is not None:  # its groups (pp, stage sub-meshes, tied copies) are made by the build
        module = build_pipeline_module(traced, chosen, model, rank)
        module.plan = chosen
        remember_wrapped(model, module)
        remember_model(module, model)
        watch(model, module)
        return module
    spec = spec_from_plan(chosen)
    if distributed:
        create_groups(all_axis_groups(mesh) + hierarchical_sub_groups(spec))
    module = ParallelModule(traced, spec, rank, model, grad_bucket_bytes=grad_bucket_bytes)
    module.plan = chosen
    remember_wrapped(model, module)
    remember_model(module, model)
    watch(model, module)
    return module


def _warn_idle_axes(chosen: Plan) -> None:
    """Warn `NoParallelismWarning` (rank 0) with the plan's note when the plan leaves some mesh axis of more than
    one device unused: the ranks along it repeat one another's work, which nothing else would tell the user."""
    idle = chosen.idle_axes()
    if idle:
        notes = [n for n in chosen.notes() if n.startswith("no parallelism") or " is unused: " in n]
        warnings.warn(NoParallelismWarning(f"auto_parallelize: {' '.join(notes)}", tuple(idle)), stacklevel=3)


def _warn_microbatch_mixing(model: torch.nn.Module, global_call: tuple[tuple, dict], microbatches: int,
                            traced: TracedGraph) -> None:
    """Warn `MicrobatchWarning` (rank 0) when cutting the example batch into the pipeline plan's microbatches
    changes what the model computes (`tracer.microbatch_check`: a forward that mixes the samples of its batch,
    or a buffer it writes once per call): the pipeline would train such a model as gradient accumulation over
    the microbatches, not as the model on the whole batch, and nothing else would tell the user (trial r10b:
    batch centering, loss 1.7e-2 off one device on pp=2 x dp=2). `traced` (one microbatch) gives how pm.step
    weighs the model's own loss, so a loss that mixes the samples is found too; a model's own 0-d loss that
    pm.step cannot weigh (a class-weighted cross-entropy) is warned about here, before the first step refuses
    it (StepError, with the remedy). Advisory: an error of the
    check itself (e.g. the model's forward raising on the whole batch) is not raised here, where the other
    ranks would wait for rank 0."""
    from .runtime.loss_weight import model_loss_weighting, returns_scalar_loss
    from .runtime.microbatches import global_tensor_inputs
    from .runtime.step import StepError
    from .tracer.microbatch_check import microbatch_mixing

    try:  # how pm.step weighs the model's own loss per microbatch (None: no own loss of a form it weighs)
        weighting = model_loss_weighting(model, traced)
        counts = weighting.counts(global_tensor_inputs(traced, *global_call, microbatches), microbatches).double()
        weights = counts if weighting.kind == "sum" else counts / counts.sum()
    except StepError as exc:
        weights = None
        if returns_scalar_loss(traced):  # said now, not first at pm.step (as `parallelizer plan` notes it)
            warnings.warn(f"auto_parallelize: pm.step(loss_fn=None) will refuse this pipeline plan's model: {exc}",
                          UserWarning, stacklevel=3)
    except (ValueError, TypeError, RuntimeError, IndexError):
        weights = None
    try:
        found = microbatch_mixing(model, *global_call, microbatches, weights)
    except Exception:  # noqa: BLE001 - advisory (docstring); the pipeline's own run reports the model's errors
        found = None
    if found is not None:
        warnings.warn(MicrobatchWarning(f"auto_parallelize: {found[1]}", found[0]), stacklevel=3)


def _plan_for(traced, mesh, cluster, memory_budget, optimizer, options) -> Plan:
    return _plan(traced, mesh, cluster=cluster, memory_budget_bytes=memory_budget, optimizer=optimizer, **options)


# solver settings: a saved plan is not solved again, so they change nothing
_SOLVER_ONLY = frozenset({"time_limit_s", "mip_rel_gap", "solver"})


def _refuse_options_beside_plan(given: Plan, cluster, memory_budget, optimizer: str, options: dict) -> None:
    """Raise PlanMismatchError for a planning option passed with `plan=` whose value is not the plan's own: a saved
    plan is applied as made, so `precision="bf16"`, `zero1=`, `axis_roles=`, a cluster or a budget beside it was
    ignored, silently (r13d: an fp32 plan with precision="bf16" ran fp32)."""
    import dataclasses

    recorded = PlanConfig.from_record(given.config)
    fields = {f.name for f in dataclasses.fields(PlanConfig)}
    asked = {k: v for k, v in options.items() if k not in _SOLVER_ONLY}
    asked.update({k: v for k, v in (("optimizer", optimizer), ("memory_budget_bytes", memory_budget)) if v is not None})
    if optimizer == "adamw" and recorded.optimizer != "adamw":
        del asked["optimizer"]  # the default argument, not a request
    runs_bf16 = given.config.get("mixed_precision") is not None  # what runs: a defaulted bf16 only prices
    differ = [k for k, v in asked.items() if (k == "precision" and (v == "bf16") != runs_bf16)
              or (k != "precision" and (k not in fields or _replaced(recorded, k, v) != recorded))]
    if given.pipeline is not None and options.get("microbatches") == given.pipeline.microbatches:
        differ.remove("microbatches")
    if cluster is not None and not (isinstance(cluster, str) and cluster == given.cluster.get("spec")):
        differ.append("cluster")
    if differ:
        shown = ", ".join(f"{k}={cluster if k == 'cluster' else asked[k]!r}" for k in differ)
        pipeline = given.pipeline.to_dict() if given.pipeline is not None else {}
        made = ", ".join(f"{k}={given.cluster.get('spec')!r}" if k == "cluster"
                         else f"{k}={getattr(recorded, k)!r}" + (" (priced only: it runs the traced dtypes)"
                                                                 if k == "precision" and not runs_bf16 else "")
                         if k in fields else f"{k}={pipeline[k]!r}" if k in pipeline else f"no {k}" for k in differ)
        raise PlanMismatchError(
            f"auto_parallelize(plan=...) applies the saved plan as it was made, without planning again, so {shown} "
            f"would be ignored (the plan has {made}). "
            "Remedy: drop these options, or plan with them (parallelizer.plan / `parallelizer plan`, or "
            "auto_parallelize without plan=) and pass that plan")


def _replaced(config: PlanConfig, key: str, value) -> PlanConfig | None:
    """`config` with `key` set to `value` as `plan` would set it (None when the value is not valid there)."""
    import dataclasses

    try:
        return dataclasses.replace(config, **{key: value})
    except (TypeError, ValueError):
        return None


def _microbatches(mesh: MeshSpec, given: Plan | None, options: dict) -> int | None:
    """The microbatch count of a pipeline run (None without a "pp" axis): the given plan's, else
    `microbatches=` of the plan options, else pp (`plan`'s default)."""
    if PP_AXIS not in mesh.axis_names:
        return None
    if given is not None and given.pipeline is not None:
        return given.pipeline.microbatches
    return options.get("microbatches") or mesh.shape[mesh.axis_names.index(PP_AXIS)]


def _check_pipeline(given: Plan, mesh: MeshSpec) -> None:
    """Raise PlanMismatchError when a saved plan's pipeline (or its absence) does not fit the requested mesh."""
    if given.pipeline is None and PP_AXIS not in mesh.axis_names:
        return  # `check_plan` compares the meshes
    made_for = given.pipeline.mesh if given.pipeline is not None else given.mesh
    if made_for != mesh:
        raise PlanMismatchError(f"the plan was made for mesh {made_for} but the requested mesh is {mesh}. Remedy: "
                                f"pass mesh={dict(zip(made_for.axis_names, made_for.shape))} (or none), or re-plan "
                                "for this mesh")
