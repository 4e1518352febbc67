"""The one-call API: `auto_parallelize`, `plan` (the planner plus provenance) and `search_mesh`.

`plan` is `parallelizer.planner.plan` that also records, in the `Plan`, the traced graph's fingerprint
(`parallelizer.fingerprint`), the cluster it was priced on, the repeated blocks (for per-block views),
the user's own checkpoint regions as forced "full" recomputation (`TracedGraph.user_recompute`) and,
when given, the model recipe; so a saved plan can be checked against a model (`PlanMismatchError`), shown
by block, and rehearsed by the CLI.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import torch

from cost_model.topology import Cluster

from .core.mesh import MeshSpec
from .errors import InfeasiblePlanError, ParallelizerError, PipelineError
from .fingerprint import check_plan, graph_fingerprint
from .planner import Plan
from .planner import plan as _solve
from .planner.api import resolve_cluster
from .planner.stages import PP_AXIS, pipeline_section, split_mesh, stage_counts
from .rewriter.grad_sync import DEFAULT_BUCKET_BYTES
from .tracer import TracedGraph, trace


def describe_cluster(cluster: Cluster, spec: str | None = None) -> dict:
    """JSON description of a cluster (stored in `Plan.cluster`); `spec` is the preset string or profile path."""
    link = lambda lk: {"name": lk.name, "latency_s": lk.latency_s, "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s}  # noqa: E731
    return {"spec": spec, "device": cluster.device.name, "num_nodes": cluster.num_nodes,
            "devices_per_node": cluster.devices_per_node, "hbm_bytes": int(cluster.device.hbm_bytes),
            "intra_node_link": link(cluster.intra_node_link), "inter_node_link": link(cluster.inter_node_link)}


def plan(traced: TracedGraph, mesh: MeshSpec | dict, *, cluster: Cluster | str | None = None,
         recipe: dict | None = None, batch: dict | None = None, **options) -> Plan:
    """`parallelizer.planner.plan` plus provenance (module docstring).

    Args:
        traced: from `parallelizer.trace`.
        mesh: a `MeshSpec` or {"dp": 2, "tp": 4} (last axis innermost).
        cluster: a `Cluster`, a preset string "h100:1x8", a calibration profile path, or None
            (`planner.api.resolve_cluster`: DGX H100 nodes holding the mesh).
        recipe: how to rebuild the model (`parallelizer.presets`), kept in `plan.model["recipe"]`.
        batch: batch facts kept in `plan.model["batch"]` (e.g. {"global_batch": 512, "seq_len": 2048}).
        options: `PlanConfig` fields (memory_budget_bytes=, optimizer=, time_limit_s=, ...) or config=; with a
            "pp" axis (first, e.g. {"pp": 2, "dp": 2}) also schedule= ("gpipe", "1f1b" (default),
            "interleaved_1f1b"), microbatches= (default pp) and virtual_stages= (stages per pp rank; default 1,
            2 for interleaved). Pipeline: trace ONE microbatch (global batch / microbatches); the plan's `mesh`
            is then the intra-stage mesh and `plan.pipeline` holds pp, the schedule and the stages.
    Raises:
        PipelineError: "pp" not first, pp x stages per rank not dividing the blocks, a bad schedule.
        InfeasiblePlanError: no plan fits the memory budget (names the minimum). ValueError: bad mesh/config.
    """
    mesh = MeshSpec.of(mesh)
    if PP_AXIS in mesh.axis_names:
        return _plan_pipeline(traced, mesh, cluster=cluster, recipe=recipe, batch=batch, **options)
    for key in ("schedule", "microbatches", "virtual_stages"):
        if key in options:
            raise PipelineError(f"{key}= is for pipeline plans: put a 'pp' axis first in the mesh (e.g. "
                                f"{{'pp': 2, **{dict(zip(mesh.axis_names, mesh.shape))}}}), or drop {key}=")
    topology = options.get("topology")
    resolved, spec = (topology.cluster, None) if topology is not None else resolve_cluster(cluster, mesh.world_size)
    p = _solve(traced, mesh, cluster=resolved, **options)
    model = dict(p.model)
    model["blocks"] = [{"name": b.name, "module_type": b.module_type, "members": list(b.members),
                        "nodes": [list(n) for n in b.nodes]} for b in traced.blocks]
    if recipe is not None:
        model["recipe"] = recipe
    if batch is not None:
        model["batch"] = batch
    # the user's own torch.utils.checkpoint regions are forced "full" (respected, never silently dropped)
    return dataclasses.replace(p, model=model, fingerprint=graph_fingerprint(traced),
                               cluster=describe_cluster(resolved, spec),
                               recompute={**p.recompute, **traced.user_recompute})


def _plan_pipeline(traced: TracedGraph, mesh: MeshSpec, *, cluster, recipe, batch, schedule: str = "1f1b",
                   microbatches: int | None = None, virtual_stages: int | None = None, **options) -> Plan:
    """`plan` on a mesh with a "pp" axis (first): the intra-stage ILP on the mesh without pp (priced on the
    nodes one stage group occupies), stages cut evenly at repeated-block boundaries, recorded in
    `Plan.pipeline` (`planner.stages`). `traced` is ONE microbatch. Raises PipelineError (see `stage_counts`)."""
    from .runtime.pipeline import cut_stages

    pp, sub = split_mesh(mesh)
    if not traced.blocks:
        raise PipelineError("pipeline plan: the traced graph has no repeated blocks; stages are cut at block "
                            "boundaries (e.g. transformer layers). Remedy: plan without a 'pp' axis")
    group = traced.blocks[0]
    v, per_stage = stage_counts(group.count, group.name, pp, schedule, microbatches if microbatches is not None
                                else pp, virtual_stages)
    full, spec = resolve_cluster(cluster, mesh.world_size)
    per_node = min(full.devices_per_node, sub.world_size)
    stage_cluster = dataclasses.replace(full, num_nodes=sub.world_size // per_node, devices_per_node=per_node)
    p = plan(traced, sub, cluster=stage_cluster, recipe=recipe, batch=batch, **options)
    cut = cut_stages(traced, pp * v, per_stage)
    section = pipeline_section(mesh, sub.world_size, tuple(group.members), cut.stage_of, pp, schedule,
                               microbatches if microbatches is not None else pp, v, per_stage)
    return dataclasses.replace(p, cluster=describe_cluster(full, spec), pipeline=section)


def mesh_candidates(world_size: int, devices_per_node: int) -> list[MeshSpec]:
    """The 1-D mesh (dp=N) and the 2-D meshes (dp=N/t, tp=t) with t a divisor of N, 2 <= t <= devices per
    node (tensor parallelism inside a node, where the fast links are), and t < N: (dp=1, tp=N) is the 1-D
    problem again (a size-1 axis shards nothing, and the planner picks data or tensor sharding per node on
    any axis, whatever its name), so it would only be solved and listed twice."""
    out = [MeshSpec(("dp",), (world_size,))]
    for t in range(2, min(world_size - 1, devices_per_node) + 1):
        if world_size % t == 0:
            out.append(MeshSpec(("dp", "tp"), (world_size // t, t)))
    return out


def search_mesh(traced: TracedGraph, world_size: int, *, cluster: Cluster | str | None = None,
                progress: Callable[[MeshSpec], None] | None = None, **plan_kwargs) -> tuple[Plan, list[tuple]]:
    """Plan every `mesh_candidates` mesh and keep the lowest estimated step time (ties: fewer axes, then order).

    The candidates leave out (dp=1, tp=N): it is the same problem as the 1-D mesh (dp=N) (`mesh_candidates`).

    Returns:
        (best plan, [(mesh, plan or None, reason)]) for every candidate, in candidate order.
    Raises:
        InfeasiblePlanError: no candidate fits (the message lists each mesh's reason).
    """
    resolved, _ = resolve_cluster(cluster, world_size)
    tried = []
    for mesh in mesh_candidates(world_size, resolved.devices_per_node):
        if progress:
            progress(mesh)
        try:
            tried.append((mesh, plan(traced, mesh, cluster=cluster, **plan_kwargs), ""))
        except InfeasiblePlanError as exc:
            tried.append((mesh, None, str(exc).splitlines()[0]))
    ok = [(p.cost.total_s, i, p) for i, (_, p, _) in enumerate(tried) if p is not None]
    if not ok:
        raise InfeasiblePlanError("no mesh fits:\n" + "\n".join(f"  {m}: {r}" for m, _, r in tried)
                                  + "\nRemedy: raise the memory budget, add devices, or lower the batch.")
    return min(ok)[2], tried


# ------------------------------------------------------------------------------------ auto_parallelize
def auto_parallelize(model: torch.nn.Module, example_inputs: tuple, *, mesh: MeshSpec | dict | None = None,
                     cluster: Cluster | str | None = None, memory_budget: int | None = None,
                     optimizer: str = "adamw", plan: Plan | str | os.PathLike | None = None,
                     example_kwargs: dict | None = None, grad_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                     **plan_options):
    """Trace, plan (or apply a saved plan) and build this rank's `ParallelModule`.

    Under torchrun (torch.distributed initialised, or RANK/WORLD_SIZE set: then `runtime.init_from_env()` is
    called) the mesh sub-groups are created and the module is built for `dist.get_rank()`; rank 0 plans and
    broadcasts the plan as JSON so every rank uses the same one. Without a launcher it runs on one device
    (it then initialises a one-process gloo group, which the program's size-1 collectives need).
    Every rank must pass the same global `example_inputs` (the module slices its part).

    Args:
        model: a module with real weights identical on every rank (seed it), or on `meta`: then each rank
            initialises only its own shards (`ParallelModule`; buffers must be real).
        example_inputs / example_kwargs: as for `parallelizer.trace`.
        mesh: MeshSpec or {"dp": 2, "tp": 2}; default: 1-D {"dp": world size}.
        cluster: what to price on (`resolve_cluster`); default: DGX H100 devices, one per rank.
        memory_budget: per-device bytes (None: the device's memory). optimizer: "adamw", "adam" or "sgd".
        plan: a `Plan` or a path to a saved one: applied without re-solving, after `check_plan` against this
            model and mesh (the mesh then defaults to the plan's).
        grad_bucket_bytes: bucket size of the asynchronous gradient sync of replicated parameters (default
            25 MiB as DDP; 0 = one synchronous all-reduce per parameter), see `ParallelModule`.
        plan_options: other `PlanConfig` fields (axis_roles={"dp": "fsdp"}, time_limit_s=, batch_dims=, ...).
    Returns:
        The `ParallelModule`; `.plan` is the `Plan`.
    Raises:
        PlanMismatchError: the given plan was made for another model, shapes or mesh (says what differs).
        Any planning error of rank 0 (InfeasiblePlanError, ValueError...) is raised on rank 0 and, as a
        ParallelizerError quoting it, on every other rank.
        InfeasiblePlanError: nothing fits the memory budget.
        ParallelizerError: a mesh whose size differs from the world size (remedy: torchrun --nproc-per-node).
        PipelineError: a pipeline plan (a 'pp' axis): not applied by ParallelModule yet.
    """
    import torch.distributed as dist

    from .rewriter.spec import all_axis_groups, spec_from_plan
    from .runtime import create_groups, init_from_env
    from .runtime.module import ParallelModule
    from .runtime.replicas import check_same_weights

    if not dist.is_initialized() and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        init_from_env()
    distributed = dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if not distributed:  # the emitted program's collectives (size-1 groups) still need a process group
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    given = plan if isinstance(plan, Plan) or plan is None else Plan.load(plan)
    if mesh is None:
        mesh = given.mesh if given is not None else MeshSpec(("dp",), (world,))
    mesh = MeshSpec.of(mesh)
    if mesh.world_size != world:
        raise ParallelizerError(f"mesh {mesh} has {mesh.world_size} devices but this job has {world} rank(s). "
                                f"Remedy: launch with `torchrun --nproc-per-node {mesh.world_size}` or pass a mesh "
                                f"of {world} devices.")
    traced = trace(model, example_inputs, example_kwargs)
    if given is not None:
        check_plan(given, traced, mesh)
        chosen = given
    else:
        outcome, failure = None, None
        if rank == 0:
            try:
                outcome = ("ok", _plan_for(traced, mesh, cluster, memory_budget, optimizer, plan_options).to_json())
            except Exception as exc:  # every rank must hear of it, or they wait in the broadcast until the timeout
                failure, outcome = exc, ("error", f"{type(exc).__name__}: {exc}")
        if distributed:
            box = [outcome]
            dist.broadcast_object_list(box, src=0)
            outcome = box[0]
        if failure is not None:
            raise failure
        if outcome[0] == "error":
            raise ParallelizerError(f"planning failed on rank 0, so rank {rank} has no plan: {outcome[1]}")
        chosen = Plan.from_json(outcome[1])
    if distributed:
        check_same_weights(model)
        create_groups(all_axis_groups(mesh))
    if chosen.pipeline is not None:
        raise PipelineError(f"auto_parallelize: pipeline plans (pp={chosen.pipeline.pp}) are not applied by "
                            "ParallelModule yet. Remedy: a mesh without 'pp', or rehearse the pipeline plan with "
                            "`parallelizer rehearse plan.json --nproc N`")
    module = ParallelModule(traced, spec_from_plan(chosen), rank, model, grad_bucket_bytes=grad_bucket_bytes)
    module.plan = chosen
    return module


def _plan_for(traced, mesh, cluster, memory_budget, optimizer, options) -> Plan:
    return plan(traced, mesh, cluster=cluster, memory_budget_bytes=memory_budget, optimizer=optimizer, **options)
