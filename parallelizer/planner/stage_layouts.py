"""Per-stage layouts of a pipeline plan: the intra-stage ILP solved once per DISTINCT stage.

A pipeline cut (`runtime.pipeline.cut_stages`) gives each stage its own graph (`runtime.pipeline.stage_graph`:
its parameters, the values it receives as inputs, its ops, what it sends). Stages whose graphs have the same
structure (the same op, output shapes and role at every position: the same block classes and count and the
same boundary ops; typically every middle stage of an even cut, while the first holds the embedding and the
last the head and loss) share one solve; the others get their own. The solve is `planner.plan` on the stage
graph with the stage's repeated blocks as a block group (so `cluster_blocks` gives its members one strategy
per position) on the intra-stage (dp, tp) mesh; a later stage's solve keeps a parameter already placed by an
earlier stage (a tied embedding / lm_head) in that stored layout (`pinned`), so the copies the stages hold
have the same shards and their gradients can be summed (`runtime.pipeline.sync_shared_grads`). The solves share
one `Pricer` (its edge and op prices are keyed by layouts, shapes and dtypes, so a later stage's blocks reuse
the first stage's prices; `Pricer.check_reusable`).

The result is one whole-graph `Plan` whose every node has the strategy of its own stage's solve (stages own
disjoint nodes), with `layouts[k]` = the index of the distinct solve stage k uses. An edge crossing a stage
boundary goes from the producer's layout (its stage's) to the consumer's (its stage's): the runtime sends the
value in the producer's layout and the receiving stage's program redistributes it (`runtime.pipeline.
stage_spec`); the plan lists that edge's steps, derived as every edge's (`planner.plan.derive_edge`).

Stages are solved in order, and a stage's received values are inputs fixed to the layout their producer's
stage chose, with their gradient sent back (`planner.api.build`'s `received`): the re-layout of a received
value at a boundary, forward and backward, is in the receiving stage's objective. Two stages share a solve
only when their graphs have the same structure AND their values arrive in the same layouts. Caveats: the
sending stage's solve does not see what its choice costs the next stage (stages are solved greedily in
order, not jointly), and the cost breakdown sums the stages' solves (one microbatch, every stage once), as
the whole-graph ILP did before.

Repeated blocks in different distinct solves: a later solve whose blocks took other strategies than the same block
positions' first occurrence is solved again with them fixed to it, and that plan is kept on a tie (`first_occurrence`:
DESIGN's tie order, less memory, then fewer collectives, then the block's first occurrence), so equal-cost blocks
read alike across stages; a block that is faster or leaner otherwise (e.g. the one feeding the head) keeps its own.
"""
from __future__ import annotations

import dataclasses

from cost_model.topology import MeshTopology

from ..config import PlanConfig
from ..core.mesh import MeshSpec
from ..errors import InfeasiblePlanError, PipelineError
from ..tracer.blocks import pipeline_unit
from ..tracer.graph import BlockGroup, TracedGraph
from .costs import Pricer, traced_in_low_precision
from .plan import CostBreakdown, NodePlan, Plan, SolverReport, empty_comm
from .recompute import regions, runnable


def stage_signature(sg: TracedGraph) -> tuple:
    """What decides a stage's solve: per node in order, its op, output shapes and dtypes, and role."""
    return tuple((info.op_name, tuple((tuple(t.shape), str(t.dtype)) for t in info.outputs), info.role.name)
                 for info in sg.nodes.values())


def stage_graphs(traced: TracedGraph, cut) -> list[TracedGraph]:
    """Each stage's graph (`runtime.pipeline.stage_graph`) with its members of the pipeline unit's block group
    (of each repeated-block group, for a layer stack of several kinds) as a block group of its own (when it
    holds two or more), so the stage's solve clusters them as the whole graph's did,
    each parameter's uses cut to the stage's (a tied embedding's other use is another stage's), and each
    received value a placeholder outside any block (the runtime's stage graph keeps its producer's facts)."""
    from ..runtime.pipeline import stage_graph

    group = pipeline_unit(traced)
    # identical layers: the unit is their group; layers of several kinds (a stack): each repeated-block group's
    # members the stage holds, so each kind is clustered apart
    groups = [group] if group in traced.blocks else traced.blocks
    out = []
    for k in range(cut.num_stages):
        sg = stage_graph(traced, cut, k)
        sg.parameters = {f: dataclasses.replace(p, uses=type(p.uses)(u for u in p.uses if u in sg.nodes))
                         for f, p in sg.parameters.items()}
        for name in cut.inputs[k]:
            sg.nodes[name] = dataclasses.replace(sg.nodes[name], op="placeholder", target=None, block=None,
                                                 block_group=None, block_index=None, position=None, checkpoint=None)
        kept = []
        for g in groups:
            held = [(m, nodes) for m, nodes in zip(g.members, g.nodes) if cut.stage_of.get(nodes[0]) == k]
            if len(held) >= 2:
                kept.append(BlockGroup(g.name, g.module_type, tuple(m for m, _ in held), tuple(n for _, n in held)))
        if kept:
            sg = dataclasses.replace(sg, blocks=kept)
        out.append(sg)
    return out


def plan_stages(traced: TracedGraph, cut, mesh: MeshSpec, cluster, config: PlanConfig,
                stage_configs: dict[int, PlanConfig] | None = None, lean: tuple[bool, ...] = ()
                ) -> tuple[Plan, tuple[int, ...]]:
    """(whole-graph Plan, layout index per stage) of the cut (module docstring).

    Args:
        traced: the whole graph of one microbatch (with repeated blocks); cut: `runtime.pipeline.StageCut`.
        mesh: the intra-stage (dp, tp) mesh; cluster: a `Cluster` of exactly its devices.
        config: the intra-stage `PlanConfig` (the caller's roles, budget and reserve).
        stage_configs: stage -> a config of its own (a stage with one is solved on its own, never shared):
            to force a layout on one stage, e.g. in tests.
        lean: per stage, whether it takes the memory-lean layout (`ilp.solve_lean`), as the pipeline search
            chose where memory binds (`StageSpec.lean`); default none. Stages share a solve only with stages
            of the same choice.
    Returns:
        The Plan (nodes, params, edges of the whole graph; cost = sum over stages of their solve's; solver =
        the distinct solves together) and `layouts`: stage k uses distinct solve layouts[k]; layouts are
        numbered in order of first use, so stage 0 uses layout 0.
    Raises:
        PipelineError: a parameter used by several stages could not keep one stored layout.
        InfeasiblePlanError / ValueError: from the stage solves (`planner.plan`).
    """
    from .api import plan as solve_plan, resolve_cluster

    stage_configs = stage_configs or {}
    graphs = stage_graphs(traced, cut)
    # one Pricer for the solves under `config` (per graph precision, the only fact of a graph a Pricer's prices
    # depend on: `Pricer.check_reusable`): the stages' blocks have the same shapes, so the first solve's edge
    # and op prices (cached by layouts, shapes and dtypes) serve the later ones
    topo = MeshTopology(resolve_cluster(cluster, mesh.world_size)[0], mesh.shape, mesh.axis_names)
    pricers: dict[bool, Pricer] = {}

    def shared(sg: TracedGraph) -> Pricer:
        low = traced_in_low_precision(sg)
        return pricers[low] if low in pricers else pricers.setdefault(low, Pricer(topo, mesh, config, sg))
    solved: list[tuple[TracedGraph, Plan]] = []  # per distinct layout: its stage graph and solve
    keys: dict[tuple, int] = {}
    layouts, strategy, stored, fallbacks = [], {}, {}, []
    first: dict[tuple, str] = {}  # (block group, position in the block) -> strategy of its first occurrence
    for k, sg in enumerate(graphs):
        # values from earlier stages arrive in their producer's layout (stages are solved in order)
        received = {n: strategy[n].output for n in sg.nodes if n in cut.inputs[k] and n not in traced.input_names}
        arrival = tuple(received[n] for n in sg.nodes if n in received)  # by position: stages share solves
        lean_k = k < len(lean) and lean[k]
        key = (stage_signature(sg), arrival, k if k in stage_configs else None, lean_k)
        if key not in keys:
            pinned = {ph: stored[p.fqn] for p in sg.parameters.values() if p.fqn in stored for ph in p.placeholders}
            keys[key] = len(solved)

            def solve_k(fixed=None, sg=sg, k=k, pinned=pinned, received=received, lean_k=lean_k):
                return solve_plan(sg, mesh, cluster=cluster, config=stage_configs.get(k, config), pinned=pinned,
                                  received=received, lean=lean_k, pricer=None if k in stage_configs else shared(sg),
                                  fixed=fixed)
            solved.append((sg, first_occurrence(sg, solve_k(), first, solve_k)))
        layouts.append(keys[key])
        rep_graph, rep = solved[keys[key]]
        names = dict(zip(rep_graph.nodes, sg.nodes))  # the representative's node -> this stage's, by position
        for name, node in rep.nodes.items():  # the strategy of each block position's first occurrence
            if (pos := block_position(sg, names.get(name))) is not None:
                first.setdefault(pos, node.strategy)
        names["output"] = None  # the stage's sent values: the whole graph's output node is not a stage's
        fallbacks += [dataclasses.replace(f, node=names[f.node]) for f in rep.fallbacks if names.get(f.node)]
        for name, node in rep.nodes.items():
            mine = names[name]
            if mine is None:
                continue
            param = sg.param_of_placeholder(mine)
            if param is not None and not param.is_buffer:
                if stored.setdefault(param.fqn, node.output) != node.output:
                    raise PipelineError(f"parameter {param.fqn} is stored as {stored[param.fqn]} by an earlier stage "
                                        f"and as {node.output} by stage {k}; the copies stages hold must agree. "
                                        "Remedy: solve the stages with the same axis roles")
            if mine in cut.inputs[k] and mine not in traced.input_names:
                continue  # a received value: laid out by its producer's stage
            strategy.setdefault(mine, node)
    return _merge(traced, mesh, config, strategy, [p for _, p in solved], layouts, fallbacks), tuple(layouts)


def block_position(sg: TracedGraph, name: str | None) -> tuple | None:
    """(block group, position) of node `name` of a stage graph when it sits in a repeated block (a value the stage
    receives is a placeholder outside any block, `stage_graphs`); for a parameter placeholder of one block,
    (block group, its FQN inside the block); else None."""
    info = sg.nodes.get(name) if name else None
    if info is None:
        return None
    if info.block_group is not None and info.position is not None:
        return info.block_group, info.position
    param = sg.param_of_placeholder(name) if info.op == "placeholder" else None
    if param is not None and param.block_group is not None and param.block and param.fqn.startswith(param.block + "."):
        return param.block_group, param.fqn[len(param.block) + 1:]
    return None


def first_occurrence(sg: TracedGraph, free: Plan, first: dict[tuple, str], solve) -> Plan:
    """The last tie-break of a stage's solve (DESIGN: ties break toward less memory, then fewer collectives, then
    the strategy of the block's first occurrence): when its repeated blocks took other strategies than the same
    positions of an earlier distinct solve (`first`), solve again with every such block node fixed to its first
    occurrence's strategy (`solve(fixed)`), and keep that plan when it is a tie: its objective within
    `ilp.TIE_RESOLUTION_US` of the free solve's (the band the ILP's own tie-break orders) and memory at most
    `ilp.MEMORY_TIE_QUANTUM_BYTES` more. So equal-cost stages read like a hand-written config (round 19: 17 of
    80 Llama-3-70B layers took another q/k/v strategy than the rest). Otherwise the free solve: its blocks
    differ for a reason (a faster or leaner plan), which the plan's per-position "same in" column shows."""
    from .ilp import MEMORY_TIE_QUANTUM_BYTES, TIE_RESOLUTION_US

    want = {name: first[pos] for name in sg.nodes if name in free.nodes
            and (pos := block_position(sg, name)) is not None and pos in first}
    if all(free.nodes[name].strategy == s for name, s in want.items()):
        return free
    try:
        tied = solve(want)
    except InfeasiblePlanError:  # the first occurrence's strategies do not fit this stage's memory: not a tie
        return free
    same_time = tied.solver.objective_s <= free.solver.objective_s + TIE_RESOLUTION_US * 1e-6
    same_memory = tied.cost.memory_bytes["total"] <= free.cost.memory_bytes["total"] + MEMORY_TIE_QUANTUM_BYTES
    return tied if same_time and same_memory else free


def _merge(traced: TracedGraph, mesh: MeshSpec, config: PlanConfig, strategy: dict[str, NodePlan],
           solves: list[Plan], layouts: list[int], fallbacks: list) -> Plan:
    """The whole-graph Plan from each node's strategy (module docstring)."""
    from .api import param_plan, space_edge
    from .strategies import build_spaces

    spaces = build_spaces(traced, mesh, config)
    nodes: dict[str, NodePlan] = {}
    for name, space in spaces.items():
        if name in strategy:
            nodes[name] = strategy[name]
        else:  # the graph output, buffers and inputs no stage reads: as the space allows (replicated)
            s = space.strategies[0]
            nodes[name] = NodePlan(traced.nodes[name].op_name, tuple(str(L) for L in s.inputs),
                                   None if s.output is None else str(s.output))
    edges = tuple(space_edge(mesh, spaces, nodes, name, k) for name, space in spaces.items()
                  for k in range(len(space.inputs)))
    params = {p.fqn: param_plan(p, nodes[p.placeholders[0]].output, mesh) for p in traced.parameters.values()}
    comm = empty_comm()
    for i in layouts:
        for kind, s in solves[i].cost.comm_s.items():
            comm[kind] += s
    first = solves[0]
    cost = CostBreakdown(sum(solves[i].cost.compute_s for i in layouts), comm, dict(first.cost.memory_bytes))
    reports = [p.solver for p in solves]
    gaps = [r.gap for r in reports if r.gap is not None]
    times = [r.time_s for r in reports if r.time_s is not None]
    solver = SolverReport(first.solver.solver, first.solver.status if all(r.optimal for r in reports) else
                          next(r.status for r in reports if not r.optimal), all(r.optimal for r in reports),
                          max(gaps) if gaps else None, *(sum(getattr(r, f) for r in reports) for f in
                          ("num_variables", "num_binary", "num_constraints", "num_groups")),
                          sum(solves[i].solver.objective_s for i in layouts), sum(times) if times else None)
    model = {"num_nodes": len(traced.nodes), "num_parameters": traced.num_parameters,
             "inputs": {n: list(traced.nodes[n].outputs[0].shape) for n in traced.input_names
                        if traced.nodes[n].outputs}}
    blocks = regions(traced)
    forced = {} if config.recompute in ("auto", "none") else runnable(
        traced, {m: config.recompute for m in pipeline_unit(traced).members if m in blocks})
    return Plan(mesh, nodes, params, edges, cost, solver, tuple(fallbacks), model, dict(first.config),
                recompute=forced)
