"""Rewrite a traced graph into the sharded torch.fx program of one rank.

Walks `TracedGraph.graph_module` in order and builds a new graph whose values are this rank's LOCAL
shards:
- placeholders: one per canonical parameter/buffer (its stored local shard; tied aliases share it), then
  the user inputs (global tensors; consumers slice them locally);
- before each call_function node, each tensor argument goes from its producer's layout to the layout the
  node consumes, through exactly the steps of `core.redistribute.edge_steps` (DESIGN.md rule 1), emitted as
  calls of the autograd-aware `collectives`; a step sequence is emitted once per (value, target layout)
  and shared by all consumers that ask for the same thing;
- shape arguments (view, reshape, expand, new_zeros, ...) are replaced by the local output shape; ops that
  create a sharded tensor from nothing (arange, zeros, ...) are emitted global and sliced locally;
- the output node's values are brought to the layouts the spec gives for it;
- the nodes emitted for a recomputed region (`spec.recompute`), its collectives included, run under
  non-reentrant `torch.utils.checkpoint` (`rewriter.recompute`).
Backward is autograd of this program (DESIGN.md rule 3): each emitted collective carries its conjugate.
"""
from __future__ import annotations

import operator
from collections.abc import Collection
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..core.layout import Layout, Partial, local_shape
from ..core.mesh import MeshSpec
from ..core.redistribute import WIDENED_FLOATS, Step, edge_steps, grad_partial_axes, sum_itemsize, widened_dtype
from ..errors import UnsupportedOpError
from ..tracer.graph import Role, TracedGraph, alias_source, carries_grad, is_view, mutated_args
from ..tracer.normalize import SPLIT_BIAS
from . import collectives, grad_sync, localize, recompute
from .grad_sync import DEFAULT_BUCKET_BYTES
from .reshard import reshard_after_forward
from .spec import ShardingSpec, axis_ranks, mesh_coords, squeeze_trivial_axes


@dataclass
class RankProgram:
    """The sharded program of one rank.

    Attributes:
        graph_module: call it as `graph_module(*local_params_and_buffers, *user_inputs)`; returns the
            traced model's outputs (flattened tuple) in the layouts of the spec's output node.
        rank: global rank the program was made for; `coords` its mesh coordinates.
        state_fqns: canonical FQN of each leading placeholder (parameters then buffers, graph order).
        input_names: placeholder names of the user inputs, in call order.
        groups: mesh axis -> the global ranks of this rank's group on that axis.
        collectives: number of emitted steps per kind (for reports and tests).
        recomputed: ids of the regions run under torch.utils.checkpoint (`rewriter.recompute`), graph order.
    """

    graph_module: torch.fx.GraphModule
    rank: int
    mesh: MeshSpec
    state_fqns: tuple[str, ...]
    input_names: tuple[str, ...]
    groups: dict[str, list[int]] = field(default_factory=dict)
    collectives: dict[str, int] = field(default_factory=dict)
    recomputed: tuple[str, ...] = ()


def rewrite(traced: TracedGraph, spec: ShardingSpec, rank: int, device: str | torch.device = "cpu",
            grad_bucket_bytes: int = DEFAULT_BUCKET_BYTES, frozen: Collection[str] | None = None) -> RankProgram:
    """Emit the sharded GraphModule of `rank` (its index on `spec.mesh`; the groups it calls collectives on
    are shifted by `spec.rank_offset`) for the decisions in `spec`. Ops of a graph traced on `meta` that
    create tensors get `device` instead (the rank's device: "cpu" under gloo, its GPU under nccl).

    The gradient sync of a replicated parameter (a `grad_all_reduce` step applied to the parameter itself,
    i.e. DDP) is emitted as `grad_sync.grad_all_reduce_bucketed`: asynchronous all-reduces of buckets of
    `grad_bucket_bytes` bytes (default 25 MiB, DDP's), overlapped with the rest of backward and waited at
    its end. `grad_bucket_bytes=0` emits the synchronous per-parameter `collectives.grad_all_reduce`
    instead. Either way the program computes the same gradients and the step is the same planned step.

    Gathered parameters (ZeRO-3 / FSDP all-gathers, `regather` steps) are freed after their last forward use
    and gathered again for backward (`rewriter.reshard`), as the planner prices them.

    Frozen parameters (`frozen`: canonical FQNs; default: those traced with requires_grad=False) get no
    gradient: their layout changes are emitted without backward, so no gradient sync exists for them, and
    values computed only from frozen parameters, buffers and inputs carry no gradient either.

    Regions of `spec.recompute` are recomputed in backward (`rewriter.recompute`).

    Collectives on a mesh axis with a hierarchical rule (`spec.hierarchy`, from `Plan.hierarchical`) get the
    rule as their last argument and run two-level where it says so for their bytes (`rewriter.hierarchical`);
    their sub-groups must exist (`spec.hierarchical_sub_groups`).

    Raises:
        UnsupportedOpError: a node has no entry in `spec`, or an op cannot run on the given layouts
            (names the node with `format_node()`, its layouts and the mesh); a recomputed region writes in
            place into a value made outside it, or is "selective" without an attention core.
        PlanMismatchError: a recomputed region has no op in the traced graph.
        IndivisibleShardError / ImpossibleRedistributionError: from `core` when a layout does not fit.
        ValueError: grad_bucket_bytes is not an int >= 0, or is 0 with a gradient codec in `spec.compression`.
    """
    if not isinstance(grad_bucket_bytes, int) or grad_bucket_bytes < 0:
        raise ValueError(f"rewrite: grad_bucket_bytes must be an int >= 0 (0 = synchronous), got {grad_bucket_bytes!r}")
    if spec.compression.lossy and not grad_bucket_bytes:
        raise ValueError(f"rewrite: gradient compression {spec.compression.kind!r} runs in the bucketed gradient sync; "
                         "grad_bucket_bytes=0 (synchronous) would all-reduce exactly. Remedy: grad_bucket_bytes > 0, "
                         "or a plan without compression")
    if frozen is None:
        frozen = {fqn for fqn, p in traced.parameters.items() if not p.requires_grad}
    return _Rewriter(traced, spec, rank, torch.device(device), grad_bucket_bytes, frozenset(frozen)).run()


class _Rewriter:
    def __init__(self, traced: TracedGraph, spec: ShardingSpec, rank: int, device: torch.device,
                 grad_bucket_bytes: int, frozen: frozenset[str]) -> None:
        spec = squeeze_trivial_axes(spec)
        self.frozen = frozen
        self.traced, self.spec, self.mesh, self.rank, self.device = traced, spec, spec.mesh, rank, device
        self.grad_bucket_bytes = grad_bucket_bytes
        self.trainable: set[torch.fx.Node] = set()    # placeholders of parameters that receive gradients
        self.groups = {axis: [r + spec.rank_offset for r in ranks]
                       for axis, ranks in axis_ranks(spec.mesh, rank).items()}
        self.coords = mesh_coords(spec.mesh, rank)
        self.graph = torch.fx.Graph()
        self.env: dict[str, torch.fx.Node] = {}        # old node name -> new node (producer layout)
        self.layout: dict[str, Layout] = {}             # old node name -> layout of env value
        self.requires_grad: dict[str, bool] = {}
        self.cache: dict[tuple, torch.fx.Node] = {}     # (old name, dst, grad axes) -> redistributed node
        self.counts: dict[str, int] = {}

    def run(self) -> RankProgram:
        state_fqns, inputs = self._placeholders()
        regions = recompute.node_regions(self.traced, self.spec.recompute)
        for node in self.traced.graph_module.graph.nodes:
            if node.op == "call_function":
                last = next(reversed(self.graph.nodes), None)  # None: nothing emitted yet (no placeholders)
                self._call(node)
                if node.name in regions:  # what was emitted for it (its collectives too) belongs to its region
                    for new in reversed(self.graph.nodes):
                        if new is last:
                            break
                        new.meta["recompute"] = regions[node.name]
            elif node.op == "output":
                self._output(node)
            elif node.op != "placeholder":
                raise UnsupportedOpError(f"cannot rewrite fx node {node.format_node()} (opcode {node.op!r}); "
                                         "only placeholders, call_function and output are supported")
        root = torch.nn.Module()
        recomputed = recompute.checkpoint_regions(self.graph, root)  # a recomputed gather needs no reshard
        reshard_after_forward(self.graph, set(self.graph.find_nodes(op="placeholder"))
                              - {self.env[name] for name in self.traced.input_names})
        gm = torch.fx.GraphModule(root, self.graph, class_name=f"Rank{self.rank}Program")
        return RankProgram(gm, self.rank, self.mesh, state_fqns, inputs, self.groups,
                           dict(sorted(self.counts.items())), tuple(recomputed))

    # -- placeholders -------------------------------------------------------------------------------
    def _placeholders(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        state, inputs = [], []
        for fqn, param in self.traced.parameters.items():
            stored = self._stored(fqn)
            new = self.graph.placeholder(_safe_name(fqn))
            state.append(fqn)
            trainable = not param.is_buffer and carries_grad(param.dtype) and fqn not in self.frozen
            if trainable:
                self.trainable.add(new)
            for ph in param.placeholders:
                self.env[ph], self.layout[ph] = new, stored
                self.requires_grad[ph] = trainable
        for name in self.traced.input_names:
            self.env[name] = self.graph.placeholder(name)
            self.layout[name] = self.spec.inputs.get(name, Layout.replicate(self.mesh.ndim))
            # a floating input may require grad at call time (a trainable module before `pm`, adversarial inputs):
            # its gradient then gets the same collectives as any value (Megatron f before a sharded op); backward
            # runs them only when it does
            self.requires_grad[name] = carries_grad(self.traced.node(name).outputs[0].dtype)
            inputs.append(name)
        return tuple(state), tuple(inputs)

    def _stored(self, fqn: str) -> Layout:
        try:
            return self.spec.params[fqn]
        except KeyError:
            raise UnsupportedOpError(f"the sharding spec has no stored layout for parameter {fqn!r} on mesh "
                                     f"{self.mesh}; re-plan for this model") from None

    # -- call_function ------------------------------------------------------------------------------
    def _call(self, node: torch.fx.Node) -> None:
        info = self.traced.node(node.name)
        sharding = self.spec.nodes.get(node.name)
        if sharding is None:
            raise UnsupportedOpError(f"the sharding spec has no entry for node {node.format_node()}; "
                                     "re-plan for this model")
        tensor_args = _tensor_args(node)
        if len(tensor_args) != len(sharding.inputs):
            raise UnsupportedOpError(f"node {node.format_node()} has {len(tensor_args)} tensor arguments but the "
                                     f"spec gives {len(sharding.inputs)} input layouts")
        grad_axes = [grad_partial_axes(layout, sharding.output, self.mesh) for layout in sharding.inputs]
        delivered = iter([self._redistribute(arg, dst, grad_axes[i])
                          for i, (arg, dst) in enumerate(zip(tensor_args, sharding.inputs))])
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: next(delivered))
        if node.meta.get(SPLIT_BIAS):  # a bias split off linear / addmm: added in the product's dtype, as they add
            cast = self.graph.call_function(bias_in_dtype_of, (args[1], args[0]))  # it (under autocast)
            cast.meta["passthrough"] = True  # read by verify: same layout and shape as its first argument
            args = (args[0], cast, *args[2:])
        if self._sums_wide(node, sharding.output):  # a pending sum of float16 / bfloat16 values: held in float32
            args, kwargs = torch.fx.node.map_arg((args, kwargs), self._widen)
            if kwargs.get("dtype") in WIDENED_FLOATS:
                kwargs = {**kwargs, "dtype": torch.float32}
        # traced on meta: create and move tensors where the rank runs, a device given by keyword (arange, _to_copy,
        # new_zeros) or by position (`aten.to.device(x, device, dtype)`: Qwen2's / Llama's rotary `inv_freq.to(
        # x.device)`; rewriting a meta-traced Qwen2 raised "found at least two devices, cpu and meta", round 25)
        args, kwargs = torch.fx.node.map_aggregate(
            (args, kwargs), lambda a: self.device if isinstance(a, torch.device) and a.type == "meta" else a)
        out_shape = info.outputs[0].shape if info.outputs else None
        ctx = localize.Context(node, self.mesh, self.groups, sharding.inputs, sharding.output, out_shape, self.coords,
                               tuple(self.traced.node(a.name).outputs[0].shape if self.traced.node(a.name).outputs
                                     else () for a in tensor_args))
        if not tensor_args and not sharding.output.is_replicated and node.target not in localize.SIZE_ARG:
            # created from nothing (arange, ...), then sliced; constant fills are made local (`localize`)
            value = self.graph.call_function(node.target, args, kwargs)
            value = self._emit(value, node.name, Layout.replicate(self.mesh.ndim), sharding.output,
                               out_shape, grad_axes=(), requires_grad=False)
        else:
            value = localize.emit(self.graph, ctx, args, kwargs)
        value.meta["source"] = node.name  # read by verify: which traced node this value stands for
        value = self._guard_empty(node, value, tensor_args, sharding)
        self.env[node.name], self.layout[node.name] = value, sharding.output
        if mutated_args(node):  # copies made before the mutation are stale: redistribute afresh for later uses
            self.cache.clear()
        self.requires_grad[node.name] = _differentiable(node) and any(
            self.requires_grad[a.name] for a in tensor_args)

    def _sums_wide(self, node: torch.fx.Node, output: Layout) -> bool:
        """Whether `node` runs on float32 copies of its float16 inputs: its output is a pending sum (Partial on a
        mesh axis) of a float16 value (`core.redistribute.WIDENED_FLOATS`; not bfloat16, which cannot overflow:
        its product is rounded once per rank, the sum over ranks runs in float32). One device computes the whole
        value with float32 accumulation and rounds it once; each rank rounding its summand instead overflowed
        float16 where the sum is finite (NaN for 8000 on tp=2, round 23 r23g). The value stays float32 up to the
        collective that completes the sum, then is rounded once (`_emit`). Not for an op that writes in place
        (its output is its input)."""
        outs = self.traced.node(node.name).outputs
        return (any(isinstance(p, Partial) for p in output) and bool(outs) and outs[0].dtype in WIDENED_FLOATS
                and not mutated_args(node))

    def _widen(self, arg: torch.fx.Node) -> torch.fx.Node:
        """`arg` as float32 when it is float16 / bfloat16 at run time (`as_sum_dtype`), else itself."""
        wide = self.graph.call_function(as_sum_dtype, (arg,))
        wide.meta["passthrough"] = True  # read by verify: same layout and shape as its first argument
        return wide

    def _guard_empty(self, node: torch.fx.Node, value: torch.fx.Node, tensor_args: list[torch.fx.Node],
                     sharding) -> torch.fx.Node:
        """Wrap an op whose local input or output shard is empty on SOME rank of the mesh in
        `localize.empty_shard_guard` when inputs carry gradients, on every rank (the decision is the same on
        all of them), so that every rank runs the same collectives in backward."""
        if (not isinstance(node.meta.get("val"), torch.Tensor) or node.target is operator.getitem
                or not _differentiable(node) or is_view(node) or mutated_args(node)):
            return value  # views and in-place ops keep their gradient path on empty tensors
        shapes = [(self.traced.node(a.name).outputs[0].shape, L) for a, L in zip(tensor_args, sharding.inputs)
                  if self.traced.node(a.name).outputs]
        shapes.append((self.traced.node(node.name).outputs[0].shape, sharding.output))
        if not any(0 in local_shape(tuple(sh), L, self.mesh, mesh_coords(self.mesh, r))
                   for sh, L in shapes for r in range(self.mesh.world_size)):
            return value
        grads = [self._redistribute(a, L, grad_partial_axes(L, sharding.output, self.mesh))  # (cached: no new steps)
                 for a, L in zip(tensor_args, sharding.inputs) if self.requires_grad[a.name]]
        if not grads:
            return value
        guarded = self.graph.call_function(localize.empty_shard_guard, (value, *grads),
                                           {"fresh": True} if _written_later(node) else {})
        guarded.meta["passthrough"] = True  # read by verify: same layout and shape as its first argument
        return guarded

    def _redistribute(self, arg: torch.fx.Node, dst: Layout, grad_axes: tuple[str, ...]) -> torch.fx.Node:
        src = self.layout[arg.name]
        key = (arg.name, str(dst), grad_axes)
        if key not in self.cache:
            shape = self.traced.node(arg.name).outputs[0].shape
            self.cache[key] = self._emit(self.env[arg.name], arg.name, src, dst, shape, grad_axes,
                                         self.requires_grad[arg.name])
        return self.cache[key]

    def _emit(self, value: torch.fx.Node, name: str, src: Layout, dst: Layout, shape, grad_axes,
              requires_grad: bool) -> torch.fx.Node:
        dtype = self.traced.node(name).outputs[0].dtype
        is_parameter = self.traced.node(name).role is Role.PARAMETER
        steps = edge_steps(src, dst, tuple(shape), self.mesh, itemsize=dtype.itemsize,
                           grad_partial_axes=grad_axes if requires_grad else (), requires_grad=requires_grad,
                           is_parameter=is_parameter, sum_bytes=sum_itemsize(dtype))
        if is_parameter and requires_grad and any(s.kind in ("grad_all_reduce", "all_gather") for s in steps):
            _refuse_sparse_gradient(self.traced.node(name), steps)
        for step in steps:
            value = self._emit_step(value, step, tuple(shape))
            if dtype in WIDENED_FLOATS and _pending(step.before) and not _pending(step.after):  # sum complete:
                value = self.graph.call_function(torch.Tensor.to, (value, dtype))  # rounded once (`_sums_wide`)
                value.meta["passthrough"] = True
        return value

    def _emit_step(self, value: torch.fx.Node, step: Step, shape: tuple[int, ...]) -> torch.fx.Node:
        """Append the collective of one step; the node is named "<kind>_<mesh axis>" so `gm.code` shows it.
        Gathers and all-to-alls are told the size of the dim they assemble (uneven chunks, `core.layout`)."""
        ranks = self.groups[step.mesh_axis]
        self.counts[step.kind] = self.counts.get(step.kind, 0) + 1
        gathered = (lambda: local_shape(shape, Layout.parse(step.after), self.mesh, self.coords)[step.tensor_dim])
        if step.kind == "grad_all_reduce" and value in self.trainable and self.grad_bucket_bytes:
            fn, args = grad_sync.grad_all_reduce_bucketed, (value, ranks, self.grad_bucket_bytes)
            if self.spec.compression.lossy or step.mesh_axis in self.spec.hierarchy:  # positional: codec, rule
                args += (self.spec.compression.spec if self.spec.compression.lossy else "",)
        elif step.kind == "all_gather":
            fn = collectives.all_gather_rs if step.bwd_kind == "reduce_scatter" else collectives.all_gather
            args = (value, step.tensor_dim, ranks, gathered())
        elif step.kind in ("reduce_scatter", "local_slice"):
            fn, args = getattr(collectives, step.kind), (value, step.tensor_dim, ranks)
        elif step.kind in ("all_reduce", "grad_all_reduce"):
            fn, args = getattr(collectives, step.kind), (value, ranks)
        elif step.kind == "all_to_all":
            fn, args = collectives.all_to_all, (value, step.tensor_dim, step.dst_dim, ranks, gathered())
        else:
            raise UnsupportedOpError(f"no collective for step {step}")
        if step.mesh_axis in self.spec.hierarchy and step.kind != "all_to_all":  # the plan's two-level rule
            args = (*args, self.spec.hierarchy[step.mesh_axis])
        out = self.graph.create_node("call_function", fn, args, name=f"{fn.__name__}_{step.mesh_axis}")
        out.meta["step"] = step
        out.meta["global_shape"] = shape
        if step.reduce_op == "avg":  # Partial(avg): the reduced sum is divided by the group size
            out = self.graph.call_function(torch.ops.aten.div.Scalar, (out, len(ranks)))
            out.meta["step"] = step
        return out

    # -- output -------------------------------------------------------------------------------------
    def _output(self, node: torch.fx.Node) -> None:
        sharding = self.spec.nodes.get(node.name)
        tensor_args = _tensor_args(node)
        dsts = sharding.inputs if sharding else tuple(Layout.replicate(self.mesh.ndim) for _ in tensor_args)
        delivered = iter([self._redistribute(a, dst, ()) for a, dst in zip(tensor_args, dsts)])
        self.graph.output(torch.fx.node.map_arg(node.args, lambda a: next(delivered))[0])


def _refuse_sparse_gradient(info, steps) -> None:
    """Raise UnsupportedOpError when the parameter of NodeInfo `info` feeds an `nn.Embedding(sparse=True)`
    (a sparse gradient) and its gradient crosses ranks (`steps`: a DDP all-reduce, an FSDP reduce-scatter):
    the collectives move dense tensors. Before, the first backward raised torch's "reshape is not implemented
    for sparse tensors" (ddp) or "unsupported memory format option Contiguous" (fsdp) from inside the
    gradient sync."""
    for user in info.node.users:
        sparse = user.args[4] if len(user.args) > 4 else user.kwargs.get("sparse", False)
        if user.target is torch.ops.aten.embedding.default and sparse:
            step = next(s for s in steps if s.kind in ("grad_all_reduce", "all_gather"))
            raise UnsupportedOpError(
                f"parameter {info.param_fqn or info.name!r} feeds node {user.name} (nn.Embedding(sparse=True)): "
                f"its sparse gradient would cross ranks over mesh axis {step.mesh_axis!r} ({step.kind}), and the "
                "gradient collectives move dense tensors. Remedy: nn.Embedding(sparse=False) (dense gradients; Adam "
                "or SGD instead of SparseAdam), or a mesh where the embedding weight is stored and used sharded "
                "(axis_roles 'tp') so its gradient stays local")


def _tensor_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The fx-node arguments of a node, one per use, in map_arg order (args, then kwargs); the planner
    gives one input layout per entry (`NodeSharding.inputs`)."""
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


_NON_DIFFERENTIABLE = {torch.ops.aten.detach.default, torch.ops.aten.arange.default,
                       torch.ops.aten.arange.start, torch.ops.aten.arange.start_step}


def _written_later(node: torch.fx.Node) -> bool:
    """Whether an in-place op writes `node`'s output later, directly or through views of it."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        for user in n.users:
            if any(p < len(user.args) and user.args[p] is n for p in mutated_args(user)):
                return True
            if alias_source(user) is n and user not in seen:
                seen.add(user)
                stack.append(user)
    return False


def _differentiable(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    leaves = [t for t in pytree.tree_leaves(val) if isinstance(t, torch.Tensor)]
    return node.target not in _NON_DIFFERENTIABLE and any(carries_grad(t.dtype) for t in leaves)


def _safe_name(fqn: str) -> str:
    return "p_" + fqn.replace(".", "_")


def _pending(layout: str) -> bool:
    """Whether a layout (string form) holds a pending sum (Partial) on some mesh axis."""
    return any(isinstance(p, Partial) for p in Layout.parse(layout))


def as_sum_dtype(x: torch.Tensor) -> torch.Tensor:
    """`x` in the dtype a widened op computes in (`core.redistribute.widened_dtype`: float32 for float16 /
    bfloat16, exact), itself otherwise; the input of an op whose output is a pending sum (`_Rewriter._sums_wide`)."""
    return x.to(widened_dtype(x.dtype)) if isinstance(x, torch.Tensor) else x


def bias_in_dtype_of(bias: torch.Tensor, product: torch.Tensor) -> torch.Tensor:
    """`bias` in `product`'s dtype: the bias split off a linear / addmm (`tracer.normalize.SPLIT_BIAS`) as those ops
    add it (under a torch.autocast the trace did not see, the product is bf16 and the bias fp32); itself when the
    dtypes agree. A Python helper: with `aten.type_as.default` as the op node instead, the ranks of a 3-D
    scaled_dot_product_attention model (tests/distributed/test_attention_ranks_run.py) died with SIGSEGV in the
    attention op downstream (cause not isolated; `Tensor.type_as` in a helper ran clean)."""
    return bias if bias.dtype == product.dtype else bias.to(product.dtype)


class AsEmitted(torch.fx.Interpreter):
    """Runs a traced (or stage) graph with the emitted program's dtype semantics: a split bias
    (`tracer.normalize.SPLIT_BIAS`) is added in the product's dtype (`bias_in_dtype_of`), as `RankProgram` does;
    the rest as the graph says. For what infers dtypes from the unsharded graph under autocast
    (`runtime.pipeline.boundary_dtypes`)."""

    def run_node(self, n: torch.fx.Node):
        if n.op == "call_function" and n.meta.get(SPLIT_BIAS):
            product, bias, *rest = self.map_nodes_to_values(n.args, n)
            return n.target(product, bias_in_dtype_of(bias, product), *rest, **n.kwargs)
        return super().run_node(n)
