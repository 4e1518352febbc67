"""Cut a `TracedGraph` at repeated-block boundaries and price each piece with the intra-stage ILP.

Segments: 0 = "pre" (every op before the first block: embeddings, masks), 1..L = the L instances of the
largest repeated-block group (by ops), or the L layers of the layer stack of a model whose layers differ
(`tracer.blocks.layer_stack`: each layer priced by its own ops), L + 1 = "post" (final norm, head, loss). An op between two blocks that
belongs to no block joins the block before it. A parameter belongs to every segment that uses it (GPT-2's
tied `wte` / `lm_head` is in pre and post, so the first and last stages both hold it and exchange its
gradient).

Pricing (`price_segments`): the ILP of `parallelizer.plan` is solved ONCE per tensor-parallel size tp, on
the whole traced graph on the 1-D mesh ("tp",) inside one node (the data-parallel axis is priced by the
outer search, the pipeline axis by the schedule). With `cluster_blocks` the ILP's variables are one block's,
so its size does not grow with depth; the memory row is dropped (huge budget) because stage memory depends
on the partition and the schedule and is enforced by the stage partition DP instead. The chosen
strategies are then priced node by node with the planner's own `Pricer` and the `Plan`'s edge steps, and
summed per segment: every instance of a block gets the same numbers, so identical stages share one solve.

Batch scaling: the graph is traced at a reference batch b0 (its first input's dim 0; trace with 1 sample).
For a microbatch of `mb` samples, compute, activation collectives, saved activations and boundary
transfers are multiplied by mb / b0 (exact for FLOPs and bytes, which are linear in batch; conservative for
the batch-independent weight reads and kernel launches folded into the roofline time). Collectives on
parameters (all-gather of sharded weights, gradient reduction over tp) do not depend on batch and are kept
per microbatch. The ILP's choice at b0 is assumed to stay optimal at mb.

Recomputation: for each block segment and each mode of `recompute.RECOMPUTE_MODES`, the extra forward
seconds (run again during backward: part of the input-gradient time B; the recomputed compute and the
forward collectives the region runs again, `RegionPrice.extra_s`) and the change of saved bytes,
both batch-linear, from `recompute.price_region` at the ILP's strategies (`SegmentPrices.rc_extra_lin`,
`rc_act_delta`). A block the user checkpointed (`traced.user_recompute`) takes its forced mode's numbers
in every mode's row, so any choice the search makes keeps it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from cost_model.topology import Cluster, MeshTopology

from ..config import PlanConfig
from ..core.layout import Layout
from ..core.mesh import MeshSpec
from ..core.redistribute import grad_partial_axes
from ..tracer import BlockGroup, Role, TracedGraph
from ..tracer.blocks import largest_group, layer_stack, pipeline_unit
from ..tracer.graph import carries_grad
from .api import build, recompute_prices, to_plan
from .costs import GraphTables, Pricer
from .ilp import solve, solve_lean
from .local_storage import local_saved_bytes
from .plan import Plan
from .problem import layout_of
from .recompute import RECOMPUTE_MODES, forced_regions, regions
from .shared_uses import FirstUses

COMM_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
_NO_BUDGET = 10 ** 18  # bytes: the intra-stage ILP runs without its memory row (module docstring)


@dataclass(frozen=True)
class Segments:
    """The graph cut into L + 2 segments (module docstring).

    Attributes:
        group: the repeated-block group used as pipeline unit (e.g. "transformer.h.*").
        num_blocks: L.
        nodes: node names per segment (placeholders of parameters/inputs in every segment that reads them).
        owner: segment of each call_function node.
        cut_fwd_bytes / cut_bwd_bytes: at trace batch, bytes crossing the cut after segment k (k = 0..L)
            forward (activations) and backward (their gradients, only for values that depend on parameters).
        trace_batch: b0, samples in the traced inputs.
        cut_values: the names of the values crossing each cut (k = 0..L), in graph order (what
            `planner.boundary` prices a codec on).
        block_kinds: with a layer stack (layers of several kinds), per block the repeated-block group it is a
            member of (else its own name): stages holding other kinds are priced and summarised apart
            (`pipeline.StageSpec.kind`); empty for identical blocks.
    """

    group: str
    num_blocks: int
    nodes: tuple[tuple[str, ...], ...]
    owner: dict[str, int]
    cut_fwd_bytes: tuple[int, ...]
    cut_bwd_bytes: tuple[int, ...]
    trace_batch: int
    cut_values: tuple[tuple[str, ...], ...] = ()
    block_kinds: tuple[str, ...] = ()


def segment_graph(traced: TracedGraph, nbytes=None) -> Segments:
    """Cut `traced` at the boundaries of its largest repeated-block group. `nbytes(name) -> int`: the bytes a
    boundary sends of a value (`costs.Pricer.value_nbytes`: in its dtype as run, bf16 for a linear's output under
    the bf16 autocast recipe; round 26, before: as traced, 2x); None: as traced.

    Raises:
        ValueError: the graph has no repeated blocks (remedy in the text), or no batched input.
    """
    stack = layer_stack(traced)  # also the layers of a model without repeated blocks (no two alike)
    if not traced.blocks and stack is None:
        raise ValueError("pipeline planning cuts the model at repeated blocks, and the traced graph has none "
                         "(traced.blocks is empty). Remedy: use parallelizer.plan (no pipeline axis), or a model "
                         "whose layers are instances of one module class with equal shapes.")
    group: BlockGroup = stack or largest_group(traced)
    L = group.count
    in_block = {n: i + 1 for i, member in enumerate(group.nodes) for n in member}
    order = list(traced.nodes)
    start, end = order.index(group.nodes[0][0]), order.index(group.nodes[-1][-1])
    owner: dict[str, int] = {}
    current = 0
    for pos, name in enumerate(order):
        info = traced.nodes[name]
        if info.op != "call_function":
            continue
        if name in in_block:
            current = in_block[name]
        owner[name] = in_block.get(name, 0 if pos < start else (L + 1 if pos > end else current))
    out_node = next(n for n in reversed(order) if traced.nodes[n].op == "output")
    owner_of = lambda n: owner.get(n, L + 1 if n == out_node else None)
    members: list[list[str]] = [[] for _ in range(L + 2)]
    for name in order:
        info = traced.nodes[name]
        if info.op == "placeholder":
            for seg in sorted({owner_of(u.name) for u in info.node.users} - {None}):
                members[seg].append(name)
        elif name in owner:
            members[owner[name]].append(name)
    members[L + 1].append(out_node)
    fwd, bwd, crossing = [0] * (L + 1), [0] * (L + 1), [[] for _ in range(L + 1)]
    depends = depends_on_parameters(traced)
    nbytes = nbytes or (lambda n: traced.nodes[n].nbytes)
    for name, seg in owner.items():
        info = traced.nodes[name]
        last = max((owner_of(u.name) or seg for u in info.node.users), default=seg)
        floating = any(carries_grad(t.dtype) for t in info.outputs)
        size = nbytes(name) if last > seg else 0  # a gradient has its value's dtype (autograd's contract)
        for k in range(seg, last):
            fwd[k] += size
            bwd[k] += size if floating and name in depends else 0
            crossing[k].append(name)
    kind_of = {m: g.name for g in traced.blocks for m in g.members}
    kinds = () if group in traced.blocks else tuple(kind_of.get(m, m) for m in group.members)
    return Segments(group.name, L, tuple(tuple(m) for m in members), owner, tuple(fwd), tuple(bwd),
                    _trace_batch(traced), tuple(tuple(c) for c in crossing), kinds)


def depends_on_parameters(traced: TracedGraph) -> set[str]:
    """Nodes with a parameter among their ancestors (their outputs carry gradients; the values a boundary
    codec compresses, `planner.boundary`, `runtime.pipeline.boundary_codecs`)."""
    dep: set[str] = set()
    for name, info in traced.nodes.items():
        if info.role == Role.PARAMETER or any(a.name in dep for a in info.node.all_input_nodes):
            dep.add(name)
    return dep


def _trace_batch(traced: TracedGraph) -> int:
    for name in traced.input_names:
        outs = traced.nodes[name].outputs
        if outs and outs[0].shape:
            return int(outs[0].shape[0])
    raise ValueError("the traced graph has no input with a batch dim (dim 0); trace with batched inputs")


@dataclass(frozen=True)
class SegmentPrices:
    """Per-segment prices (arrays of L + 2 entries, index = segment) on tp devices, per microbatch of the
    trace batch b0 (`*_lin`: scale by mb / b0) or per microbatch regardless of batch (`*_fixed`).

    Seconds: fwd (forward compute + forward collectives), bwd (backward), wgrad (the part of bwd that
    computes weight gradients: half the backward of ops reading a parameter, plus gradient collectives of
    parameters; Qi et al. 2023's W). Bytes per device: act (saved for backward, per microbatch of b0),
    params / grads / optimizer (training state of the stored shards, ZeRO Sec. 3.1 bytes per parameter),
    comm_lin_s / comm_fixed_s[kind] (seconds per collective kind, batch-linear at b0 / per microbatch), and
    shared_grad_bytes (gradients of parameters used in several segments, e.g. a tied embedding).
    rc_extra_lin[mode] / rc_act_delta[mode]: per segment, at b0, the extra seconds (compute and collectives) and the change of
    saved bytes of recomputing its block in `mode` (0 for pre / post and for "none"; module docstring).
    grad_shapes: per segment, (local shape, bytes per gradient element) of each trainable parameter it holds
    (what a gradient codec sees, `cost_model.compression`).
    """

    tp: int
    fwd_lin: np.ndarray
    bwd_lin: np.ndarray
    wgrad_lin: np.ndarray
    fwd_fixed: np.ndarray
    bwd_fixed: np.ndarray
    wgrad_fixed: np.ndarray
    act_bytes: np.ndarray
    params_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    comm_lin_s: dict[str, np.ndarray]
    comm_fixed_s: dict[str, np.ndarray]
    shared_grad_bytes: int
    plan: Plan = dataclasses.field(repr=False, compare=False)
    rc_extra_lin: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    rc_act_delta: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    grad_shapes: tuple[tuple[tuple[tuple[int, ...], int], ...], ...] = ()

    def time_s(self, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(F, B, W) seconds per segment for a microbatch of scale * b0 samples."""
        f = self.fwd_lin * scale + self.fwd_fixed
        w = self.wgrad_lin * scale + self.wgrad_fixed
        return f, self.bwd_lin * scale + self.bwd_fixed - w, w


def sent_nbytes(traced: TracedGraph, cluster: Cluster, config: PlanConfig, tables: GraphTables):
    """`nbytes(name)` for `segment_graph`: the bytes of a value as the stages run and send it, by the planner's one
    rule for dtypes as run (`costs.Pricer.value_nbytes`, on one device of `cluster` under `config`'s precision;
    `tables` shares the graph's autocast facts with the search's per-tp solves)."""
    mesh = MeshSpec(("tp",), (1,))
    pricer = Pricer(MeshTopology(tp_cluster(cluster, 1), (1,), ("tp",)), mesh, config, traced, tables)
    return lambda name: pricer.value_nbytes(traced, name)


def tp_cluster(cluster: Cluster, tp: int) -> Cluster:
    """One node of `cluster` with `tp` devices: the intra-stage mesh ("tp",) lives inside a node."""
    return dataclasses.replace(cluster, num_nodes=1, devices_per_node=tp)


def price_segments(traced: TracedGraph, segments: Segments, tp: int, cluster: Cluster,
                   config: PlanConfig, tables: GraphTables | None = None, lean: bool = False,
                   built: dict | None = None) -> SegmentPrices:
    """Solve the intra-stage ILP on mesh ("tp",) and price every segment (module docstring). `tables`: the
    graph's facts shared by the solves for several tp (`costs.GraphTables`); None: computed here. `lean`: the
    memory-lean layout (`ilp.solve_lean`: the fastest within 1% of the least activation bytes) instead of the
    time-optimal one, for the stages where memory binds (`planner.search`). `built`: tp -> (problem, pricer)
    kept by the caller, so that the two layouts of one tp share one ILP build.

    Raises:
        InfeasiblePlanError: from the ILP (no strategy reachable); ValueError: tp does not fit a node.
    """
    if tp > cluster.devices_per_node or cluster.devices_per_node % tp:
        raise ValueError(f"tp={tp} must divide devices_per_node={cluster.devices_per_node} (tp stays in a node)")
    mesh = MeshSpec(("tp",), (tp,))
    config = dataclasses.replace(config, memory_budget_bytes=_NO_BUDGET)
    topo = MeshTopology(tp_cluster(cluster, tp), (tp,), ("tp",))
    built = {} if built is None else built
    if tp not in built:
        built[tp] = build(traced, mesh, topology=topo, config=config, pricer=Pricer(topo, mesh, config, traced, tables))
    problem, pricer = built[tp]
    solution = (solve_lean if lean else solve)(problem, config)
    spaces = problem.spaces
    chosen = {name: layout_of(problem, name, solution.choice) for name in spaces}
    held = local_saved_bytes(traced, chosen, spaces, pricer)  # storages as the ranks have them (`local_storage`)
    plan = to_plan(traced, problem, pricer, solution, config, held)
    n = segments.num_blocks + 2
    z = lambda: np.zeros(n)
    fl, bl, wl, ff, bf, wf, act = z(), z(), z(), z(), z(), z(), z()
    comm_lin, comm_fixed = {k: z() for k in COMM_KINDS}, {k: z() for k in COMM_KINDS}
    for name, space in spaces.items():
        if space.kind != "op":
            continue
        seg = segments.owner.get(name, n - 1)
        c = pricer.node_cost(traced, traced.nodes[name], space, chosen[name])
        fl[seg] += c.fwd_s
        bl[seg] += c.bwd_s
        act[seg] += held.get(name, 0)
        if any(spaces[t.producer].kind == "param" for t in space.inputs):
            wl[seg] += c.bwd_s / 2  # grad-weight matmul: half of a linear's 2x-forward backward
    uses = FirstUses(traced)  # one copy per (value, target layout): `shared_uses`
    for edge in plan.edges:
        out = None if edge.dst == "output" else plan.nodes[edge.dst].output
        axes = () if out is None else grad_partial_axes(Layout.parse(edge.dst_layout), Layout.parse(out), plan.mesh)
        if not uses.first(edge.src, edge.dst, edge.dst_layout, axes):
            continue
        seg = segments.owner.get(edge.dst, n - 1)
        is_param = spaces[edge.src].kind == "param"
        param_itemsize = pricer.value_dtype(traced, edge.src, traced.nodes[edge.src].outputs[0].dtype).itemsize \
            if is_param else None
        for step, (f, b) in zip(edge.steps, pricer.edge_step_times(edge.steps, param_itemsize,
                                                                    pricer.regathers(traced, edge.src))):
            (ff if is_param else fl)[seg] += f
            (bf if is_param else bl)[seg] += b
            if is_param:
                wf[seg] += b
            for kind, secs in ((step.fwd_collective, f), (step.bwd_collective, b)):
                if kind:
                    (comm_fixed if is_param else comm_lin)[kind][seg] += secs
    state = [z(), z(), z()]
    shared = 0
    grad_shapes: list[list[tuple[tuple[int, ...], int]]] = [[] for _ in range(n)]
    for p in traced.parameters.values():
        local = math.prod(plan.params[p.fqn].local_shape)
        parts = (p.nbytes * local // max(1, p.numel), 0, 0) if p.is_buffer else \
            pricer.param_state_bytes(local, p.requires_grad)
        segs = {segments.owner[u] for u in p.uses if u in segments.owner} or {0}
        for seg in segs:  # a parameter used in several segments is held by each (module docstring)
            for k in range(3):
                state[k][seg] += parts[k]
        if len(segs) > 1 and not p.is_buffer:
            shared += parts[1]
        if parts[1] and local:
            for seg in segs:
                grad_shapes[seg].append((tuple(plan.params[p.fqn].local_shape), parts[1] // local))
    extra, delta = _recompute_prices(traced, segments, problem, pricer, solution.choice)
    return SegmentPrices(tp, fl, bl, wl, ff, bf, wf, act, *state, comm_lin, comm_fixed, shared, plan, extra, delta,
                         tuple(tuple(g) for g in grad_shapes))


def _recompute_prices(traced: TracedGraph, segments: Segments, problem, pricer, choice
                      ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`SegmentPrices.rc_extra_lin` and `rc_act_delta` (module docstring): `api.recompute_prices` of every
    block of the pipeline unit in every mode, at the strategies of `choice` (priced once per distinct
    (strategies, mode): the instances of a clustered block share them)."""
    n = segments.num_blocks + 2
    extra = {m: np.zeros(n) for m in RECOMPUTE_MODES}
    delta = {m: np.zeros(n) for m in RECOMPUTE_MODES}
    group = pipeline_unit(traced) if segments.group not in {g.name for g in traced.blocks} else \
        next(g for g in traced.blocks if g.name == segments.group)
    forced = forced_regions(traced)
    strat = {name: layout_of(problem, name, choice) for name in problem.spaces}
    seen: dict[tuple, tuple[float, float]] = {}
    blocks = regions(traced)
    for seg, (region, nodes) in enumerate(zip(group.members, group.nodes), start=1):
        if region not in blocks:  # a layer of a stack that is no repeated block: priced without recomputation
            continue
        key = tuple(strat.get(name) for name in nodes)
        for mode in RECOMPUTE_MODES:
            m = forced.get(region, mode)
            if m == "none":
                continue
            if (key, m) not in seen:
                rp = recompute_prices(traced, problem, pricer, strat, {region: m})[region]
                seen[(key, m)] = (rp.extra_s, rp.saved_delta_bytes)  # compute and collectives run again
            extra[mode][seg], delta[mode][seg] = seen[(key, m)]
    return extra, delta
