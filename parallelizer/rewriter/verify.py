"""Verify an emitted rank program against its sharding spec before it runs (DESIGN.md rule 1).

Two independent checks, by abstract interpretation of the emitted graph:
1. layouts: starting from the stored layouts of parameters and the replicated user inputs, every
   collective node must turn exactly its step's `before` layout into its `after` layout, and every tensor
   argument of a rewritten op must arrive in the layout the spec says the op consumes; an edge whose
   producer and consumer layouts differ without its collective in the program is caught here;
2. local shapes: the program runs on fake tensors (FakeTensorMode) (collectives replaced by their shape effect) and each
   rewritten op's local output shape must equal this rank's `local_shape(global shape, output layout, mesh,
   coords)` (shards may be uneven).
Failures raise `VerificationError` naming the traced node (`format_node()`), the layouts and the mesh.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils import _pytree as pytree

from ..core.layout import Layout, local_shape
from ..core.redistribute import Step
from ..errors import ParallelizerError
from ..tracer.graph import TracedGraph
from .apply import RankProgram, _tensor_args
from .recompute import inline_regions
from .spec import ShardingSpec, mesh_coords, squeeze_trivial_axes


class VerificationError(ParallelizerError):
    """The emitted program disagrees with its plan (a missing or extra collective, or a wrong local shape)."""


def verify(program: RankProgram, traced: TracedGraph, spec: ShardingSpec) -> None:
    """Check `program` (module docstring). Raises VerificationError on the first disagreement."""
    spec = squeeze_trivial_axes(spec)  # as the rewriter saw it
    program = dataclasses.replace(program, graph_module=inline_regions(program.graph_module))  # flat
    _check_layouts(program, traced, spec)
    with FakeTensorMode(allow_non_fake_inputs=True):
        _ShapeRun(program, traced, spec).run(*_fake_inputs(program, traced, spec))


def _check_layouts(program: RankProgram, traced: TracedGraph, spec: ShardingSpec) -> None:
    mesh = spec.mesh
    placeholders = [n for n in program.graph_module.graph.nodes if n.op == "placeholder"]
    layouts: dict[torch.fx.Node, str] = {}  # emitted node -> its layout, shard dims made non-negative
    for node, fqn in zip(placeholders, program.state_fqns):
        layouts[node] = str(spec.params[fqn].normalized(len(traced.parameters[fqn].shape)))
    for node in placeholders[len(program.state_fqns):]:
        arriving = spec.inputs.get(node.name, Layout.replicate(mesh.ndim))
        layouts[node] = str(arriving.normalized(len(traced.node(node.name).outputs[0].shape)))
    for node in program.graph_module.graph.nodes:
        step: Step | None = node.meta.get("step")
        if node.meta.get("passthrough") or (step is not None and (
                step.kind == "grad_all_reduce" or node.target is torch.ops.aten.div.Scalar)):
            layouts[node] = layouts[node.args[0]]  # layout unchanged
        elif step is not None:
            before = layouts.get(node.args[0])
            if before != step.before:
                raise VerificationError(f"collective {node.format_node()} expects layout {step.before} on mesh "
                                        f"{mesh} but its input has {before}")
            layouts[node] = step.after
        elif "source" not in node.meta:  # created from nothing (then sliced), or a scalar helper
            if node.op == "call_function" and not _tensor_args(node):
                layouts[node] = str(Layout.replicate(mesh.ndim))
        else:
            original = traced.node(node.meta["source"]).node
            sharding = spec.nodes[original.name]
            for arg, delivered, expected in zip(_tensor_args(original), _tensor_args(node), sharding.inputs):
                want = str(expected.normalized(len(traced.node(arg.name).outputs[0].shape)))
                if layouts.get(delivered) != want:
                    raise VerificationError(
                        f"edge {arg.name} -> {original.format_node()}: the op consumes {want} on mesh {mesh} "
                        f"but the emitted program delivers {layouts.get(delivered)}; its redistribution is missing")
            out_nd = len(traced.node(original.name).outputs[0].shape) if traced.node(original.name).outputs else 0
            layouts[node] = str(sharding.output.normalized(out_nd))


def _fake_inputs(program: RankProgram, traced: TracedGraph, spec: ShardingSpec) -> list[torch.Tensor]:
    coords = mesh_coords(spec.mesh, program.rank)
    out = []
    for fqn in program.state_fqns:
        p = traced.parameters[fqn]
        out.append(torch.empty(local_shape(p.shape, spec.params[fqn], spec.mesh, coords), dtype=p.dtype))
    for name in program.input_names:
        meta = traced.node(name).outputs[0]
        layout = spec.inputs.get(name, Layout.replicate(spec.mesh.ndim))
        out.append(torch.empty(local_shape(meta.shape, layout, spec.mesh, coords), dtype=meta.dtype))
    return out


_VALUE_DEPENDENT = (DataDependentOutputException, GuardOnDataDependentSymNode)


class _ShapeRun(torch.fx.Interpreter):
    """Runs the program on fake tensors: collectives and our Python helpers only change shapes."""

    def __init__(self, program: RankProgram, traced: TracedGraph, spec: ShardingSpec) -> None:
        super().__init__(program.graph_module)
        self.program, self.traced, self.spec = program, traced, spec
        self.coords = mesh_coords(spec.mesh, program.rank)

    def _eager_on_empty(self, n: torch.fx.Node):
        """The op run eagerly on real tensors when some input is EMPTY (a rank's chunk of a dim shorter than
        the mesh, e.g. a batch of 4 on 3 ranks: 2, 2, 0), as fake shapes; None when no input is empty or eager
        fails too. Some meta kernels reject empty inputs that the eager kernel accepts (linalg_vector_norm with
        ord=inf on a (0, T, H) shard: "cannot compute the inf norm on the dimension -1"), and the rank runs the
        eager kernel. Zero elements: nothing is computed."""
        if n.op != "call_function":
            return None
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not any(t.numel() == 0 for t in tensors) or any(t.numel() > 1 << 16 for t in tensors):
            return None
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            real = pytree.tree_map_only(torch.Tensor, lambda t: torch.zeros(tuple(t.shape), dtype=t.dtype),
                                        (args, kwargs))
            try:
                out = n.target(*real[0], **real[1])
            except RuntimeError:
                return None
        # (under the interpreter's fake mode again: the shapes of `out`, as fake tensors)
        return pytree.tree_map_only(torch.Tensor, lambda t: torch.empty(tuple(t.shape), dtype=t.dtype), out)

    def _value_dependent(self, n: torch.fx.Node, exc: Exception):
        """The spec's local shape of an op whose fake kernel must read tensor VALUES to run at all, None for any
        other failure. torch.istft checks that its window's overlap-add has no zero with `aten.equal` (and the
        ranks run it on real tensors): the verifier raised VerificationError "cannot run on its local shapes"
        for every plan of a model calling it, a runnable program refused (trial r14a). Its shape is the
        traced global shape under the node's layout, as for the spec's own helpers; one output only."""
        if not isinstance(exc, _VALUE_DEPENDENT) and not isinstance(exc.__cause__, _VALUE_DEPENDENT):
            return None
        if "source" not in n.meta or len(self.traced.node(n.meta["source"]).outputs) != 1:
            return None
        expected = self._expected(n)
        return None if expected is None else torch.empty(expected, dtype=self.traced.node(n.meta["source"]).outputs[0].dtype)

    def run_node(self, n: torch.fx.Node):
        if n.meta.get("passthrough"):
            return self.env[n.args[0]]
        step: Step | None = n.meta.get("step")
        if step is not None:
            x = self.env[n.args[0]]
            if "global_shape" not in n.meta:  # the division of a Partial(avg) reduction
                return torch.empty(tuple(x.shape), dtype=x.dtype)
            after = Layout.parse(step.after)
            return torch.empty(local_shape(n.meta["global_shape"], after, self.spec.mesh, self.coords), dtype=x.dtype)
        custom = n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload) \
            and getattr(n.target, "__module__", "") != "_operator"
        if custom and "source" not in n.meta:
            return 0  # scalar helpers (e.g. the first row of a vocabulary shard)
        if custom:  # a Python helper standing for one traced op: trust the spec's shape, checked elsewhere
            info = self.traced.node(n.meta["source"])
            return torch.empty(self._expected(n) or (), dtype=info.outputs[0].dtype)
        try:
            result = super().run_node(n)
        except (RuntimeError, ValueError) as exc:  # the op does not accept the local shapes (or strides) it is
            # given (fake tensors raise ValueError where real ones raise RuntimeError, e.g. an invalid view)
            result = self._eager_on_empty(n)
            if result is None:
                result = self._value_dependent(n, exc)
            if result is not None:
                return result
            where = self.traced.node(n.meta["source"]).node.format_node() if "source" in n.meta else n.format_node()
            raise VerificationError(f"rank {self.program.rank}: {where} cannot run on its local shapes on mesh "
                                    f"{self.spec.mesh}: {str(exc).splitlines()[0]}") from exc
        if "source" in n.meta:
            tensors = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
            expected = self._expected(n)
            if tensors and expected is not None and tuple(tensors[0].shape) != expected:
                info = self.traced.node(n.meta["source"])
                raise VerificationError(
                    f"rank {self.program.rank}: local shape of {info.node.format_node()} is "
                    f"{tuple(tensors[0].shape)}, but layout {self.spec.nodes[info.name].output} of global shape "
                    f"{info.outputs[0].shape} on mesh {self.spec.mesh} gives {expected}")
        return result

    def _expected(self, n: torch.fx.Node) -> tuple[int, ...] | None:
        info = self.traced.node(n.meta["source"])
        if not info.outputs:
            return None
        return local_shape(info.outputs[0].shape, self.spec.nodes[info.name].output, self.spec.mesh, self.coords)
