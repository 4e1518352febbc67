"""Pricing (DESIGN.md: cost_model prices, the planner decides). The ONE place where steps, ops and training
state are turned into seconds and bytes with `cost_model`:

  * `step_time_s(step)`: forward and backward seconds of one redistribution `Step`
    (`cost_model.communication.step_collective_s` over the step's mesh axis, nccl-tests byte convention: the
    collective's time + the wait for the slowest rank);
  * `edge_time_s(...)`: sum over `edge_steps(...)` of forward + backward seconds (`edge_step_times`: a
    parameter's gradient all-reduce as a share of an overlapped bucket only where the runtime buckets it, the
    edge's first step, `rewriter.grad_sync.runtime_buckets`; a later one in full, as the synchronous per-parameter
    all-reduce it is emitted as);
  * `node_cost(...)`: forward + backward seconds of one op on its LOCAL shapes (`cost_model.compute.op_cost`)
    and the bytes it saves for backward (`cost_model.memory.saved_activation_bytes`), each saved storage
    charged to ONE op, its first saver in graph order (`saved_share`, `cost_model.memory.saved_tensor_owners`):
    every sum of `NodeCost.saved_bytes` over nodes (the ILP memory row `problem.build_problem`, the plan's
    `memory_bytes["activations"]` in `api.to_plan`, a pipeline segment's `act_bytes` in
    `segments.price_segments`) counts a tensor saved by several ops, or several views of one storage, once;
  * `param_state_bytes(...)`: params / grads / optimizer bytes of a stored shard (`cost_model.memory`).

Pricing policy, from the device kind (`DeviceSpec.kind`) and `PlanConfig.precision` (`resolve_precision`):
  * precision "bf16": a graph traced in fp32 is priced as it RUNS under the recipe `torch.autocast(bf16)`
    (`runtime.precision`; round 25, r25b): each op in the dtypes torch's autocast policy gives it on the device
    type the plan runs on (`planner.autocast_dtypes`, `Pricer.node_dtypes`: matmuls / linear in bf16 on bf16
    copies of their inputs, autocast's fp32 list (on CUDA layer_norm, softmax, pow, ...) in fp32, other ops by
    type promotion: a residual add of fp32 and bf16 is fp32), each edge in its producer's dtype as run
    (`value_dtype`; a parameter stays fp32 until autocast casts it at its use, after any gather), each autocast
    cast priced as a copy (read + write) and, for an activation, a storage its op saves of its own. Before round
    25 every fp32 tensor was priced as bf16 (2 B/element). A graph traced in bf16 is priced as traced (its
    explicit fp32 upcasts stay fp32). Gradients of parameters are reduced in fp32 (Megatron's recipe,
    `cost_model.memory` docstring): the backward of a parameter's edge moves grad bytes (`BYTES_PER_PARAM`) per
    element;
  * on a GPU, pointwise chains are priced fused as torch.compile would (`cost_model.fusion`) and SDPA as one
    flash-attention kernel (`cost_model.compute`); on a calibrated CPU ops are priced eager, one kernel each
    (the runtime runs the emitted program eagerly there).
"""
from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx

from cost_model.communication import HIERARCHICAL_KINDS, hierarchical_byte_ranges, step_collective_s
from cost_model.compute import op_cost
from cost_model.fusion import FusedIO, pointwise_fusion
from cost_model.hardware import DeviceSpec
from cost_model.memory import (SavedShare, backward_nodes, bytes_per_param, grad_arg_indices,
                               saved_activation_bytes, saved_tensor_owners)
from cost_model.topology import MeshTopology

from ..config import PlanConfig
from ..errors import PrecisionError, PrecisionWarning
from ..core.layout import Layout, Partial, Shard, local_shape
from ..core.mesh import MeshSpec
from ..core.redistribute import (WIDENED_FLOATS, ImpossibleRedistributionError, Step, edge_steps, sum_itemsize,
                                 widened_dtype)
from ..rewriter.grad_sync import DEFAULT_BUCKET_BYTES, runtime_buckets
from ..rewriter.reshard import regathered
from ..tracer import NodeInfo, TracedGraph
from .autocast_dtypes import AutocastOp, autocast_dtypes, cast_arg_positions, uniform_dtypes
from .precision import mfu_dtype, priced_dtype, resolve_precision, traced_in_low_precision  # noqa: F401 (re-exported)
from .strategies import NodeSpace, Strategy, received_with_grad
from .op_comm import op_collectives

aten = torch.ops.aten
_SHAPE_ARG_OPS = {aten.view, aten.reshape, aten._unsafe_view, aten.expand, aten.sum_to_size}  # size arg 1: `localize.SIZE_ARG`


@dataclass(frozen=True, slots=True)
class NodeCost:
    """Seconds of forward and backward of one op on local shapes, and bytes saved for backward. `note` says why
    the op's FLOPs could not be counted (priced by bytes only; `to_plan` records it in `Plan.fallbacks`)."""

    fwd_s: float
    bwd_s: float
    saved_bytes: int
    note: str | None = None

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s


@dataclass
class GraphTables:
    """The per-graph facts a `Pricer` reads, which depend on the graph alone (not on mesh, device or precision):
    each graph's pointwise fusion chains (`cost_model.fusion.pointwise_fusion`) and owners of saved storages
    (`cost_model.memory.saved_tensor_owners`), by id(graph) with the graph held (so an id is never reused while
    its entry lives). Pricers of several meshes for one graph (the search's one ILP per tp,
    `segments.price_segments`) pass one `GraphTables` so each graph is analysed once."""

    fusion: dict[int, tuple[TracedGraph, dict[str, FusedIO]]] = field(default_factory=dict)
    shares: dict[int, tuple[TracedGraph, dict[str, SavedShare], frozenset[str]]] = field(default_factory=dict)
    regathered: dict[int, tuple[TracedGraph, frozenset[str]]] = field(default_factory=dict)
    autocast: dict[tuple[int, str], tuple[TracedGraph, dict[str, AutocastOp]]] = field(default_factory=dict)


class Pricer:
    """Prices for one mesh on one topology and device (caches results; holds no decisions).

    Args:
        topo: mesh on its cluster (its axis names/shape must equal `mesh`'s).
        mesh: the abstract mesh.
        config: for optimizer / precision.
        traced: the graph to be priced (its parameter dtypes decide the default precision and whether fp32
            tensors are priced as bf16; `resolve_precision`). None: as a graph traced in fp32.
        tables: per-graph facts shared with other Pricers (`GraphTables`); None: this Pricer's own.
        autocast_device: the device type whose autocast policy a bf16 plan of an fp32 graph is priced in
            (`planner.autocast_dtypes`); None: "cuda" on a GPU device, else "cpu".
    Attributes:
        precision: the precision applied ("bf16" or "fp32").
        fuse_pointwise: pointwise chains priced fused (GPU devices).
    Raises:
        ValueError: topology and mesh disagree.
        PrecisionError: the precision cannot be priced on this device or graph (`resolve_precision`).
    """

    def __init__(self, topo: MeshTopology, mesh: MeshSpec, config: PlanConfig,
                 traced: TracedGraph | None = None, tables: GraphTables | None = None,
                 autocast_device: str | None = None) -> None:
        if tuple(topo.axis_names) != mesh.axis_names or tuple(topo.mesh_shape) != mesh.shape:
            raise ValueError(f"topology mesh {dict(zip(topo.axis_names, topo.mesh_shape))} differs from the plan "
                             f"mesh {mesh}; build MeshTopology(cluster, mesh.shape, mesh.axis_names)")
        self.topo, self.mesh, self.config = topo, mesh, config
        self.device: DeviceSpec = topo.cluster.device
        low = traced_in_low_precision(traced)
        self.precision = resolve_precision(config.precision, self.device, low)
        self.autocast = self.precision == "bf16" and not low  # price the fp32 graph as run under bf16 autocast
        # autocast's op lists differ by device type: the GPU presets run it on "cuda"
        self.autocast_device = autocast_device or ("cuda" if self.device.kind == "gpu" else "cpu")
        self.fuse_pointwise = self.device.kind == "gpu"
        self.tables = tables if tables is not None else GraphTables()
        # caches of pure functions of their keys on this Pricer's fixed mesh, topology and precision (planning a
        # 2-layer Llama on 4 devices asks ~9k distinct edges ~3x each and prices their steps ~70k times)
        self._edge: dict = {}
        self._steps: dict = {}  # key -> steps, or the ImpossibleRedistributionError they raise (raised again)
        self._fwd: dict = {}
        self._step_s: dict = {}
        self._node: dict = {}
        self.matrices: dict = {}  # edge cost matrices by (layouts, shape, ...): block instances share them

    def check_reusable(self, topo: MeshTopology, mesh: MeshSpec, config: PlanConfig,
                       traced: TracedGraph | None = None, tables: GraphTables | None = None) -> None:
        """Raise ValueError unless this Pricer prices exactly as `Pricer(topo, mesh, config, traced)` would: the
        same topology and mesh, the same config (optimizer, precision, ...) and the same resolved precision and
        autocast for `traced`. Then its caches (keyed by layouts, shapes, dtypes and per-graph facts only) hold
        for `traced` too (`planner.api.build`'s `pricer`)."""
        low = traced_in_low_precision(traced)
        precision = resolve_precision(config.precision, self.device, low)
        mine = (self.topo, self.mesh, self.config, self.precision, self.autocast)
        theirs = (topo, mesh, config, precision, precision == "bf16" and not low)
        if mine != theirs:
            diff = [n for n, a, b in zip(("topology", "mesh", "config", "precision", "autocast"), mine, theirs) if a != b]
            raise ValueError(f"this Pricer was built for other prices ({', '.join(diff)} differ: mesh {self.mesh} vs "
                             f"{mesh}). Remedy: pass pricer=None, or one built for this mesh, topology and config")

    # --- dtypes ------------------------------------------------------------------------------------
    def node_dtypes(self, tg: TracedGraph, name: str) -> AutocastOp | None:
        """The node's dtypes under the bf16 autocast recipe (`planner.autocast_dtypes`: what its op computes in,
        which inputs autocast copies, what it returns), cached per graph; None when the plan is not priced so (an
        fp32 plan, a graph traced in bf16) or for a node the graph does not have."""
        if not self.autocast:
            return None
        key = (id(tg), self.autocast_device)
        held = self.tables.autocast.get(key)
        if held is None or held[0] is not tg:
            whole = tg.cut_from  # a pipeline stage's graph receives its values in the whole graph's dtypes as run
            received = {n: self.value_dtype(whole, n, whole.nodes[n].outputs[0].dtype) for n in tg.input_names
                        if whole is not None and n in whole.nodes and whole.nodes[n].outputs}
            try:
                facts = autocast_dtypes(tg.graph_module, self.autocast_device, received=received)
            except PrecisionError as err:
                if self.config.precision is not None:  # asked for: the recipe runs, and cannot
                    raise
                warnings.warn(f"{err}. This plan's bf16 was defaulted (a GPU preset), which prices but does not run "
                              "it: priced with every fp32 tensor at bf16, as before round 25", PrecisionWarning,
                              stacklevel=2)
                facts = uniform_dtypes(tg.graph_module)
            held = self.tables.autocast[key] = (tg, facts)
        return held[1].get(name)

    def value_dtype(self, tg: TracedGraph, name: str, traced: torch.dtype) -> torch.dtype:
        """The dtype of node `name`'s (first) output as the program runs it: under the autocast recipe the dtype
        its op returns there (a linear's bf16, a residual add's fp32; a parameter stays as traced: autocast casts
        it at its use, after any gather), else `traced`."""
        op = self.node_dtypes(tg, name)
        return op.outputs[0] if op is not None and op.outputs and op.outputs[0] is not None else traced

    def value_nbytes(self, tg: TracedGraph, name: str) -> int:
        """Bytes of node `name`'s outputs as the program runs them (each in its dtype under the autocast recipe,
        `node_dtypes`, else as traced): what a pipeline boundary sends of the value (`segments.segment_graph`)."""
        info, op = tg.nodes[name], self.node_dtypes(tg, name)
        run = op.outputs if op is not None and len(op.outputs) == len(info.outputs) else (None,) * len(info.outputs)
        return sum(t.numel * (d or t.dtype).itemsize for t, d in zip(info.outputs, run))

    def input_dtype(self, tg: TracedGraph, ti) -> torch.dtype:
        """The dtype of a tensor input (`strategies.TensorInput`) as it crosses its edge: its producer's dtype as run
        (`value_dtype`); what `steps` / `edge_cost` / `edge_time_s` / `forward_s` take."""
        return self.value_dtype(tg, ti.producer, ti.dtype)

    def input_itemsize(self, tg: TracedGraph, ti) -> int:
        """Bytes per element of a tensor input as it crosses its edge (`input_dtype`)."""
        return self.input_dtype(tg, ti).itemsize

    # --- communication ------------------------------------------------------------------------------
    def step_time_s(self, step: Step, param_itemsize: int | None = None,
                    bucketed: bool = False, regather: bool = True,
                    compute_before_s: tuple[float | None, float | None, float | None] = (None, None, None)
                    ) -> tuple[float, float]:
        """(forward seconds, backward seconds) of one step; a `regather` step repeats its forward in backward
        where the program gathers the parameter again (`regather`: `Pricer.regathers` of the parameter, the
        rewriter's rule; False for a gathered bias or embedding table, which nothing saves: round 20, r20c).
        On a parameter's edge (`param_itemsize`: bytes per element of the parameter as used, the step's
        dtype) the backward moves gradients in their own dtype (`BYTES_PER_PARAM`: fp32 main gradients under
        "bf16"): `bwd_nbytes` scaled by grad bytes / `param_itemsize`. Each collective also waits for the
        slowest rank: + `DeviceSpec.collective_sync_s` (0 on the GPU presets; calibrated per process count;
        `cost_model.communication.step_collective_s`, the one price of a collective).

        `bucketed`: a parameter's gradient all-reduce (`grad_all_reduce`) as the runtime runs it, in buckets of
        `rewriter.grad_sync.DEFAULT_BUCKET_BYTES` B: its share of a full bucket's all-reduce,
        (t(max(n, B)) + sync) * n / max(n, B) for n gradient bytes, so that the per-collective latency is paid
        once per bucket and not once per parameter (a 256-element bias on dp=8 of an H100 node: 26.6 us alone,
        0.003 us as its share of a 25 MiB bucket). Summed over parameters this is the bucketed sync run back
        to back, an upper bound of what it delays when it overlaps backward (`steptime.estimate_step_time`
        prices the overlap).

        `compute_before_s`: (forward collective, backward conjugate, backward re-gather) the compute the rank ran
        since its previous collective, for the wait on the slowest rank (`cost_model.communication.sync_wait_s`);
        None: unknown, the full wait (the ILP, the plan's breakdown and the pipeline segments price an edge without
        the program's order; `steptime.estimate_step_time` walks the program and passes them)."""
        key = (step, param_itemsize, bucketed, regather, compute_before_s)
        hit = self._step_s.get(key)
        if hit is None:
            hit = self._step_s[key] = self._step_time_s(step, param_itemsize, bucketed, regather, compute_before_s)
        return hit

    def _step_time_s(self, step: Step, param_itemsize: int | None, bucketed: bool, regather: bool,
                     compute_before_s: tuple[float | None, float | None, float | None]) -> tuple[float, float]:
        """`step_time_s` uncached."""
        axes = (step.mesh_axis,)
        before_fwd, before_bwd, before_regather = compute_before_s
        fwd = step_collective_s(step.fwd_collective, step.nbytes, self.topo, axes, before_fwd) \
            if step.fwd_collective else 0.0
        bwd_nbytes = step.bwd_nbytes
        if param_itemsize is not None:
            bwd_nbytes = bwd_nbytes * self.grad_bytes_per_element // param_itemsize
        if not step.bwd_collective:
            bwd = 0.0
        elif bucketed and step.kind == "grad_all_reduce" and param_itemsize is not None and bwd_nbytes:
            full = max(bwd_nbytes, DEFAULT_BUCKET_BYTES)
            bwd = step_collective_s(step.bwd_collective, full, self.topo, axes) * bwd_nbytes / full
        else:
            bwd = step_collective_s(step.bwd_collective, bwd_nbytes, self.topo, axes, before_bwd)
        if step.regather and regather and step.fwd_collective:
            bwd += step_collective_s(step.fwd_collective, step.nbytes, self.topo, axes, before_regather)
        return fwd, bwd

    def edge_step_times(self, steps, param_itemsize: int | None = None,
                        regather: bool = True) -> list[tuple[float, float]]:
        """(forward, backward) seconds of each step of one edge's `steps` in order, as the ILP prices them:
        `step_time_s(step, param_itemsize, bucketed=...)` with the bucketed share only for the step the runtime
        buckets (`rewriter.grad_sync.runtime_buckets`: a parameter's edge's first step, `param_itemsize` given);
        a later `grad_all_reduce` of the edge (a parameter replicated on two mesh axes) runs synchronously per
        parameter and is priced in full, with its sync wait. `regather`: whether the program gathers this
        parameter again in backward (`Pricer.regathers`)."""
        is_param = param_itemsize is not None
        return [self.step_time_s(st, param_itemsize, bucketed=runtime_buckets(steps, k, is_param), regather=regather)
                for k, st in enumerate(steps)]

    def regathers(self, tg: TracedGraph | None, name: str) -> bool:
        """Whether the emitted program gathers parameter placeholder `name` of `tg` again in backward
        (`rewriter.reshard.regathered`, applied to the placeholder in the traced graph: the ops its gathered
        copy feeds); True for any other node and without a graph (the upper price). Cached per graph."""
        if tg is None or name not in tg.nodes:
            return True
        held = self.tables.regathered.get(id(tg))
        if held is None or held[0] is not tg:
            gm = tg.graph_module
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            live = self.backward_nodes(tg)  # a product keeps a weight only for a partner's gradient (round 27)
            kept = frozenset(n.name for n in placeholders if not regathered(n, lambda m: m.name in live))
            held = self.tables.regathered[id(tg)] = (tg, kept)
        return name not in held[1]

    def hierarchical_record(self) -> dict[str, dict]:
        """Which collectives the prices above run two-level (`cost_model.communication.collective_algorithm`), as
        `Plan.hierarchical` records it: per mesh axis whose groups span nodes with >= 2 ranks on each, the
        devices per node, ranks per node, nodes, and per kind the byte ranges where two-level is strictly
        cheaper (`hierarchical_byte_ranges`; an unbounded end as None). Axes and kinds without such sizes are
        left out."""
        record = {}
        for axis in self.mesh.axis_names:
            info = self.topo.axis_info(axis)
            ranges = {kind: [[lo, None if math.isinf(hi) else hi] for lo, hi in
                             hierarchical_byte_ranges(kind, self.topo, axis)] for kind in HIERARCHICAL_KINDS}
            ranges = {kind: r for kind, r in ranges.items() if r}
            if ranges:
                record[axis] = {"devices_per_node": self.topo.cluster.devices_per_node,
                                "ranks_per_node": info.ranks_per_node, "num_nodes": info.num_nodes, "bytes": ranges}
        return record

    @property
    def grad_bytes_per_element(self) -> int:
        """Bytes per element of a parameter's gradient as reduced (`cost_model.memory.BYTES_PER_PARAM`)."""
        return bytes_per_param(self.precision, self.config.optimizer)[1]

    def steps(self, src: Layout, dst: Layout, shape: tuple[int, ...], dtype: torch.dtype, grad_axes: tuple[str, ...],
              requires_grad: bool, is_parameter: bool = False) -> tuple[Step, ...]:
        """`core.redistribute.edge_steps` on this mesh for a tensor of `dtype` as the program runs it (`input_dtype`;
        cached on all its arguments, an impossible change too; raises as it does): its steps move `dtype.itemsize`
        bytes per element, its sums `core.redistribute.sum_itemsize(dtype)`, the width the runtime sums it in
        (float16 / bfloat16: float32's 4 B; int16: int64's 8 B)."""
        key = (src, dst, shape, dtype, grad_axes, requires_grad, is_parameter)
        hit = self._steps.get(key)
        if hit is None:
            try:
                hit = edge_steps(src, dst, shape, self.mesh, itemsize=dtype.itemsize, grad_partial_axes=grad_axes,
                                 requires_grad=requires_grad, is_parameter=is_parameter,
                                 sum_bytes=sum_itemsize(dtype))
            except ImpossibleRedistributionError as err:
                # kept without its traceback: the frames it holds (with their locals) would stay alive as long as
                # this cache, in a cycle with this frame (round 26, r26a: 5.6k per 2x2 Llama plan, GC work)
                hit = err.with_traceback(None)
            self._steps[key] = hit
        if isinstance(hit, ImpossibleRedistributionError):
            raise ImpossibleRedistributionError(*hit.args)  # a fresh one: re-raising `hit` would grow its traceback
        return hit

    def edge_time_s(self, src: Layout, dst: Layout, shape: tuple[int, ...], dtype: torch.dtype,
                    grad_axes: tuple[str, ...], requires_grad: bool, is_parameter: bool = False,
                    regather: bool = True) -> float:
        """Forward + backward seconds of one use of a tensor of `dtype` as run (`input_dtype`; cached); inf when the change is
        impossible (e.g. Replicate -> Partial): the ILP then forbids that pair."""
        return self.edge_cost(src, dst, shape, dtype, grad_axes, requires_grad, is_parameter, regather)[0]

    def forward_s(self, src: Layout, dst: Layout, shape: tuple[int, ...], dtype: torch.dtype,
                  grad_axes: tuple[str, ...], requires_grad: bool) -> float:
        """Forward seconds of the redistribution of an activation (its steps' forward collectives, as
        `step_time_s` prices them): what recomputing its consumer runs again (`recompute.RegionPrice`); 0 for
        an impossible change (the ILP forbids that pair through `edge_cost`). Cached."""
        key = (src, dst, shape, dtype, grad_axes, requires_grad)
        hit = self._fwd.get(key)
        if hit is None:
            try:
                steps = self.steps(src, dst, shape, dtype, grad_axes, requires_grad)
                hit = sum(self.step_time_s(s)[0] for s in steps)
            except ImpossibleRedistributionError:
                hit = 0.0
            self._fwd[key] = hit
        return hit

    def edge_cost(self, src: Layout, dst: Layout, shape: tuple[int, ...], dtype: torch.dtype,
                  grad_axes: tuple[str, ...], requires_grad: bool, is_parameter: bool = False,
                  regather: bool = True) -> tuple[float, int]:
        """(`edge_time_s`, collectives launched forward and backward) of one use of a tensor (cached); the count
        breaks ties in the ILP (`ilp.py`). An impossible change: (inf, 0). `regather`: whether the program
        gathers the parameter again in backward (`Pricer.regathers`)."""
        key = (src, dst, shape, dtype, grad_axes, requires_grad, is_parameter, regather)
        hit = self._edge.get(key)
        if hit is None:
            try:
                steps = self.steps(src, dst, shape, dtype, grad_axes, requires_grad, is_parameter)
                param_itemsize = dtype.itemsize if is_parameter else None
                seconds = sum(f + b for f, b in self.edge_step_times(steps, param_itemsize, regather))
                count = sum((s.fwd_collective is not None) + (s.bwd_collective is not None) + (s.regather and regather)
                            for s in steps)
                hit = (seconds, int(count))
            except ImpossibleRedistributionError:
                hit = (math.inf, 0)
            self._edge[key] = hit
        return hit

    # --- compute ------------------------------------------------------------------------------------
    def fusion_of(self, tg: TracedGraph, name: str) -> FusedIO:
        """The node's place in a fused pointwise chain (`cost_model.fusion`); unfused on a CPU."""
        if not self.fuse_pointwise:
            return FusedIO()
        held = self.tables.fusion.get(id(tg))
        if held is None or held[0] is not tg:
            held = self.tables.fusion[id(tg)] = (tg, pointwise_fusion(tg.graph_module))
        return held[1].get(name, FusedIO())

    def saved_share(self, tg: TracedGraph, name: str) -> SavedShare | None:
        """The node's part of the storages it saves for backward (`cost_model.memory.saved_tensor_owners`: each
        storage charged to its first saver in graph order; parameters and buffers to none); None: all its own.
        The savers are the ops downstream of a trained parameter or of a received value with a gradient (a pipeline
        stage's, `strategies.received_with_grad`; a model's own inputs carry none)."""
        return self._saved_facts(tg)[1].get(name)

    def grad_args(self, tg: TracedGraph, name: str) -> frozenset[int]:
        """Positional indices of the node's args that require grad (`cost_model.memory.grad_arg_indices` over the
        same savers as `saved_share`): mul keeps an operand only when its partner requires grad, so q * cos with
        rotary cos computed from buffers keeps cos alone (before: q as well, guessed from its shape)."""
        return grad_arg_indices(tg.nodes[name].node, self._saved_facts(tg)[2])

    def backward_nodes(self, tg: TracedGraph) -> frozenset[str]:
        """Names of the nodes of `tg` whose backward runs (`cost_model.memory.backward_nodes`), cached per graph."""
        return self._saved_facts(tg)[2]

    def _saved_facts(self, tg: TracedGraph) -> tuple[TracedGraph, dict[str, SavedShare], frozenset[str]]:
        """(tg, saved_tensor_owners, backward_nodes) of a graph, cached in `tables.shares`."""
        held = self.tables.shares.get(id(tg))
        if held is None or held[0] is not tg:
            resident = [ph for p in tg.parameters.values() for ph in p.placeholders]
            trainable = [ph for p in tg.parameters.values() if not p.is_buffer and p.requires_grad
                         for ph in p.placeholders]
            trainable += received_with_grad(tg)
            held = self.tables.shares[id(tg)] = (tg, saved_tensor_owners(tg.graph_module, resident, trainable),
                                                 frozenset(backward_nodes(tg.graph_module, trainable)))
        return held

    def node_costs(self, tg: TracedGraph, info: NodeInfo, space: NodeSpace) -> list[NodeCost]:
        """`node_cost` of every strategy of a node (cached per op signature and strategy)."""
        sig = (info.target, tuple(i.shape for i in space.inputs), tuple(tuple(o.shape) for o in info.outputs),
               _scalars(info.node), space.requires_grad, self.fusion_of(tg, info.name), self.saved_share(tg, info.name),
               self.grad_args(tg, info.name), self.node_dtypes(tg, info.name))
        res = []
        for s in space.strategies:
            hit = self._node.get((sig, s))
            if hit is None:
                hit = self._node[(sig, s)] = self.node_cost(tg, info, space, s)
            res.append(hit)
        return res

    def node_cost(self, tg: TracedGraph, info: NodeInfo, space: NodeSpace, strategy: Strategy) -> NodeCost:
        """Cost of one op under one strategy (0 for getitem and placeholders): its compute on local shapes
        (cached per local signature) + the collectives its sharded form runs inside the op
        (`op_comm.op_collectives`, e.g. a vocab-parallel cross-entropy's all-reduces)."""
        if info.op != "call_function" or info.target is operator.getitem:
            return NodeCost(0.0, 0.0, 0)
        in_local = [local_shape(i.shape, L, self.mesh) for i, L in zip(space.inputs, strategy.inputs)]
        out_local = [local_shape(tuple(o.shape), strategy.output, self.mesh) for o in info.outputs]
        # a pending sum of a float16 value: the op runs on float32 copies of its inputs, which it saves
        # (`rewriter.apply._sums_wide`; a traced dtype, not autocast's, decides it there too)
        wide = (bool(info.outputs) and info.outputs[0].dtype in WIDENED_FLOATS
                and any(isinstance(p, Partial) for p in strategy.output))
        ac = self.node_dtypes(tg, info.name)
        key = (info.target, tuple(in_local), tuple(out_local), _scalars(info.node), space.requires_grad,
               self.fusion_of(tg, info.name), self.saved_share(tg, info.name), self.grad_args(tg, info.name), wide, ac)
        hit = self._node.get(key)
        if hit is None:
            try:
                hit = self._price(tg, info, space, in_local, out_local, wide)
            except ValueError as exc:  # cost_model has no peak for the op's dtype (a float64 matmul on a GPU preset)
                if "no peak FLOP/s" not in str(exc):
                    raise
                dtypes = sorted({str(i.dtype).removeprefix("torch.") for i in space.inputs})
                raise PrecisionError(
                    f"node {info.name} ({info.target}) computes in {', '.join(dtypes)}, which device "
                    f"{self.device.name!r} has no peak FLOP/s for ({exc}). Remedy: compute that op in a dtype the "
                    "device prices (e.g. float32: .float() before it), or plan on a DeviceSpec with a peak for "
                    "it (cluster=...)") from exc
            self._node[key] = hit
        inner = op_collectives(info.node, strategy.inputs, strategy.output, [i.shape for i in space.inputs],
                               tuple(info.outputs[0].shape) if info.outputs else None, self.mesh,
                               self.in_dtypes(tg, info, space)[0] if space.inputs else torch.float32)
        extra = (_vocab_parallel_saved_bytes(info, strategy, in_local, self.in_dtypes(tg, info, space)[0].itemsize)
                 if space.requires_grad and space.inputs else 0)
        if not inner:
            return NodeCost(hit.fwd_s, hit.bwd_s, hit.saved_bytes + extra, hit.note) if extra else hit
        fwd = bwd = 0.0
        for kind, nbytes, axis, backward in inner:
            t = step_collective_s(kind, nbytes, self.topo, (self.mesh.axis_names[axis],))
            if backward:
                bwd += t if space.requires_grad else 0.0
            else:
                fwd += t
        return NodeCost(hit.fwd_s + fwd, hit.bwd_s + bwd, hit.saved_bytes + extra, hit.note)

    def in_dtypes(self, tg: TracedGraph, info: NodeInfo, space: NodeSpace) -> list[torch.dtype]:
        """The dtype the op computes each tensor input in: after autocast's cast under the recipe
        (`node_dtypes`), else its producer's dtype as run (`value_dtype`)."""
        ac = self.node_dtypes(tg, info.name)
        if ac is not None and len(ac.inputs) == len(space.inputs):
            return list(ac.inputs)
        return [self.value_dtype(tg, ti.producer, ti.dtype) for ti in space.inputs]

    def out_dtypes(self, tg: TracedGraph, info: NodeInfo) -> list[torch.dtype]:
        """The dtype of each tensor output as run (`node_dtypes`; the traced ones without the recipe)."""
        ac = self.node_dtypes(tg, info.name)
        outs = [d for d in ac.outputs if d is not None] if ac is not None else []
        return outs if len(outs) == len(info.outputs) else [o.dtype for o in info.outputs]

    def _price(self, tg: TracedGraph, info: NodeInfo, space: NodeSpace, in_local, out_local,
               wide: bool = False) -> NodeCost:
        in_dt, out_dt = self.in_dtypes(tg, info, space), self.out_dtypes(tg, info)
        if wide:  # an op whose output is a pending sum of a narrow float runs on float32 copies (`widened_dtype`)
            in_dt, out_dt = [widened_dtype(d) for d in in_dt], [widened_dtype(d) for d in out_dt]
        args, kwargs, out, params = _local_values(tg, info, space, in_local, out_local, in_dt, out_dt)
        fused, share = self.fusion_of(tg, info.name), self.saved_share(tg, info.name)
        ac = self.node_dtypes(tg, info.name)
        cast_args = cast_arg_positions(info.node, ac.casts) if ac is not None else frozenset()
        if share is not None and cast_args:  # autocast's copy of an input is a storage of this op's own
            share = SavedShare(tuple((i, f) for i, f in share.args if i not in cast_args), share.outputs)
        grads = self.grad_args(tg, info.name)
        try:
            c = op_cost(info.target, args, kwargs, out, self.device, fused.fused_args, fused.output_fused)
            saved = saved_activation_bytes(info.target, args, kwargs, out, param_args=params, share=share,
                                           grad_args=grads)
            fwd, bwd = c.fwd_s, c.bwd_s
        except Exception:  # noqa: BLE001 -- an op cost_model cannot run on local shapes: scale the global cost
            g_in = [i.shape for i in space.inputs]
            g_out = [tuple(o.shape) for o in info.outputs]
            ga, gk, go, gp = _local_values(tg, info, space, g_in, g_out, in_dt, out_dt)
            c = op_cost(info.target, ga, gk, go, self.device, fused.fused_args, fused.output_fused)
            saved = saved_activation_bytes(info.target, ga, gk, go, param_args=gp, share=share, grad_args=grads)
            ratio = (sum(math.prod(s) for s in out_local) or 1) / (sum(math.prod(s) for s in g_out) or 1)
            fwd, bwd, saved = c.fwd_s * ratio, c.bwd_s * ratio, int(saved * ratio)
        if ac is not None:  # autocast's casts: a memory-bound copy each (read one dtype, write the other), forward
            for k in ac.casts:  # and backward (the gradient cast back); fused (no launch of its own) on a GPU preset,
                ti = space.inputs[k]  # as its pointwise chains are priced (`cost_model.fusion`)
                src = torch.empty(in_local[k], dtype=self.value_dtype(tg, ti.producer, ti.dtype), device="meta")
                if self.fuse_pointwise:
                    moved_s = (math.prod(in_local[k]) * (src.itemsize + in_dt[k].itemsize)
                               / self.device.achievable_bytes_per_s)
                    fwd, bwd = fwd + moved_s, bwd + (moved_s if space.requires_grad else 0.0)
                else:
                    cast = op_cost(aten._to_copy.default, (src,), {"dtype": in_dt[k]}, src.to(in_dt[k]), self.device)
                    fwd, bwd = fwd + cast.fwd_s, bwd + cast.bwd_s
        if not space.requires_grad:
            return NodeCost(fwd, 0.0, 0, c.uncounted_flops)
        return NodeCost(fwd, bwd, int(saved), c.uncounted_flops)

    # --- memory -------------------------------------------------------------------------------------
    def param_state_bytes(self, numel: int, trainable: bool = True) -> tuple[int, int, int]:
        """(param, grad, optimizer) bytes of `numel` stored elements, by precision and optimizer
        (`cost_model.memory.BYTES_PER_PARAM`: 2 + 4 + 12 in bf16 with Adam); a frozen parameter
        (`trainable=False`) has no gradient and no optimizer state (and no fp32 main copy). With ZeRO-1
        (`PlanConfig.zero1`) the optimizer bytes are those of one rank's 1/N share."""
        p, g, o = bytes_per_param(self.precision, self.config.optimizer)
        if not trainable:
            return p * numel, 0, 0
        return p * numel, g * numel, o * numel // self.zero1_ranks

    @property
    def zero1_ranks(self) -> int:
        """N, the ranks of the `PlanConfig.zero1` axis of this mesh (1 without ZeRO-1 or without that axis: a
        pipeline stage's mesh without it)."""
        axis = self.config.zero1
        return self.mesh.size(axis) if axis is not None and axis in self.mesh.axis_names else 1

    def zero1_broadcast_s(self, numel: int, trainable: bool = True) -> float:
        """Seconds per step of ZeRO-1's parameter broadcast for `numel` stored elements of a trainable parameter:
        each of the N ranks sends the 1/N it stepped to the others, an all-gather's volume
        (`cost_model.communication.step_collective_s`; ZeroRedundancyOptimizer broadcasts per owner), with the
        collective's sync wait. 0 without ZeRO-1 or for a frozen parameter."""
        if self.zero1_ranks == 1 or not trainable:
            return 0.0
        nbytes = numel * bytes_per_param(self.precision, self.config.optimizer)[0]
        return step_collective_s("all_gather", nbytes, self.topo, (self.config.zero1,))


def _scalars(node: torch.fx.Node) -> str:
    return repr(torch.fx.node.map_arg((node.args, node.kwargs), lambda n: None))


def _local_values(tg: TracedGraph, info: NodeInfo, space: NodeSpace, in_shapes, out_shapes, in_dtypes=None,
                  out_dtypes=None):
    """(args, kwargs, out, param_arg_indices) of a node with meta tensors of the given shapes, in the dtypes
    given per tensor input and output (`Pricer.in_dtypes` / `out_dtypes`; None: the traced ones)."""
    in_dtypes = in_dtypes or [ti.dtype for ti in space.inputs]
    out_dtypes = out_dtypes or [o.dtype for o in info.outputs]
    it = iter(list(zip(in_shapes, in_dtypes)))

    def meta(n: torch.fx.Node) -> torch.Tensor:
        shape, dtype = next(it)
        return torch.empty(shape, dtype=dtype, device="meta")

    args, kwargs = torch.fx.node.map_arg((info.node.args, info.node.kwargs), meta)
    args, kwargs = tuple(args), dict(kwargs)
    if getattr(info.target, "overloadpacket", None) in _SHAPE_ARG_OPS and len(args) > 1:
        args = (args[0], list(out_shapes[0])) + args[2:]
    outs = [torch.empty(s, dtype=d, device="meta") for s, d in zip(out_shapes, out_dtypes)]
    out = outs[0] if len(outs) == 1 and not isinstance(info.node.meta.get("val"), (tuple, list)) else outs
    params = tuple(i for i, a in enumerate(info.node.args) if isinstance(a, torch.fx.Node)
                   and tg.nodes[a.name].role.value in ("parameter", "buffer"))
    return args, kwargs, out, params


def _vocab_parallel_saved_bytes(info: NodeInfo, strategy: Strategy, in_local, logits_itemsize: int) -> int:
    """Bytes a vocab-parallel cross-entropy (`rewriter.vocab_parallel.vocab_parallel_cross_entropy`, its logits
    Shard over the class dim) saves beyond the op priced on local shapes. The op is priced as keeping its local
    logits (N, C_local) and its int64 target (N,) (`cost_model.memory`: an op without a save rule keeps its tensor
    args, and nll_loss's 0-d total_weight); the vocab-parallel node keeps the local softmax (logits-sized, the logits'
    dtype), an int64 local target index (N,) and a bool "target on this rank" flag (N,): one byte per row more,
    one total_weight element less. Megatron-LM's
    VocabParallelCrossEntropy keeps the same (softmax, masked target, target mask). Before round 22 (r22e) the
    arithmetic ran as plain autograd ops that kept the shifted logits and the exponentials, two logits-sized
    tensors, and this price was logits + row sums more (round 14, r14d); a memory-bound Llama-3-8B plan then took
    the all-to-all to batch shards instead (RESULTS.md, Round 21 (g) finding 2)."""
    if getattr(info.target, "overloadpacket", None) is not torch.ops.aten.cross_entropy_loss or len(in_local[0]) < 2:
        return 0
    if not any(isinstance(p, Shard) and p.dim == 1 for p in strategy.inputs[0].placements):
        return 0
    # one bool per row, and no 0-d total_weight (the local op is priced with nll_loss's, `cost_model.memory`)
    return math.prod(in_local[0][:1] + in_local[0][2:]) - logits_itemsize
