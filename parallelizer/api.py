"""`plan`, THE planner: search over (pp, dp, tp), schedule and microbatches, or the ILP on a given mesh, plus
provenance (`auto_parallelize`, which calls it on rank 0, is in `auto_parallel.py`).

`plan` records, in the `Plan`, the traced graph's fingerprint
(`parallelizer.fingerprint`), the cluster it was priced on, the repeated blocks (for per-block views),
the user's own checkpoint regions as forced "full" recomputation (`TracedGraph.user_recompute`) and,
when given, the model recipe; so a saved plan can be checked against a model (`PlanMismatchError`), shown
by block, and rehearsed by the CLI.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from cost_model.topology import Cluster

from .core.mesh import MeshSpec
from .config import PlanConfig
from .errors import ConfigError, InfeasiblePlanError, PipelineError
from .fingerprint import graph_fingerprint
from .planner import Plan
from .planner import plan as _solve
from .planner.api import memory_budget, resolve_cluster
from .planner.heap import on_frozen_heap
from .planner.recompute import regions, runnable
from .planner.schedules import get_schedule
from .planner.stages import (PP_AXIS, SCHEDULE_NAMES, PipelineEstimate, check_schedules, pipeline_section,
                             split_mesh)
from .tracer import TracedGraph
from .tracer.blocks import pipeline_unit


def describe_cluster(cluster: Cluster, spec: str | None = None) -> dict:
    """JSON description of a cluster (stored in `Plan.cluster`); `spec` is the preset string or profile path."""
    link = lambda lk: {"name": lk.name, "latency_s": lk.latency_s, "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s}  # noqa: E731
    return {"spec": spec, "device": cluster.device.name, "num_nodes": cluster.num_nodes,
            "devices_per_node": cluster.devices_per_node, "hbm_bytes": int(cluster.device.hbm_bytes),
            "intra_node_link": link(cluster.intra_node_link), "inter_node_link": link(cluster.inter_node_link)}


@on_frozen_heap  # planning does not rescan the caller's heap in full collections (`planner.heap`)
def plan(traced: TracedGraph, mesh: MeshSpec | dict | None = None, *, cluster: Cluster | str | None = None,
         global_batch: int | None = None, retrace: Callable[[int], TracedGraph] | None = None,
         schedule: str | tuple[str, ...] | None = None, microbatches: int | tuple[int, ...] | None = None,
         virtual_stages: int | None = None, recipe: dict | None = None, batch: dict | None = None,
         progress: bool | None = None, **options) -> Plan:
    """THE planner: one `Plan` for `traced`, with provenance (module docstring).

    Three ways in, one rule (docs/architecture.md, "One planner"):
      * no mesh: the whole space (pp, dp, tp) x microbatches x schedule of the cluster's devices is searched
        with the segment-priced branch and bound of `planner.search.plan_pipeline` (the search engine); the
        winner becomes the Plan: pp == 1 -> the ILP on its (dp, tp) mesh (`planner.plan`), pp > 1 -> a
        pipeline Plan (`_pipeline_plan`) holding the search's stage cuts, schedule, microbatches and estimate.
      * a mesh with "pp" first, e.g. {"pp": 4, "dp": 8, "tp": 2}: the same search with the factorisation fixed.
      * a mesh without "pp": the ILP on that mesh, as always (no search).
    A graph without repeated blocks has no stages to cut: its search is over the (dp, tp) meshes of
    `mesh_candidates`, one ILP each (`_search_without_blocks`).

    Search rules: tp divides the devices per node; the global batch splits as dp x microbatches x an integer
    microbatch; dp is priced as data parallelism with replicated optimizer state, or with zero1="dp" partitioned
    over dp (ZeRO-1, run by torch's ZeroRedundancyOptimizer over `pm.process_group("dp")`);
    stage memory (the schedule's in-flight microbatches) must fit the budget minus the reserve
    (`planner.api.memory_budget`). The Plan's traced graph must be at the winner's step batch
    (global_batch / microbatches): `retrace(batch)` gives it; without `retrace` the microbatch count is fixed
    to global_batch / (the traced batch).

    Args:
        traced: from `parallelizer.trace`; with pp its batch is one microbatch (see above).
        mesh: None (search), a `MeshSpec` or {"dp": 2, "tp": 4} (last axis innermost), "pp" first if present.
        cluster: a `Cluster`, a preset string "h100:8x8", a calibration profile path, or None
            (`planner.api.resolve_cluster`; a search without mesh then uses one DGX H100 node, "h100:1x8").
        global_batch: samples per optimizer step (search only; default traced batch x microbatches).
        retrace: batch -> TracedGraph of the same model at that batch (search only; see above).
        schedule: one name or a tuple restricting the pipeline schedules (`planner.stages.SCHEDULE_NAMES`).
        microbatches: fix the number of microbatches (pp > 1) or gradient-accumulation steps (pp == 1), or a
            tuple of the counts the search may choose (with `global_batch`; e.g. the CLI's counts whose
            microbatch has at least as many samples as the model runs on: BatchNorm needs 2 in training).
        virtual_stages: stages per pp rank; must match the schedule (1 for gpipe/1f1b, 2 for interleaved).
        recipe: how to rebuild the model (`parallelizer.presets`), kept in `plan.model["recipe"]`.
        batch: batch facts kept in `plan.model["batch"]` (e.g. {"global_batch": 512, "seq_len": 2048}).
        progress: a tqdm bar over the search's candidates (None: only on a terminal).
        options: `PlanConfig` fields (memory_budget_bytes=, optimizer=, precision=, time_limit_s=, ...) or config=.
    Returns:
        The Plan; a searched one records the search in `plan.model["search"]` (chosen factorisation, its
        estimated step, candidates priced) and, for pp > 1, `plan.pipeline` (stages and `PipelineEstimate`).
    Raises:
        PipelineError: "pp" not first, axes other than pp/dp/tp with pp, an unrunnable or unknown schedule,
            pipeline options on a mesh without pp, blocks groups the search and the runtime disagree on.
        InfeasiblePlanError: no plan fits the memory budget (names the minimum). ValueError: bad mesh, batch
            or config (names the field).
    """
    if mesh is not None:
        mesh = MeshSpec.of(mesh)
    if mesh is not None and PP_AXIS not in mesh.axis_names:
        given = [k for k, v in (("schedule", schedule), ("microbatches", microbatches), ("virtual_stages",
                 virtual_stages), ("global_batch", global_batch), ("retrace", retrace)) if v is not None]
        if given:
            raise PipelineError(f"{given[0]}= is for searched or pipeline plans: put a 'pp' axis first in the mesh "
                                f"(e.g. {{'pp': 2, **{dict(zip(mesh.axis_names, mesh.shape))}}}), pass no mesh to "
                                f"search, or drop {given[0]}=")
        zero1 = options.get("zero1") or getattr(options.get("config"), "zero1", None)
        if zero1 is not None and zero1 not in mesh.axis_names:
            raise ConfigError(f"zero1={zero1!r} names no axis of mesh {mesh} (axes: {', '.join(mesh.axis_names)}); "
                             "give the data-parallel axis to partition the optimizer state over, e.g. zero1='dp'")
        topology = options.get("topology")
        resolved, spec = (topology.cluster, None) if topology is not None else cluster_of_mesh(mesh, cluster)
        solved = _solve(traced, mesh, cluster=resolved, **options)
        solved = _with_compression(solved, traced, resolved, options)
        return _with_provenance(solved, traced, resolved, spec, recipe, batch)
    zero1 = options.get("zero1") or getattr(options.get("config"), "zero1", None)
    if zero1 is not None and (zero1 != "dp" or (mesh is not None and "dp" not in mesh.axis_names)):
        where = f"mesh {mesh}" if mesh is not None else "a searched (pp, dp, tp) mesh"
        raise ConfigError(f"zero1={zero1!r} on {where}: a pipeline or searched plan partitions the optimizer state over "
                         "its data-parallel axis 'dp' only, which " + ("this mesh lacks" if zero1 == "dp" else
                                                                        "is the one to name")
                         + ". Remedy: zero1='dp' (CLI --zero1 dp) on a mesh with a dp axis, e.g. pp=2,dp=2, or no zero1")
    return _searched_plan(traced, mesh, cluster, global_batch, retrace, schedule, microbatches, virtual_stages,
                          recipe, batch, progress, options)


def _with_compression(p: Plan, traced: TracedGraph, cluster: Cluster, options: dict) -> Plan:
    """`p` with its gradient-compression record (`planner.compression.choose_for_plan`) when the config allows
    compression (a plan on a given mesh, or the winner of a search without repeated blocks)."""
    config = options.get("config") or PlanConfig()
    config = dataclasses.replace(config, **{k: v for k, v in options.items()
                                            if k in ("compression", "powersgd_rank", "powersgd_warmup")})
    if config.compression == "none":
        return p
    from cost_model.topology import MeshTopology
    from .planner.compression import choose_for_plan
    topology = options.get("topology") or MeshTopology(cluster, p.mesh.shape, p.mesh.axis_names)
    return dataclasses.replace(p, compression=choose_for_plan(traced, p, topology, config))


def _with_provenance(p: Plan, traced: TracedGraph, cluster: Cluster, spec: str | None, recipe, batch) -> Plan:
    model = dict(p.model)
    model["blocks"] = [{"name": b.name, "module_type": b.module_type, "members": list(b.members),
                        "nodes": [list(n) for n in b.nodes]} for b in traced.blocks]
    if recipe is not None:
        model["recipe"] = recipe
    if batch is not None:
        model["batch"] = batch
    # the user's own torch.utils.checkpoint regions are forced "full" (respected, never silently dropped)
    return dataclasses.replace(p, model=model, fingerprint=graph_fingerprint(traced),
                               cluster=describe_cluster(cluster, spec),
                               recompute={**p.recompute, **traced.user_recompute})


SEARCH_CLUSTER = "h100:1x8"  # what a search without mesh and cluster runs on: one DGX H100 node


def search_cluster(cluster: Cluster | str | None) -> tuple[Cluster, str | None]:
    """(Cluster, spec) a search without mesh runs on: a Cluster as is, a preset, a calibration profile (its
    largest calibrated process count), or None: `SEARCH_CLUSTER`. Raises ValueError (bad preset/profile)."""
    if isinstance(cluster, str) and (cluster.endswith(".json") or os.path.exists(cluster)):
        from cost_model.calibrate import load_profile
        return resolve_cluster(cluster, max(load_profile(cluster).links))
    return resolve_cluster(cluster if cluster is not None else SEARCH_CLUSTER, 0)


def _fixed_factorisation(mesh: MeshSpec, cluster) -> tuple[Cluster, str | None, int, int]:
    """(cluster of exactly the mesh's devices, spec, pp, tp) of a mesh with "pp" first (`plan`)."""
    split_mesh(mesh)  # "pp" first, or PipelineError
    extra = set(mesh.axis_names) - {PP_AXIS, "dp", "tp"}
    if extra:
        raise PipelineError(f"mesh {mesh}: a pipeline mesh has axes pp, dp, tp (in that order), not {sorted(extra)}. "
                            "Remedy: rename the axes, e.g. pp=2,dp=2,tp=2")
    if [a for a in mesh.axis_names if a != PP_AXIS] not in (["dp", "tp"], ["dp"], ["tp"], []):
        raise PipelineError(f"mesh {mesh}: put dp before tp (tp innermost, inside a node)")
    full, spec = cluster_of_mesh(mesh, cluster)
    return full, spec, mesh.size(PP_AXIS), mesh.size("tp") if "tp" in mesh.axis_names else 1


def cluster_of_mesh(mesh: MeshSpec, cluster) -> tuple[Cluster, str | None]:
    """(Cluster, spec) a plan on `mesh` is priced on (`resolve_cluster`), checked to have exactly the mesh's
    devices, with or without a "pp" axis; the CLI checks it before tracing.

    Raises:
        ValueError: the mesh and the cluster differ in device count (`cost_model.topology.MeshTopology`'s message:
            both counts and a cluster preset of the mesh's size). Before round 17 a mesh with "pp" silently
            resized the cluster ("pp=2,dp=4" on "h100:1x4" was priced on 2 x 4 devices, labelled "h100:1x4").
    """
    from cost_model.topology import MeshTopology

    full, spec = resolve_cluster(cluster, mesh.world_size)
    MeshTopology(full, tuple(mesh.shape), tuple(mesh.axis_names))
    return full, spec


def _searched_plan(traced, mesh, cluster, global_batch, retrace, schedule, microbatches, virtual_stages, recipe,
                   batch, progress, options) -> Plan:
    """`plan` without a mesh, or with a "pp" axis: search, then build the winner's Plan (see `plan`)."""
    from .planner.search import plan_pipeline
    from .planner.segments import _trace_batch

    config = dataclasses.replace(options.pop("config", None) or PlanConfig(), **options)
    schedules = check_schedules(schedule or SCHEDULE_NAMES)
    if schedule is None:  # a zero-bubble schedule would be refused at build (`runtime.stage_checks.check_split_backward`)
        from .runtime.stage_checks import SPLIT_BACKWARD, read_twice_by_a_stage
        if read_twice_by_a_stage(traced):
            schedules = tuple(n for n in schedules if n not in SPLIT_BACKWARD)
    if virtual_stages is not None and any(get_schedule(n).virtual_stages != virtual_stages for n in schedules):
        raise PipelineError(f"virtual_stages={virtual_stages} with schedule(s) {', '.join(schedules)}: gpipe/1f1b run "
                            "1 stage per pp rank, interleaved_1f1b 2. Remedy: drop virtual_stages= or pick a schedule")
    if mesh is None:
        full, spec = search_cluster(cluster)
        pps = (1,) if _batch_not_first(traced, config) else None  # microbatches cut dim 0 (`_batch_not_first`)
        tps = None
    else:
        full, spec, pp, tp = _fixed_factorisation(mesh, cluster)
        pps, tps = (pp,), (tp,)
        if pp > 1 and (late := _batch_not_first(traced, config)):
            raise PipelineError(f"mesh {mesh}: a pipeline splits every input into microbatches along dim 0, but "
                                f"{', '.join(f'{n!r} has its batch in dim {d}' for n, d in late)} (batch_dims): "
                                "microbatches cut along another dim compute another function. Remedy: pass those "
                                "inputs batch-first (transpose in the data loader and back inside forward), or a mesh "
                                "without 'pp'")
        group = pipeline_unit(traced)
        if group is not None and pp > group.count:
            raise PipelineError(f"mesh {mesh}: pp={pp} stages > the {group.count} blocks of {group.name} (stages are "
                                f"cut at block boundaries). Remedy: pp <= {group.count}")
    b0 = _trace_batch(traced)
    if not traced.blocks and (mesh is None or pipeline_unit(traced) is None):  # a mesh with pp may cut a layer stack
        if mesh is not None:
            from .tracer.blocks import shared_weight_calls
            shared = shared_weight_calls(traced.parameters, traced.nodes)
            has = (f"this graph has one block ({shared[0]}) called {shared[1]} times with shared weights, not "
                   "several blocks with their own weights, so there is no boundary between weights to cut at"
                   if shared else "this graph has none")
            raise PipelineError(f"mesh {mesh}: pipeline stages are cut at repeated blocks (e.g. transformer layers) "
                                f"and {has}. Remedy: a mesh without 'pp' (dp / tp"
                                + (" split a shared-weight model)" if shared else
                                   f", e.g. {{'dp': {MeshSpec.of(mesh).world_size}}})"))
        if global_batch not in (None, b0):
            if retrace is None:
                raise ConfigError(f"global_batch={global_batch} differs from the traced batch {b0} of a graph without "
                                 "repeated blocks (no microbatching there). Remedy: trace the global batch or pass "
                                 "retrace=")
            traced, b0 = retrace(global_batch), global_batch
        found = _with_compression(_search_without_blocks(traced, full, config, b0), traced, full, {"config": config})
        return _with_provenance(found, traced, full, spec, recipe, batch)
    if isinstance(microbatches, tuple) and global_batch is None:
        raise ConfigError(f"microbatches={microbatches} (counts to choose from) needs global_batch=")
    if global_batch is None:
        global_batch = b0 * (microbatches or (pps[0] if pps else 1))
    if microbatches is not None:
        ms = microbatches if isinstance(microbatches, tuple) else (microbatches,)
        if all(global_batch % m for m in ms):  # before: "needs a graph traced at batch 2.66667" (round 17)
            divisors = [d for d in range(1, global_batch + 1) if global_batch % d == 0]
            raise PipelineError(f"global_batch={global_batch} does not split into microbatches={microbatches} of whole "
                                f"samples. Remedy: microbatches= one of {divisors} (each also divisible by the dp "
                                "degree), or another global_batch")
        if retrace is None and any(global_batch != m * b0 for m in ms):
            raise ConfigError(f"global_batch={global_batch} with microbatches={microbatches} needs a graph traced at "
                             f"batch {global_batch / ms[0]:g}, not {b0}. Remedy: trace one microbatch, or pass "
                             "retrace=")
    elif retrace is not None:
        ms = None
    elif global_batch % b0:
        raise ConfigError(f"global_batch={global_batch} is not a multiple of the traced batch {b0}: without retrace= "
                         "the traced graph is one microbatch. Remedy: trace with a divisor of the global batch, or "
                         "pass retrace=lambda batch: parallelizer.trace(...) so the search may choose microbatches")
    else:
        ms = (global_batch // b0,)
    budget, reserve = memory_budget(config, full.device)
    search_config = dataclasses.replace(config, memory_budget_bytes=None, memory_reserve_bytes=None, data_axes=None,
                                        axis_roles=tuple((a, r) for a, r in config.axis_roles if a == "tp"))
    found = plan_pipeline(traced, full, global_batch=global_batch, memory_budget_bytes=budget - reserve, pp=pps,
                          tp=tps, num_microbatches=ms, schedules=schedules, zero1=config.zero1 == "dp",
                          config=search_config,
                          progress=progress)
    step_batch = global_batch // found.num_microbatches
    if step_batch != b0:
        if retrace is None:
            raise PipelineError(f"microbatches={found.num_microbatches} needs a graph traced at batch {step_batch}, "
                                f"not {b0}. Remedy: pass retrace=, or microbatches={global_batch // b0}")
        traced = retrace(step_batch)
    sub = _intra_mesh(found.dp, found.tp)
    record = _search_record(found)
    if found.pp == 1:
        p = _solve(traced, sub, cluster=full, config=config)
        p = dataclasses.replace(p, model={**p.model, "search": record})
    else:
        whole = mesh if mesh is not None else MeshSpec((PP_AXIS, *sub.axis_names), (found.pp, *sub.shape)) \
            if sub.world_size > 1 else MeshSpec((PP_AXIS,), (found.pp,))
        p = _pipeline_plan(traced, found, whole, sub, full, config, budget, reserve, record)
    p = dataclasses.replace(p, compression=dict(found.compression))  # the search's choice (planner.search)
    return _with_provenance(p, traced, full, spec, recipe, batch)


def _batch_not_first(traced: TracedGraph, config: PlanConfig) -> list[tuple[str, int]]:
    """(input, batch dim) of the user inputs whose declared batch dim (`PlanConfig.batch_dims` /
    `default_batch_dim`) is not 0: a pipeline cuts microbatches along dim 0 (`runtime.microbatches`), so such a plan
    would microbatch along another dim, silently another function (round 13, r13a: a sequence-first input)."""
    return [(n, d) for n in traced.input_names if (d := config.batch_dim_of(n)) not in (0, None)]


def _search_without_blocks(traced: TracedGraph, cluster: Cluster, config: PlanConfig, batch: int) -> Plan:
    """The search on a graph without repeated blocks: no stages to cut, so pp = 1 and one step; each
    `mesh_candidates` mesh is planned by the ILP and the lowest estimated step kept (ties: candidate order).

    Raises:
        InfeasiblePlanError: no candidate fits (lists each mesh's reason).
    """
    tried, reasons = [], []
    for i, mesh in enumerate(mesh_candidates(cluster.world_size, cluster.devices_per_node)):
        try:
            solved = _solve(traced, mesh, cluster=cluster, config=config)
            tried.append((solved.cost.total_s, i, mesh, solved))
        except InfeasiblePlanError as exc:
            reasons.append(f"  {mesh}: {str(exc).splitlines()[0]}")
    if not tried:
        raise InfeasiblePlanError("no mesh fits:\n" + "\n".join(reasons)
                                  + "\nRemedy: raise the memory budget, add devices, or lower the batch.")
    step_s, _, mesh, p = min(tried, key=lambda t: t[:2])  # the winner's plan as solved (no second solve)
    dp, tp = (mesh.shape + (1,))[:2]
    record = {"mesh": {"axis_names": ["pp", "dp", "tp"], "shape": [1, dp, tp]}, "schedule": "1f1b",
              "microbatches": 1, "microbatch_size": batch // dp, "global_batch": batch, "step_s": step_s,
              "candidates": len(tried) + len(reasons), "priced": len(tried) + len(reasons), "pruned": 0,
              "infeasible_memory": len(reasons)}
    return dataclasses.replace(p, model={**p.model, "search": record})


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


def _intra_mesh(dp: int, tp: int) -> MeshSpec:
    """The (dp, tp) mesh without size-1 axes ((dp=1) when both are 1)."""
    axes = [(a, n) for a, n in (("dp", dp), ("tp", tp)) if n > 1] or [("dp", 1)]
    return MeshSpec(tuple(a for a, _ in axes), tuple(n for _, n in axes))


def _search_record(found) -> dict:
    """What `plan.model["search"]` keeps of the search: the winner, how much was priced (no wall times) and
    why this schedule (`planner.pipeline.ScheduleAlternative` per searched schedule, the winner first), and
    the stages that took the memory-lean layout (`StageSpec.lean`)."""
    s = found.search
    return {"mesh": found.mesh.to_dict(), "schedule": found.schedule, "microbatches": found.num_microbatches,
            "microbatch_size": found.microbatch_size, "global_batch": found.global_batch,
            "step_s": found.step_time_s, "candidates": s.candidates, "priced": s.evaluated, "pruned": s.pruned,
            "infeasible_memory": s.infeasible_memory, "simulated": s.simulated,
            "lean_stages": [st.index for st in found.stages if st.lean],
            "tflops_per_device": found.tflops_per_gpu, "mfu": found.mfu, "peak_flops_per_s": found.peak_flops_per_s,
            "device": found.device,
            "alternatives": [dataclasses.asdict(a) for a in found.alternatives],
            **({"stage_scale": found.stage_scale} if found.stage_scale != 1.0 else {})}  # ranks sharing cores


# The final intra-stage ILP of a pipeline plan sees the whole graph on one stage group; stage memory is the
# search's (partition under the budget), so the ILP runs without its memory row, as `planner.segments` does.
_NO_BUDGET = 10 ** 18


def _pipeline_plan(traced, found, whole: MeshSpec, sub: MeshSpec, full: Cluster, config: PlanConfig, budget: int,
                   reserve: int, record: dict) -> Plan:
    """The pipeline Plan of a search winner with pp > 1 (full mesh `whole`, pp first): the intra-stage ILP on
    `sub` solved per distinct stage (`planner.stage_layouts`; dp priced as DDP, as the search did: role "ddp"
    unless the caller set one), the search's cuts and estimate and each stage's layout in `Plan.pipeline`,
    and `cost.memory_bytes` = the search's peak pipeline rank by kind (the ILP's memory would be the whole
    model on one stage group). `cost` times are the stage solves' summed: the whole graph, one microbatch,
    one stage group."""
    from .planner.stage_layouts import plan_stages
    from .runtime.pipeline import cut_stages

    group = pipeline_unit(traced)
    if found.block_group != group.name:
        layers = found.block_group.split(".*.")[0] + ".*" if ".*." in found.block_group else None
        why = (f"; here only the {found.block_group} parts repeat, and no run of the numbered layers {layers} "
               f"holds every member of the first repeated group {group.name}, which a pipeline of layers of several "
               "kinds needs (`tracer.blocks.layer_stack`)" if layers else "")
        raise PipelineError(f"the search cut at block group {found.block_group} but the runtime cuts at the first "
                            f"group {group.name}: this model's repeated modules do not form one run of identical "
                            "layers to cut between (e.g. an encoder-decoder such as T5, whose encoder and decoder "
                            f"blocks differ{why}), which pipelining does not support yet. Remedy: a mesh without "
                            "'pp' (e.g. dp=2 or tp=2, or let the planner search without --mesh)")
    roles = dict(config.axis_roles)
    if found.dp > 1:
        roles.setdefault("dp", "ddp")
    per_node = min(full.devices_per_node, sub.world_size)
    stage_cluster = dataclasses.replace(full, num_nodes=sub.world_size // per_node, devices_per_node=per_node)
    per_stage = tuple(s.num_blocks for s in found.stages)
    cut = cut_stages(traced, len(per_stage), per_stage)
    p, layouts = plan_stages(traced, cut, sub, stage_cluster, dataclasses.replace(
        config, axis_roles=roles, memory_budget_bytes=_NO_BUDGET, memory_reserve_bytes=0),
        lean=tuple(s.lean for s in found.stages))
    memory = tuple(_rank_memory(found, r) for r in range(found.pp))
    b = found.step_breakdown_s
    estimate = PipelineEstimate(found.step_time_s, b["pipeline"], b["bubble"], b["dp_grad_sync"], b["tied_grad_sync"],
                                found.microbatch_size, found.global_batch, found.partition,
                                tuple(s.time_s for s in found.stages), memory)
    section = pipeline_section(whole, sub.world_size, tuple(group.members), cut.stage_of, found.pp,
                               found.schedule, found.num_microbatches, found.virtual_stages, per_stage, estimate,
                               found.boundary_compression, layouts)
    peak = dict(estimate.peak_memory_bytes, buffers=0)
    peak["total"] = sum(v for k, v in peak.items() if k != "total")
    peak["reserve"] = reserve
    cfg = dict(p.config, memory_budget_bytes=budget, memory_reserve_bytes=reserve)
    cfg["axis_roles"] = [list(x) for x in roles.items()]
    # the search's recomputation mode per stage, on every block of the stage (what its memory was priced with)
    # that the program can run (`recompute.runnable`: blocks writing state in place were priced without it too)
    blocks = regions(traced)  # a layer of a stack that is no repeated block is not recomputed (`segments`)
    recompute = runnable(traced, {member: stage.recompute for stage, planned in zip(found.stages, section.stages)
                                  if stage.recompute != "none" for member in planned.blocks if member in blocks})
    return dataclasses.replace(p, cost=dataclasses.replace(p.cost, memory_bytes=peak), config=cfg,
                               pipeline=section, model={**p.model, "search": record},
                               recompute={**p.recompute, **recompute})


def _rank_memory(found, r: int) -> dict:
    """Pipeline rank r's bytes per device by kind from the search: state of its stages (params, grads,
    optimizer per `StageKindSummary`) + its in-flight microbatches x its stages' activations of one microbatch
    + on the last stage one microbatch of the returned outputs."""
    rank = found.ranks[r]
    kinds = {k.kind: k.memory_bytes for k in found.stage_kinds}
    out = {"params": 0, "grads": 0, "optimizer": 0, "activations": 0, "outputs": 0}
    for i in rank.stages:
        stage = found.stages[i]
        for k in ("params", "grads", "optimizer", "outputs"):
            out[k] += int(kinds[stage.kind].get(k, 0))
        out["activations"] += int(stage.activation_bytes * rank.inflight_microbatches)
    out["total"] = sum(out.values())
    return out
