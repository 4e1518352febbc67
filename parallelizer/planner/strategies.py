"""Strategy spaces: for every node, the list of strategies (input layouts + output layout) it may take.

A strategy on an N-axis mesh is a product of N per-axis options from the op's rule (`rules.py`), kept when
every input and output shard divides evenly. Special nodes:
  * parameter (one per `ParamInfo`, tied aliases share it): the STORED layouts, Replicate or Shard(d) per
    mesh axis (Replicate over a data axis = DDP, Shard over it = ZeRO-3/FSDP); buffers and lifted constants
    are stored replicated;
  * user input: Replicate, or its batch dim sharded over the data axes (`PlanConfig`);
  * axis roles (`PlanConfig.axis_roles`) narrow these: over a "ddp" axis parameters are stored Replicate and
    batch dims sharded; over "fsdp" parameters are stored Shard (where some dim divides) and batch dims
    sharded; over both, parameters are used Replicate and activations are not gathered (except into the
    graph output or an op without a rule), so the compute stays data parallel (`problem.EdgeRoles`);
    over "tp" parameters of >= 2 dims are stored Shard (where some dim divides) in a layout every consumer
    takes as it is (never gathered over a "tp" axis: `problem.EdgeRoles`), else Replicate (recorded as a
    fallback), and inputs are Replicate;
  * output: every input Replicate (the plan's final outputs are replicated);
  * an op with no rule: all Replicate, recorded as a fallback.

Followers (an exact-by-construction reduction of the search): a node with ONE tensor input, produced by an op
or user input in the same block instance, whose rule maps each input placement to one output placement
(views, unary pointwise ops, getitem, softmax, ...), does not choose: its strategy i is its producer's
strategy i pushed through the rule (an axis the rule cannot map is redistributed to Replicate first).
It shares its producer's ILP variables.
"""
from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from ..config import PlanConfig
from ..core.layout import Layout, Replicate, Shard, fits
from ..core.mesh import MeshSpec
from ..tracer import NodeInfo, Role, TracedGraph
from .rules import OpView, rule_for

R = Replicate()


@dataclass(frozen=True, slots=True)
class Strategy:
    """Input layouts (one per tensor input, in `NodeSpace.inputs` order) and the output layout (None for the
    graph output node). Layouts of parameter nodes are their stored layouts."""

    inputs: tuple[Layout, ...]
    output: Layout | None


@dataclass(frozen=True, slots=True)
class TensorInput:
    """One tensor input of a node: the producing node, the tensor's global shape and dtype."""

    producer: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class NodeSpace:
    """Strategy space of one node. `leader` is the node whose variables it shares (followers), else None.
    `kind`: "param", "buffer", "input", "op" or "output"."""

    name: str
    kind: str
    inputs: tuple[TensorInput, ...]
    strategies: list[Strategy]
    requires_grad: bool
    leader: str | None = None
    fallback: str | None = None
    param_fqn: str | None = None
    extra: dict = field(default_factory=dict)


def tensor_inputs(tg: TracedGraph, info: NodeInfo) -> tuple[TensorInput, ...]:
    """Tensor-valued fx-node arguments of a node, in order of appearance (args, then kwargs)."""
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((info.node.args, info.node.kwargs), lambda n: found.append(n) or n)
    res = []
    for n in found:
        prod = tg.nodes[n.name]
        if not prod.outputs:
            continue
        k = info.node.args[1] if info.target is operator.getitem and len(prod.outputs) > 1 else 0
        t = prod.outputs[k]
        res.append(TensorInput(n.name, tuple(t.shape), t.dtype))
    return tuple(res)


def op_view(tg: TracedGraph, info: NodeInfo, inputs: tuple[TensorInput, ...]) -> OpView:
    return OpView(info.target, tuple(info.node.args), dict(info.node.kwargs), tuple(i.shape for i in inputs),
                  tuple(tuple(o.shape) for o in info.outputs),
                  bool(info.outputs) and info.outputs[0].dtype.is_floating_point)


def _product(options: list, mesh: MeshSpec, in_shapes, out_shapes) -> list[Strategy]:
    """All per-axis option combinations whose shards divide evenly; order-preserving, deduplicated."""
    seen, res = set(), []
    for combo in itertools.product(options, repeat=mesh.ndim):
        ins = tuple(Layout(tuple(c[0][k] for c in combo)) for k in range(len(in_shapes)))
        out = Layout(tuple(c[1] for c in combo))
        s = Strategy(ins, out)
        if s in seen:
            continue
        if all(fits(sh, L, mesh) for sh, L in zip(in_shapes, ins)) and all(fits(o, out, mesh) for o in out_shapes):
            seen.add(s)
            res.append(s)
    return res


def _layouts(shape: tuple[int, ...], per_axis: list[list], mesh: MeshSpec) -> list[Layout]:
    return [L for L in (Layout(c) for c in itertools.product(*per_axis)) if fits(shape, L, mesh)]


def _follow(leader: NodeSpace, options: list, shape_in, out_shapes, mesh: MeshSpec) -> list[Strategy]:
    mapping: dict = {}
    for ins, out in options:
        mapping.setdefault(ins[0], out)
    res = []
    for s in leader.strategies:
        src = list(s.output)
        ins = [p if p in mapping else R for p in src]
        outs = [mapping[p] for p in ins]
        for a in reversed(range(mesh.ndim)):  # an output that does not divide: replicate that axis
            if all(fits(o, Layout(tuple(outs)), mesh) for o in out_shapes):
                break
            ins[a], outs[a] = R, R
        res.append(Strategy((Layout(tuple(ins)),), Layout(tuple(outs))))
    return res


def build_spaces(tg: TracedGraph, mesh: MeshSpec, config: PlanConfig) -> dict[str, NodeSpace]:
    """`NodeSpace` per graph node (placeholders, ops, output), in graph order.

    Raises:
        ValueError: a data axis or an axis role naming an axis that is not a mesh axis; a user input whose
            batch dim does not divide over a "ddp"/"fsdp" axis.
    """
    data_axes = _data_axes(mesh, config)
    spaces: dict[str, NodeSpace] = {}
    for name, info in tg.nodes.items():
        inputs = tensor_inputs(tg, info)
        if info.op == "placeholder" or info.op == "get_attr":
            spaces[name] = _placeholder_space(tg, info, mesh, config, data_axes)
            continue
        if info.op == "output":
            spaces[name] = NodeSpace(name, "output", inputs,
                                     [Strategy(tuple(Layout.replicate(mesh.ndim) for _ in inputs), None)], False)
            continue
        req = (any(spaces[i.producer].requires_grad for i in inputs) and bool(info.outputs)
               and info.outputs[0].dtype.is_floating_point and info.op_name != "aten.detach.default")
        view = op_view(tg, info, inputs)
        rule = rule_for(info.target)
        options = rule(view) if rule is not None else None
        if options is None:
            rep = [Strategy(tuple(Layout.replicate(mesh.ndim) for _ in inputs), Layout.replicate(mesh.ndim))]
            spaces[name] = NodeSpace(name, "op", inputs, rep, req, fallback=f"no sharding rule for {info.op_name}")
            continue
        leader = _leader(tg, info, inputs, options, spaces)
        if leader is not None:
            strategies = _follow(spaces[inputs[0].producer], options, inputs[0].shape, view.out_shapes, mesh)
            spaces[name] = NodeSpace(name, "op", inputs, strategies, req, leader=leader)
        else:
            spaces[name] = NodeSpace(name, "op", inputs, _product(options, mesh, view.in_shapes, view.out_shapes), req)
    _keep_tp_weights_usable(tg, mesh, config, spaces)
    return spaces


def role_axes(mesh: MeshSpec, config: PlanConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Indices of the mesh axes with a data role ("ddp", "fsdp") and of those with the role "tp"."""
    roles = [config.role_of(a) for a in mesh.axis_names]
    return (tuple(i for i, r in enumerate(roles) if r in ("ddp", "fsdp")),
            tuple(i for i, r in enumerate(roles) if r == "tp"))


def _keep_tp_weights_usable(tg: TracedGraph, mesh: MeshSpec, config: PlanConfig, spaces: dict[str, NodeSpace]) -> None:
    """Keep the stored layouts of a parameter forced Shard over "tp" axes that each of its uses can consume
    unchanged on those axes; when none is left, let it be stored Replicate there and record why."""
    tp = role_axes(mesh, config)[1]
    if not tp:
        return
    on_tp = lambda layout: tuple(layout.placements[i] for i in tp)
    for p in tg.parameters.values():
        space = spaces.get(p.placeholders[0])
        if p.is_buffer or space is None or len(p.shape) < 2:
            continue
        accepted = [(use, {on_tp(s.inputs[k]) for s in spaces[use].strategies})
                    for use in p.uses for k, ti in enumerate(spaces[use].inputs) if ti.producer in p.placeholders]
        keep = [s for s in space.strategies if all(on_tp(s.output) in acc for _, acc in accepted)]
        if not keep:
            relaxed = _param_layouts(tuple(p.shape), [config.role_of(a) for a in mesh.axis_names], mesh, force_tp=False)
            keep = [Strategy((), L) for L in relaxed if all(on_tp(L) in acc for _, acc in accepted)]
            blocker = next(use for use, acc in accepted if not any(on_tp(s.output) in acc for s in space.strategies))
            space.fallback = (f"axis role 'tp': {tg.nodes[blocker].op_name} ({blocker}) cannot use parameter "
                              f"{p.fqn} {tuple(p.shape)} sharded over the tp axes; stored Replicate there")
        space.strategies = keep


def _leader(tg: TracedGraph, info: NodeInfo, inputs, options, spaces) -> str | None:
    """The group leader a node may follow, or None (see module docstring)."""
    if len(inputs) != 1:
        return None
    prod = spaces[inputs[0].producer]
    if prod.kind not in ("op", "input") or tg.nodes[prod.name].block != info.block:
        return None
    firsts = [ins[0] for ins, _ in options]
    if len(set(firsts)) != len(firsts):
        return None
    return prod.leader or prod.name


def _param_layouts(shape: tuple[int, ...], roles: list[str], mesh: MeshSpec, force_tp: bool = True) -> list[Layout]:
    """Stored layouts a parameter may take under the axis roles: Replicate over "ddp" axes; Shard over
    "fsdp" axes and (with `force_tp`, for >= 2-D parameters) "tp" axes, as many of them as the shape allows;
    Replicate or Shard(any dim) elsewhere."""
    shards = [Shard(d) for d in range(len(shape)) if shape[d] > 1]
    layouts = _layouts(shape, [[R] if role == "ddp" else [R] + shards for role in roles], mesh)
    forced = [i for i, role in enumerate(roles) if role == "fsdp" or (force_tp and role == "tp" and len(shape) >= 2)]
    if forced:
        n_sharded = [sum(L.placements[i] != R for i in forced) for L in layouts]
        layouts = [L for L, n in zip(layouts, n_sharded) if n == max(n_sharded)]
    return layouts


def _data_axes(mesh: MeshSpec, config: PlanConfig) -> tuple[str, ...]:
    """Axes user inputs may be sharded over: `config.data_axes`, else every axis not given the role "tp"."""
    for axis, _ in config.axis_roles:
        mesh.index(axis)
    if config.data_axes is None:
        return tuple(a for a in mesh.axis_names if config.role_of(a) != "tp")
    for a in config.data_axes:
        mesh.index(a)
    return config.data_axes


def _placeholder_space(tg: TracedGraph, info: NodeInfo, mesh: MeshSpec, config: PlanConfig,
                       data_axes: tuple[str, ...]) -> NodeSpace:
    shape = tuple(info.outputs[0].shape) if info.outputs else ()
    param = tg.param_of_placeholder(info.name)
    roles = [config.role_of(a) for a in mesh.axis_names]
    if info.role is Role.PARAMETER and param is not None and not param.is_buffer:
        return NodeSpace(info.name, "param", (), [Strategy((), L) for L in _param_layouts(shape, roles, mesh)], True,
                         param_fqn=param.fqn)
    if info.role is Role.INPUT:
        bd = config.batch_dim_of(info.name)
        shardable = bd is not None and len(shape) > 0 and shape[bd] > 1
        per_axis = [([] if role in ("ddp", "fsdp") and shardable else [R])
                    + ([Shard(bd % len(shape))] if shardable and a in data_axes else [])
                    for a, role in zip(mesh.axis_names, roles)]
        layouts = _layouts(shape, per_axis, mesh)
        if not layouts:
            data = [f"{a} (size {mesh.size(a)})" for a, role in zip(mesh.axis_names, roles) if role in ("ddp", "fsdp")]
            raise ValueError(f"user input {info.name!r} of shape {shape}: its batch dim {bd} cannot be sharded over "
                             f"the data-parallel axes {', '.join(data)} of mesh {mesh} (axis_roles "
                             f"{dict(config.axis_roles)}); use a batch divisible by their product, or another role")
        return NodeSpace(info.name, "input", (), [Strategy((), L) for L in layouts], False)
    return NodeSpace(info.name, "buffer", (), [Strategy((), Layout.replicate(mesh.ndim))], False,
                     param_fqn=param.fqn if param is not None else None)
