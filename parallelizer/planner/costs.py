"""Pricing (DESIGN.md: cost_model prices, the planner decides). The ONE place where steps, ops and training
state are turned into seconds and bytes with `cost_model`:

  * `step_time_s(step)`: forward and backward seconds of one redistribution `Step`
    (`cost_model.communication.collective_time_s` over the step's mesh axis, nccl-tests byte convention);
  * `edge_time_s(...)`: sum over `edge_steps(...)` of forward + backward seconds;
  * `node_cost(...)`: forward + backward seconds of one op on its LOCAL shapes (`cost_model.compute.op_cost`)
    and the bytes it saves for backward (`cost_model.memory.saved_activation_bytes`);
  * `param_state_bytes(...)`: params / grads / optimizer bytes of a stored shard (`cost_model.memory`).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx

from cost_model.communication import collective_time_s
from cost_model.compute import op_cost
from cost_model.hardware import DeviceSpec
from cost_model.memory import BYTES_PER_PARAM, saved_activation_bytes
from cost_model.topology import MeshTopology

from ..config import PlanConfig
from ..core.layout import Layout, local_shape
from ..core.mesh import MeshSpec
from ..core.redistribute import ImpossibleRedistributionError, Step, edge_steps
from ..tracer import NodeInfo, TracedGraph
from .strategies import NodeSpace, Strategy

aten = torch.ops.aten
_SHAPE_ARG_OPS = {aten.view, aten.reshape, aten._unsafe_view, aten.expand}


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


class Pricer:
    """Prices for one mesh on one topology and device (caches results; holds no decisions).

    Args:
        topo: mesh on its cluster (its axis names/shape must equal `mesh`'s).
        mesh: the abstract mesh.
        config: for optimizer / precision.
    Raises:
        ValueError: topology and mesh disagree.
    """

    def __init__(self, topo: MeshTopology, mesh: MeshSpec, config: PlanConfig) -> None:
        if tuple(topo.axis_names) != mesh.axis_names or tuple(topo.mesh_shape) != mesh.shape:
            raise ValueError(f"topology mesh {dict(zip(topo.axis_names, topo.mesh_shape))} differs from the plan "
                             f"mesh {mesh}; build MeshTopology(cluster, mesh.shape, mesh.axis_names)")
        self.topo, self.mesh, self.config = topo, mesh, config
        self.device: DeviceSpec = topo.cluster.device
        self._edge: dict = {}
        self._node: dict = {}
        self.matrices: dict = {}  # edge cost matrices by (layouts, shape, ...): block instances share them

    # --- communication ------------------------------------------------------------------------------
    def step_time_s(self, step: Step) -> tuple[float, float]:
        """(forward seconds, backward seconds) of one step; a `regather` step repeats its forward in backward."""
        fwd = collective_time_s(step.fwd_collective, step.nbytes, self.topo, (step.mesh_axis,)) \
            if step.fwd_collective else 0.0
        bwd = collective_time_s(step.bwd_collective, step.bwd_nbytes, self.topo, (step.mesh_axis,)) \
            if step.bwd_collective else 0.0
        return fwd, bwd + (fwd if step.regather else 0.0)

    def steps(self, src: Layout, dst: Layout, shape: tuple[int, ...], itemsize: int, grad_axes: tuple[str, ...],
              requires_grad: bool, is_parameter: bool = False) -> tuple[Step, ...]:
        return edge_steps(src, dst, shape, self.mesh, itemsize=itemsize, grad_partial_axes=grad_axes,
                          requires_grad=requires_grad, is_parameter=is_parameter)

    def edge_time_s(self, src: Layout, dst: Layout, shape: tuple[int, ...], itemsize: int,
                    grad_axes: tuple[str, ...], requires_grad: bool, is_parameter: bool = False) -> float:
        """Forward + backward seconds of one use of a tensor (cached); inf when the change is impossible
        (e.g. Replicate -> Partial): the ILP then forbids that pair."""
        key = (src, dst, shape, itemsize, grad_axes, requires_grad, is_parameter)
        hit = self._edge.get(key)
        if hit is None:
            try:
                steps = self.steps(src, dst, shape, itemsize, grad_axes, requires_grad, is_parameter)
                hit = sum(sum(self.step_time_s(s)) for s in steps)
            except ImpossibleRedistributionError:
                hit = math.inf
            self._edge[key] = hit
        return hit

    # --- compute ------------------------------------------------------------------------------------
    def node_costs(self, tg: TracedGraph, info: NodeInfo, space: NodeSpace) -> list[NodeCost]:
        """`node_cost` of every strategy of a node (cached per op signature and strategy)."""
        sig = (info.target, tuple(i.shape for i in space.inputs), tuple(tuple(o.shape) for o in info.outputs),
               _scalars(info.node), space.requires_grad)
        res = []
        for s in space.strategies:
            hit = self._node.get((sig, s))
            if hit is None:
                hit = self._node[(sig, s)] = self.node_cost(tg, info, space, s)
            res.append(hit)
        return res

    def node_cost(self, tg: TracedGraph, info: NodeInfo, space: NodeSpace, strategy: Strategy) -> NodeCost:
        """Cost of one op under one strategy (0 for getitem and placeholders). Cached per local signature."""
        if info.op != "call_function" or info.target is operator.getitem:
            return NodeCost(0.0, 0.0, 0)
        in_local = [local_shape(i.shape, L, self.mesh) for i, L in zip(space.inputs, strategy.inputs)]
        out_local = [local_shape(tuple(o.shape), strategy.output, self.mesh) for o in info.outputs]
        key = (info.target, tuple(in_local), tuple(out_local), _scalars(info.node), space.requires_grad)
        hit = self._node.get(key)
        if hit is None:
            hit = self._price(tg, info, space, in_local, out_local)
            self._node[key] = hit
        return hit

    def _price(self, tg: TracedGraph, info: NodeInfo, space: NodeSpace, in_local, out_local) -> NodeCost:
        args, kwargs, out, params = _local_values(tg, info, space, in_local, out_local)
        try:
            c = op_cost(info.target, args, kwargs, out, self.device)
            saved = saved_activation_bytes(info.target, args, kwargs, out, param_args=params)
            fwd, bwd = c.fwd_s, c.bwd_s
        except Exception:  # noqa: BLE001 -- an op cost_model cannot run on local shapes: scale the global cost
            g_in = [i.shape for i in space.inputs]
            g_out = [tuple(o.shape) for o in info.outputs]
            ga, gk, go, gp = _local_values(tg, info, space, g_in, g_out)
            c = op_cost(info.target, ga, gk, go, self.device)
            saved = saved_activation_bytes(info.target, ga, gk, go, param_args=gp)
            ratio = (sum(math.prod(s) for s in out_local) or 1) / (sum(math.prod(s) for s in g_out) or 1)
            fwd, bwd, saved = c.fwd_s * ratio, c.bwd_s * ratio, int(saved * ratio)
        if not space.requires_grad:
            return NodeCost(fwd, 0.0, 0, c.uncounted_flops)
        return NodeCost(fwd, bwd, int(saved), c.uncounted_flops)

    # --- memory -------------------------------------------------------------------------------------
    def param_state_bytes(self, numel: int, trainable: bool = True) -> tuple[int, int, int]:
        """(param, grad, optimizer) bytes of `numel` stored elements (ZeRO Sec. 3.1 table in cost_model); a
        frozen parameter (`trainable=False`) has no gradient and no optimizer state."""
        precision = "mixed" if self.config.mixed_precision else "fp32"
        p, g, o = BYTES_PER_PARAM[precision]
        if self.config.optimizer == "sgd":
            o = 4 if precision == "mixed" else 0  # the fp32 master copy only
        if not trainable:
            return p * numel, 0, 0
        return p * numel, g * numel, o * numel


def _scalars(node: torch.fx.Node) -> str:
    return repr(torch.fx.node.map_arg((node.args, node.kwargs), lambda n: None))


def _local_values(tg: TracedGraph, info: NodeInfo, space: NodeSpace, in_shapes, out_shapes):
    """(args, kwargs, out, param_arg_indices) of a node with meta tensors of the given shapes."""
    it = iter(list(zip(space.inputs, in_shapes)))

    def meta(n: torch.fx.Node) -> torch.Tensor:
        ti, shape = next(it)
        return torch.empty(shape, dtype=ti.dtype, device="meta")

    args, kwargs = torch.fx.node.map_arg((info.node.args, info.node.kwargs), meta)
    args, kwargs = tuple(args), dict(kwargs)
    if getattr(info.target, "overloadpacket", None) in _SHAPE_ARG_OPS and len(args) > 1:
        args = (args[0], list(out_shapes[0])) + args[2:]
    outs = [torch.empty(s, dtype=o.dtype, device="meta") for s, o in zip(out_shapes, info.outputs)]
    out = outs[0] if len(outs) == 1 and not isinstance(info.node.meta.get("val"), (tuple, list)) else outs
    params = tuple(i for i, a in enumerate(info.node.args) if isinstance(a, torch.fx.Node)
                   and tg.nodes[a.name].role.value in ("parameter", "buffer"))
    return args, kwargs, out, params
