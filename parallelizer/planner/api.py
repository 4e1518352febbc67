"""`plan(traced, mesh, ...)`: TracedGraph -> Plan, and `explain` (why a node's strategy won).

Pipeline: strategy spaces (`strategies.py`) -> prices (`costs.py`, cost_model) -> groups and cost matrices
(`problem.py`) -> ILP (`ilp.py`) -> `Plan` (`plan.py`) whose edges carry `core.redistribute.edge_steps`.
Deterministic: graph-ordered iteration, sorted pairs, single-thread seeded solver.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from cost_model.reserve import default_reserve_bytes
from cost_model.topology import Cluster, MeshTopology, dgx_h100, get_cluster

from ..config import PlanConfig
from ..core.layout import Layout, local_shape
from ..core.mesh import MeshSpec
from ..errors import ConfigError, InfeasiblePlanError, UnknownNodeError, format_bytes
from ..fingerprint import dtype_name
from ..tracer import TracedGraph
from ..tracer.graph import carries_grad
from .costs import NodeCost, Pricer
from .ilp import Solution, decision_counts, memory_bytes, objective_s, recompute_cost
from .plan import CostBreakdown, Fallback, NodePlan, ParamPlan, Plan, SolverReport, derive_edge, empty_comm
from .problem import Problem, binding_row, build_problem, grad_axes, layout_of
from .heap import on_frozen_heap
from .local_storage import local_saved_bytes
from .memory_fit import replayed_peak, solve_fitting
from .peak import StepPeak, step_peak
from .shared_uses import FirstUses
from .recompute import RegionPrice, price_region, region_recompute, regions, runnable, shared_inputs, state_writing
from .strategies import build_spaces


@on_frozen_heap  # (`planner.heap`)
def plan(traced: TracedGraph, mesh: MeshSpec | dict[str, int], *, cluster: Cluster | str | None = None,
         topology: MeshTopology | None = None, config: PlanConfig | None = None, pinned: dict[str, str] | None = None,
         pricer: Pricer | None = None, received: dict[str, str] | None = None, lean: bool = False,
         fixed: dict[str, str] | None = None, **options) -> Plan:
    """Plan the sharding of `traced` on `mesh`.

    Args:
        traced: from `parallelizer.trace`.
        mesh: a `MeshSpec` or {"dp": 2, "tp": 4} (last axis innermost).
        cluster: a `cost_model.topology.Cluster`, a preset string "h100:1x8", a calibration profile path, or
            None: DGX H100 nodes holding the mesh (`resolve_cluster`).
        topology: a ready `MeshTopology` (overrides `cluster`).
        config: a `PlanConfig`; `options` (e.g. memory_budget_bytes=..., memory_reserve_bytes=...,
            batch_dims={...}, optimizer=..., precision="bf16"|"fp32", time_limit_s=...) override its fields.
        pinned: parameter placeholder -> its only allowed stored layout (`build`).
        pricer: a `Pricer` whose caches the solve reuses (`build`).
        received: input placeholder -> the layout it arrives in (`build`).
        fixed: node -> its only allowed strategy ("inputs -> output", `NodePlan.strategy`; `build`).
        lean: solve for the memory-lean layout (`ilp.solve_lean`: the fastest within 1% of the least activation
            bytes) instead of the fastest under the budget: a pipeline stage the search gave that layout.
    Returns:
        The `Plan`.
    Raises:
        InfeasiblePlanError: the memory budget cannot be met (names the minimum needed and remedies), also by the
            plan's step peak replayed on the ranks' local storages (`memory_fit.solve_fitting`).
        PrecisionError: a precision the device or the traced graph cannot be priced in (`costs.resolve_precision`).
        ValueError: bad mesh / config / topology (names the field).
    """
    mesh = MeshSpec.of(mesh)
    config = dataclasses.replace(config or PlanConfig(), **options)
    problem, pricer = build(traced, mesh, cluster=cluster, topology=topology, config=config, pinned=pinned,
                            pricer=pricer, received=received, fixed=fixed)
    # solved until the pick's step peak replayed on the ranks' local storages fits the budget (`memory_fit`)
    problem, solution, held, peak = solve_fitting(traced, problem, pricer, config, lean)
    return to_plan(traced, problem, pricer, solution, config, held, peak)


def build(traced: TracedGraph, mesh: MeshSpec, *, cluster=None, topology=None,
          config: PlanConfig, pinned: dict[str, str] | None = None, pricer: Pricer | None = None,
          received: dict[str, str] | None = None, fixed: dict[str, str] | None = None) -> tuple[Problem, Pricer]:
    """The ILP data of `plan` without solving it (used by `explain`, tests and benchmarks).

    `pinned`: parameter placeholder -> the only stored layout it may take (a layout string, "S(0)R"): how the
    per-stage solves of a pipeline plan keep a parameter held by several stages (a tied embedding) in one
    stored layout (`planner.stage_layouts`). Raises ValueError when a pinned layout is not among the
    placeholder's strategies.

    `received`: input placeholder -> the layout (string) it arrives in, with its gradient sent back
    (`strategies.build_spaces`): a pipeline stage's values from the previous stage, so that the stage's solve
    prices re-laying them out, forward and backward (`planner.stage_layouts`).

    `fixed`: node -> the only strategy it may take ("inputs -> output", `NodePlan.strategy`): how the per-stage
    solves of a pipeline plan try a later stage's repeated blocks in the strategies of their first occurrence
    (`planner.stage_layouts`, the last tie-break); a node whose strategies here do not include it stays free
    (the caller compares the solves' objectives).

    `pricer`: a `Pricer` built earlier for the same mesh, topology and pricing (`Pricer.check_reusable`), so
    graphs planned one after the other (the stages of a pipeline, `planner.stage_layouts`) share its caches
    of edge and op prices; None: a new one. Raises ValueError when it was built for other prices.
    """
    topo = topology or MeshTopology(resolve_cluster(cluster, mesh.world_size)[0], mesh.shape, mesh.axis_names)
    if pricer is None:
        pricer = Pricer(topo, mesh, config, traced)
    else:
        pricer.check_reusable(topo, mesh, config, traced)
    budget, reserve = memory_budget(config, topo.cluster.device)
    spaces = build_spaces(traced, mesh, config, {n: Layout.parse(L) for n, L in (received or {}).items()})
    for name, layout in (pinned or {}).items():
        kept = [s for s in spaces[name].strategies if str(s.output) == layout]
        if not kept:
            raise ValueError(f"pinned layout {layout} of {name} is not among its stored layouts "
                             f"{[str(s.output) for s in spaces[name].strategies]} on mesh {mesh}")
        spaces[name].strategies = kept
    _fix(spaces, fixed or {})
    return build_problem(traced, spaces, pricer, config, budget - reserve, reserve), pricer


def _fix(spaces: dict, fixed: dict[str, str]) -> None:
    """Restrict each node of `fixed` to the strategy it names (`build`), and with it every node sharing its
    variables: a follower's strategies are index-aligned with its leader's (`strategies._follow`), so the
    positions kept are kept for the leader and all its followers alike (round 19: a follower restricted alone
    left its group with lists of two lengths, and the problem could not be built). Nodes of one leader that ask
    for different positions keep those common to all; a node whose strategies do not include what it asks
    (e.g. it reads a received value) stays free (the caller compares the solves' objectives)."""
    keep: dict[str, set[int]] = {}
    for name, want in fixed.items():
        space = spaces[name]
        found = {i for i, s in enumerate(space.strategies)
                 if f"{' '.join(str(L) for L in s.inputs)} -> {s.output}".lstrip() == want}
        if found:
            head = space.leader or name
            keep[head] = keep[head] & found if head in keep else found
    for head, positions in keep.items():
        if positions:
            for space in (sp for n, sp in spaces.items() if n == head or sp.leader == head):
                space.strategies = [s for i, s in enumerate(space.strategies) if i in positions]


def memory_budget(config: PlanConfig, device) -> tuple[int, int]:
    """(budget, reserve) in bytes per device: the budget is `config.memory_budget_bytes` or the device's
    memory; the reserve is `config.memory_reserve_bytes` or its default (`PlanConfig.memory_reserve_bytes`:
    `cost_model.reserve.default_reserve_bytes(device)` when the budget is the device's memory, 0 for an
    explicit budget). The plan's tensors must fit in budget - reserve.

    Raises:
        InfeasiblePlanError: the reserve leaves nothing of the budget (remedy: a smaller reserve).
    """
    budget = int(config.memory_budget_bytes or device.hbm_bytes)
    if config.memory_reserve_bytes is not None:
        reserve = config.memory_reserve_bytes
    else:
        reserve = default_reserve_bytes(device) if config.memory_budget_bytes is None else 0
    if reserve >= budget:
        raise InfeasiblePlanError(f"memory: the reserve of {format_bytes(reserve)} leaves nothing of the "
                                  f"{format_bytes(budget)} budget per device. Remedy: a smaller reserve "
                                  "(memory_reserve_bytes=, --memory-reserve-gb) or a larger budget")
    return budget, reserve


def resolve_cluster(cluster: Cluster | str | None, world_size: int) -> tuple[Cluster, str | None]:
    """The ONE rule for what a plan is priced on (planner, `parallelizer.plan`, `auto_parallelize`, the CLI):
    (Cluster, its spec string) from a Cluster, a preset "h100:2x8", a calibration profile path (its links
    for `world_size` processes), or None: `default_cluster(world_size)`.

    Raises:
        ConfigError: a malformed preset, or a profile without a link for `world_size` processes (a ValueError).
    """
    if isinstance(cluster, Cluster):
        return cluster, None
    try:
        if isinstance(cluster, str) and (cluster.endswith(".json") or os.path.exists(cluster)):
            from cost_model.calibrate import load_profile
            return load_profile(cluster).cluster(world_size), cluster
        if isinstance(cluster, str):
            return get_cluster(cluster), cluster
    except ValueError as exc:  # cost_model's own errors (it does not depend on parallelizer): the user's option
        raise ConfigError(f"cluster={cluster!r}: {exc}") from exc
    return default_cluster(world_size)


_DGX_DEVICES_PER_NODE = 8  # DGX H100: 8 GPUs per node (NVIDIA DGX H100 datasheet)


def default_cluster(world_size: int) -> tuple[Cluster, str]:
    """The cluster assumed when none is given, with its preset string: DGX H100 nodes holding exactly
    `world_size` devices: one node when <= 8, else the fewest equal nodes of at most 8 devices each
    (16 -> 2x8, 12 -> 2x6, 30 -> 5x6; a prime such as 31 -> 31x1).

    Raises:
        ValueError: world_size < 1.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"default_cluster: world_size must be an int >= 1, got {world_size!r}")
    nodes = next(n for n in range(math.ceil(world_size / _DGX_DEVICES_PER_NODE), world_size + 1)
                 if world_size % n == 0)
    per_node = world_size // nodes
    return dgx_h100(nodes, devices_per_node=per_node), f"h100:{nodes}x{per_node}"


def to_plan(tg: TracedGraph, problem: Problem, pricer: Pricer, sol: Solution, config: PlanConfig,
            held: Mapping[str, int] | None = None, peak: StepPeak | None = None) -> Plan:
    """Assemble the `Plan` of a solution: strategies, stored layouts, edge steps, cost breakdown. `held`: the
    solution's `local_storage.local_saved_bytes` when the caller has it already (`segments.price_segments`), else
    computed here; `peak`: its `peak.StepPeak` when the caller has it (`memory_fit.solve_fitting`), else walked here
    (the forward too where `held` is computed here; a pipeline stage's, whose memory is the search's, backward only)."""
    mesh, spaces = problem.mesh, problem.spaces
    strat = {n: spaces[n].strategies[sol.choice[problem.group_of[n]]] for n in spaces}
    nodes, edges, fallbacks = {}, [], []
    compute_s, comm = 0.0, empty_comm()
    uses = FirstUses(tg)  # a redistribution is emitted once per (value, target layout): `shared_uses`
    for name, space in spaces.items():
        info, s = tg.nodes[name], strat[name]
        nodes[name] = NodePlan(info.op_name, tuple(str(L) for L in s.inputs), None if s.output is None else str(s.output))
        if space.fallback:
            fallbacks.append(Fallback(name, info.op_name, space.fallback))
        if space.kind == "op":
            c = pricer.node_cost(tg, info, space, s)
            compute_s += c.total_s
            if c.note:
                fallbacks.append(Fallback(name, info.op_name, c.note))
        for k, ti in enumerate(space.inputs):
            req = spaces[ti.producer].requires_grad and carries_grad(ti.dtype)
            is_param = spaces[ti.producer].kind == "param"
            # the edge as emitted (traced dtype: `derive_edge`); its time as priced (the plan's precision)
            edge = space_edge(mesh, spaces, nodes, name, k)
            dtype = pricer.input_dtype(tg, ti)  # as run (the autocast recipe's dtype; parameters as traced)
            axes = grad_axes(s, k, mesh)
            priced = pricer.steps(strat[ti.producer].output, s.inputs[k], ti.shape, dtype, axes, req, is_param)
            times = pricer.edge_step_times(priced, dtype.itemsize if is_param else None,
                                           pricer.regathers(tg, ti.producer))
            for st, (fwd, bwd) in (zip(priced, times) if uses.first(ti.producer, name, s.inputs[k], axes) else ()):
                if st.fwd_collective:
                    comm[st.fwd_collective] += fwd
                if st.bwd_collective:
                    comm[st.bwd_collective] += bwd
            edges.append(edge)
    # saved activations with the storages each rank's program really has (views / copies on local strides, a
    # redistributed input a storage of its own): `local_storage`; the ILP's row prices them per strategy
    spans: list = []  # the forward's storages (`local_storage.StorageSpan`), for the step's peak
    saved = local_saved_bytes(tg, strat, spaces, pricer, spans) if held is None else held
    act = sum(saved.values())
    rerun: dict[str, float] = {}  # collectives that recomputation runs again, by kind
    deltas, members = {}, regions(tg)
    for region, rp in recompute_prices(tg, problem, pricer, strat, dict(sol.recompute), rerun).items():
        compute_s += rp.extra_fwd_s
        act += int(rp.saved_delta_bytes)
        deltas[members[region]] = int(rp.saved_delta_bytes)
    for kind, seconds in sorted(rerun.items()):
        comm[kind] += seconds
    if config.recompute in ("selective", "full"):  # asked for every block: say which it could not be (`forced_regions`)
        fallbacks += [Fallback(name, tg.nodes[name].op_name,
                               f"recompute: block {region!r} is not recomputed: this op writes state in place (running "
                               "statistics, an EMA), which recomputation would write twice")
                      for region, name in state_writing(tg).items() if region not in dict(sol.recompute)]
    params, state = {}, [0, 0, 0]
    for p in tg.parameters.values():
        params[p.fqn] = param_plan(p, str(strat[p.placeholders[0]].output), mesh)
        if not p.is_buffer:
            numel = math.prod(params[p.fqn].local_shape)
            for i, b in enumerate(pricer.param_state_bytes(numel, p.requires_grad)):
                state[i] += b
            comm["all_gather"] += pricer.zero1_broadcast_s(numel, p.requires_grad)  # ZeRO-1's (0 without)
    memory = {"params": state[0], "grads": state[1], "optimizer": state[2], "activations": act,
              "outputs": problem.output_mem_bytes, "buffers": problem.const_mem_bytes - problem.output_mem_bytes}
    memory["total"] = sum(memory.values())  # the plan's tensors; the reserve comes on top (<= the budget)
    resident = memory["params"] + memory["optimizer"] + problem.const_mem_bytes
    # the step's peak, a timeline of its forward and backward (`peak`): the sum above less what backward frees, plus
    # the step's transients
    memory["peak"] = (peak or step_peak(tg, strat, spaces, pricer, saved, resident_bytes=resident,
                                        recompute_deltas=deltas, forward_spans=spans)).peak_bytes
    memory["reserve"] = problem.reserve_bytes
    report = SolverReport(sol.solver, sol.status, sol.optimal, sol.gap, sol.num_variables, sol.num_binary,
                          sol.num_constraints, len(problem.groups), sol.objective_s, sol.time_s)
    model = {"num_nodes": len(tg.nodes), "num_parameters": tg.num_parameters,
             "inputs": {n: list(tg.nodes[n].outputs[0].shape) for n in tg.input_names if tg.nodes[n].outputs}}
    cfg = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    cfg["memory_budget_bytes"] = problem.budget_bytes + problem.reserve_bytes
    cfg["memory_reserve_bytes"] = problem.reserve_bytes
    cfg["precision"] = pricer.precision
    if config.precision == "bf16" and pricer.autocast:  # asked for: the runtime runs it (`runtime.precision`)
        cfg["mixed_precision"] = "autocast_bf16"
    cfg["batch_dims"] = [list(x) for x in config.batch_dims]
    cfg["data_axes"] = list(config.data_axes) if config.data_axes is not None else None
    cfg["axis_roles"] = [list(x) for x in config.axis_roles]
    del cfg["time_limit_s"]
    if cfg["recompute"] == "auto":  # the default: left out, so plans of before the option stay byte-identical
        del cfg["recompute"]
    if cfg["compression"] == "none":  # likewise (planner.compression)
        del cfg["compression"], cfg["powersgd_rank"], cfg["powersgd_warmup"]
    if cfg["boundary_compression"] == "none":  # likewise (pipeline-boundary compression, `planner.boundary`)
        del cfg["boundary_compression"], cfg["boundary_rank"]
    if cfg["zero1"] is None:  # likewise (ZeRO-1, `PlanConfig.zero1`)
        del cfg["zero1"]
    return Plan(mesh, nodes, params, tuple(edges), CostBreakdown(compute_s, comm, memory), report,
                tuple(fallbacks), model, cfg, recompute=runnable(tg, dict(sol.recompute)),
                hierarchical=pricer.hierarchical_record())


def space_edge(mesh: MeshSpec, spaces: dict, nodes: dict[str, NodePlan], name: str, k: int):
    """The `EdgePlan` into input k of node `name` (`plan.derive_edge`) at the chosen strategies `nodes`, with the
    tensor facts of the strategy spaces (`strategies.build_spaces`): shape, traced dtype, whether a gradient
    flows back (the producer requires grad and the tensor is floating), whether the producer is a parameter."""
    ti = spaces[name].inputs[k]
    req = spaces[ti.producer].requires_grad and carries_grad(ti.dtype)
    return derive_edge(mesh, ti.producer, name, k, nodes[ti.producer].output, nodes[name], ti.shape,
                       dtype_name(ti.dtype), req, spaces[ti.producer].kind == "param")


def param_plan(p, stored: str, mesh: MeshSpec) -> ParamPlan:
    """The `ParamPlan` of parameter/buffer `p` (`tracer.graph.ParamInfo`) stored as `stored` on `mesh`."""
    return ParamPlan(p.fqn, tuple(p.aliases), tuple(p.placeholders), tuple(p.shape), stored,
                     local_shape(p.shape, Layout.parse(stored), mesh), p.is_buffer, dtype_name(p.dtype))


def recompute_prices(tg: TracedGraph, problem: Problem, pricer: Pricer, strat: dict, decision: dict[str, str],
                     kinds: dict[str, float] | None = None) -> dict[str, RegionPrice]:
    """`recompute.price_region` of each region of `decision` (region -> mode) at the strategies `strat`
    (node -> Strategy): extra forward seconds, saved-bytes change and the forward collectives run again per
    region (`to_plan`, `segments`). A redistribution runs again only where the program emits it: at the first
    use of its (value, target layout) (`shared_uses.FirstUses`, as `steptime.estimate_step_time`). `kinds`:
    when given, the re-run collective seconds are added to it per collective kind (`to_plan`'s breakdown)."""
    members, shared = regions(tg), shared_inputs(tg)
    spaces, mesh = problem.spaces, problem.mesh
    firsts = _first_uses(tg, spaces, strat, mesh) if decision else frozenset()

    def rerun_s(n: str, k: int) -> float:
        if (n, k) not in firsts:
            return 0.0
        ti = spaces[n].inputs[k]
        req = spaces[ti.producer].requires_grad and carries_grad(ti.dtype)
        total = 0.0
        for st in pricer.steps(strat[ti.producer].output, strat[n].inputs[k], ti.shape, pricer.input_dtype(tg, ti),
                               grad_axes(strat[n], k, mesh), req):
            fwd = pricer.step_time_s(st)[0]
            total += fwd
            if kinds is not None and st.fwd_collective:
                kinds[st.fwd_collective] = kinds.get(st.fwd_collective, 0.0) + fwd
        return total

    def cost(n: str) -> NodeCost:
        return pricer.node_cost(tg, tg.nodes[n], spaces[n], strat[n]) if spaces[n].kind == "op" else NodeCost(0, 0, 0)

    def input_bytes(n: str, k: int) -> int:
        ti = spaces[n].inputs[k]
        return pricer.input_itemsize(tg, ti) * math.prod(local_shape(ti.shape, strat[n].inputs[k], mesh))

    return {region: price_region(region_recompute(tg, region, members[region], mode, shared),
                                 lambda n: cost(n).fwd_s, lambda n: cost(n).saved_bytes, input_bytes, rerun_s)
            for region, mode in sorted(decision.items()) if region in members}


def _first_uses(tg: TracedGraph, spaces: dict, strat: dict, mesh: MeshSpec) -> frozenset[tuple[str, int]]:
    """(consumer, input index) of every use that is the first of its (value, target layout) at the strategies
    `strat`, in graph order: where the program emits the redistribution (`shared_uses.FirstUses`)."""
    uses, out = FirstUses(tg), set()
    for name, space in spaces.items():
        for k, ti in enumerate(space.inputs):
            if uses.first(ti.producer, name, strat[name].inputs[k], grad_axes(strat[name], k, mesh)):
                out.add((name, k))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why node `node` got its strategy: total objective (seconds) and memory of the plan with the node's
    group switched to each alternative, other groups fixed. `alternatives` is sorted by cost; an alternative the
    problem excludes (a forced axis role, or no redistribution between it and its neighbours' chosen layouts)
    costs `math.inf` and is printed as excluded, not as `inf ms`.

    Each alternative is (strategy, objective_s, total_bytes, fits, peak_bytes, at): `total_bytes` the sum of kinds
    (the plan's "total"), `peak_bytes` the step's priced peak replayed on the ranks' local storages (the plan's
    "peak", `memory_fit.replayed_peak`), `fits` whether that PEAK is within the budget less the reserve: what the
    budget binds on since round 26 (before round 27 `fits` compared the sum of kinds, so a plan returned under its
    budget printed its own chosen row "[over memory budget]"), and `at` the moment of the step whose ILP row is the
    largest (`problem.binding_row`, round 27) where the budget binds and no region recomputes, else ""."""

    node: str
    chosen: str
    chosen_s: float
    alternatives: tuple[tuple[str, float, int, bool, int, str], ...]

    def __str__(self) -> str:
        lines = [f"{self.node}: chosen {self.chosen} (objective {self.chosen_s * 1e3:.4f} ms)"]
        for s, c, m, ok, peak, at in self.alternatives[:8]:
            if math.isinf(c):
                lines.append(f"  {s:40s} excluded (a forced axis role, or no redistribution to the neighbours' "
                             "chosen layouts)")
                continue
            delta = (c - self.chosen_s) * 1e3
            lines.append(f"  {s:40s} {c * 1e3:.4f} ms ({delta:+.4f} ms), peak {format_bytes(peak)} "
                         f"(total {format_bytes(m)})" + (f" (largest row: {at})" if at else "")
                         + ("" if ok else "  [over memory budget]"))
        return "\n".join(lines)


def explain(traced: TracedGraph, plan_: Plan, node: str, *, cluster=None, topology=None,
            config: PlanConfig | None = None) -> Explanation:
    """Compare the chosen strategy of `node` with every alternative, the rest of the plan fixed: its layouts and
    its recomputation (`Plan.recompute`: each alternative is priced with the same regions recomputing, as the
    solver priced the plan, so the chosen row's objective is `plan_.solver.objective_s`; before round 22 the
    recomputation was left out and a plan that recomputes showed every row, the chosen one included, over the
    memory budget).

    Rebuilds the problem (deterministic) with the plan's mesh and, unless `config` is given, the config the
    plan records (budget, batch dims, data axes, axis roles...); pass the same cluster as to `plan`.
    Raises UnknownNodeError (a KeyError) for an unknown node, naming the closest node names.
    """
    config = config or PlanConfig.from_record(plan_.config)
    problem, pricer = build(traced, plan_.mesh, cluster=cluster, topology=topology, config=config)
    if node not in problem.group_of:
        raise UnknownNodeError(node, "the plan", problem.group_of)
    choice = []
    for members in problem.groups:
        n = members[0]
        want = plan_.nodes[n]
        strategies = problem.spaces[n].strategies
        choice.append(next(i for i, s in enumerate(strategies) if _fmt(s) == (want.inputs, want.output)))
    g = problem.group_of[node]
    fmt = lambda s: f"{' '.join(str(L) for L in s.inputs)} -> {s.output}"
    counts = decision_counts(problem, plan_.recompute)  # the plan's recomputation, held fixed (round 22)

    def row_at(c: tuple[int, ...]) -> str:  # the moment of the largest ILP row (round 27), "" for the sum row
        return binding_row(problem, c)[1] if problem.cut_rows and not counts else ""

    def priced(c: tuple[int, ...]) -> tuple[float, int, str]:  # (objective s, memory bytes, row) as the solver priced
        extra_s, delta_bytes = recompute_cost(problem, c, counts)
        return objective_s(problem, c) + extra_s, int(memory_bytes(problem, c) + delta_bytes), row_at(c)

    def peak_bytes(c: tuple[int, ...]) -> int:  # the step peak the budget binds on, as `plan` replays its pick
        sol = Solution(c, 0.0, "explain", True, None, 0.0, 0, 0, 0, "", tuple(sorted(plan_.recompute.items())))
        spans: list = []
        held = local_saved_bytes(traced, {n: layout_of(problem, n, c) for n in problem.spaces}, problem.spaces,
                                 pricer, spans)
        return replayed_peak(traced, problem, pricer, sol, held, spans).peak_bytes
    alts = []
    for i, s in enumerate(problem.spaces[node].strategies):
        c = list(choice)
        c[g] = i
        seconds, mem, at = priced(tuple(c))
        peak = 0 if math.isinf(seconds) else peak_bytes(tuple(c))
        alts.append((fmt(s), seconds, mem, not math.isinf(seconds) and peak <= problem.budget_bytes, peak, at))
    chosen = fmt(problem.spaces[node].strategies[choice[g]])
    chosen_s = alts[choice[g]][1]  # the loop priced the plan's own choice too (alts in strategy order here)
    return Explanation(node, chosen, chosen_s, tuple(sorted(alts, key=lambda a: (a[1], a[0]))))


def _fmt(s) -> tuple:
    return tuple(str(L) for L in s.inputs), None if s.output is None else str(s.output)

