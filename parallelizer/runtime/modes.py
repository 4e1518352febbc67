"""One program per module mode: re-trace a model in another train/eval mode and reuse the plan's decisions.

Export bakes the mode into the graph: `batch_norm(..., training=True, ...)`, `dropout(x, p, train=True)`,
and any Python branch on `self.training` (a router's jitter noise, an auxiliary loss). So `ParallelModule`
keeps one program per mode and makes a new one the first time a mode is used:

1. `Retracer` holds a skeleton of the model: a deep copy whose parameters and buffers are FakeTensors
   (shapes, dtypes and devices only; no storage), made when the `ParallelModule` is built. Setting the
   skeleton's modules to the wanted mode and tracing it on the call's inputs gives the mode's graph, with
   the same tracer (and normalisations) as the first program.
2. `carry_over` turns the plan's `ShardingSpec` (made for the first graph) into one for the new graph,
   without planning again: every parameter and buffer keeps its stored layout (the new program reads the
   very same local shards), and every op keeps the strategy its namesake had when it is the same
   computation: same op, same shapes and dtypes of its tensor inputs and outputs, and the same non-tensor
   arguments except the mode arguments themselves (schema arguments named `training`, `train`,
   `use_input_stats`, whatever the op). For BatchNorm and dropout models every op matches, so the eval
   program has exactly the plan's collectives.
3. An op the first graph does not have (a branch taken only in this mode) runs replicated: its tensor
   inputs are brought to Replicate and its output is Replicate, which is correct for every op, at the cost
   of the all-gathers it needs. Such ops are listed in `ModeProgram.replicated` and announced with a
   warning, never silently.

Limits: a mode graph whose parameters differ from the first graph's (another set, or other shapes) cannot
reuse the stored shards (`PlanMismatchError`); an in-place op of the new graph whose written argument would
have to be redistributed (a copy would be written, not the tensor) raises `UnsupportedOpError`; the
skeleton is a deep copy of the model's modules, so a model that cannot be deep-copied cannot change mode
(the error says so when the mode changes). `ParallelModule` mirrors every module of the model
(`runtime.mirror`), so each one's mode is its own; a module's plain settings changed after the
ParallelModule was built (a Dropout's `p`, a BatchNorm's `momentum`) select a program the same way: the
skeleton is traced with them applied.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from ..core.layout import Layout
from ..errors import PlanMismatchError, UnsupportedOpError
from ..rewriter.apply import RankProgram, _tensor_args
from ..rewriter.recompute import recompute_within
from ..rewriter.spec import NodeSharding, ShardingSpec
from ..tracer.graph import AUTOCAST_DEVICES, TracedGraph, alias_source, mutated_args
from ..tracer.trace import trace
from .mirror import apply_settings, restore_settings
from .module_copy import copy_module

MODE_ARGUMENTS = frozenset({"training", "train", "use_input_stats"})
"""Schema argument names of ATen ops that carry the module mode (batch_norm, instance_norm, dropout and its
variants, rrelu_with_noise, native_dropout)."""


@dataclass
class ModeProgram:
    """The program of one (mode, frozen parameters) key: its traced graph, spec and rank program.
    `replicated` lists the ops computed replicated because the plan's graph has no counterpart."""

    traced: TracedGraph
    spec: ShardingSpec
    program: RankProgram
    replicated: tuple[str, ...] = ()


@dataclass
class Retracer:
    """A storage-free skeleton of the model (FakeTensor parameters and buffers) to trace other modes with.

    `error` holds why no skeleton could be made (the model could not be deep-copied); tracing then raises.
    """

    skeleton: torch.nn.Module | None
    fake_mode: FakeTensorMode | None
    error: str = ""
    names: tuple[str, ...] = field(default=())

    @classmethod
    def of(cls, model: torch.nn.Module) -> "Retracer":
        """The skeleton of `model` (its modules deep-copied, every tensor replaced by a FakeTensor)."""
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        memo: dict[int, torch.Tensor] = {}
        for t in (*model.parameters(), *model.buffers()):
            fake = mode.from_tensor(t.detach())
            memo[id(t)] = torch.nn.Parameter(fake, t.requires_grad) if isinstance(t, torch.nn.Parameter) else fake
        try:
            skeleton = copy_module(model, memo)
        except Exception as exc:  # any object a module holds may refuse to be copied
            return cls(None, None, "the model could not be deep-copied into a storage-free skeleton when the "
                                   f"ParallelModule was built ({type(exc).__name__}: {exc}); make it deep-copyable")
        return cls(skeleton, mode, "", tuple(name for name, _ in skeleton.named_modules()))

    def trace(self, modes: dict[str, bool], args: tuple, kwargs: dict, changes: tuple = (), *,
              allow_frozen_host_random: bool = False) -> TracedGraph:
        """Trace the skeleton on `args`/`kwargs` with each module in the mode of its nearest entry in `modes`
        (module name -> training; "" is the root) and the settings `changes` applied
        (`runtime.mirror.changed_settings`: (module name, attribute, value), e.g. a Dropout's p).
        `allow_frozen_host_random`: as `parallelizer.trace` (the first trace's choice, `TracedGraph.
        allow_frozen_host_random`: a model traced in eval mode and switched to train() is refused when its
        training forward draws from numpy / Python random, unless the first trace allowed it).

        Raises:
            PlanMismatchError: the model could not be deep-copied into a skeleton (says why and what to do).
            TraceError: as `parallelizer.trace`.
        """
        if self.skeleton is None:
            raise PlanMismatchError(
                f"cannot trace the model in another train/eval mode: {self.error}. Remedy: trace and plan the "
                "model in the mode you want and build a ParallelModule for that (or switch the mode back)")
        for name, module in self.skeleton.named_modules():
            module.training = modes[_nearest(name, modes)]
        undo = apply_settings(self.skeleton, changes)
        try:
            return trace(self.skeleton, args, kwargs, allow_frozen_host_random=allow_frozen_host_random)
        finally:
            restore_settings(undo)


def _nearest(name: str, known: dict[str, bool]) -> str:
    """The longest name in `known` that is `name` or an ancestor module path of it ("" = the root)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def carry_over(spec: ShardingSpec, planned: TracedGraph, new: TracedGraph) -> tuple[ShardingSpec, tuple[str, ...]]:
    """The decisions of `spec` (made for graph `planned`) applied to graph `new` (module docstring).

    Returns:
        (spec for `new`, names of the ops of `new` computed replicated because `planned` has no counterpart).
    Raises:
        PlanMismatchError: a parameter or buffer of `new` is not in `planned` with the same shape.
        UnsupportedOpError: an in-place op of `new` would write a redistributed copy of its argument.
    """
    params: dict[str, Layout] = {}
    for fqn, p in new.parameters.items():
        old = planned.parameters.get(fqn)
        if old is None and p.is_constant:
            params[fqn] = Layout.replicate(spec.mesh.ndim)  # a tensor made in forward only in this mode
            continue
        if old is None or old.shape != p.shape:
            raise PlanMismatchError(
                f"{fqn!r}: the model traced in this mode has {'no' if old is None else 'another'} such tensor "
                f"({p.shape} vs {None if old is None else old.shape}), so the stored shards cannot be reused. "
                "Remedy: trace and plan the model in this mode and build a ParallelModule for it")
        params[fqn] = spec.params[fqn]
    replicate = Layout.replicate(spec.mesh.ndim)
    nodes: dict[str, NodeSharding] = {}
    replicated: list[str] = []
    for info in new.compute_nodes():
        if _same_computation(info.name, planned, new) and info.name in spec.nodes:
            nodes[info.name] = spec.nodes[info.name]
        else:
            nodes[info.name] = NodeSharding(tuple(replicate for _ in _tensor_args(info.node)), replicate)
            replicated.append(info.name)
    out_new = _tensor_args(new.graph_module.graph.output_node())
    out_old = _tensor_args(planned.graph_module.graph.output_node())
    same_outputs = [new.node(a.name).outputs for a in out_new] == [planned.node(a.name).outputs for a in out_old]
    nodes["output"] = spec.nodes["output"] if same_outputs and "output" in spec.nodes else \
        NodeSharding(tuple(replicate for _ in out_new), replicate)
    result = ShardingSpec(spec.mesh, nodes, params, dict(spec.inputs), spec.rank_offset,
                          recompute_within(spec.recompute, [n.name for n in new.compute_nodes()], new),
                          spec.compression, spec.hierarchy, spec.autocast, spec.zero1)
    _check_mutations(result, new)
    return result, tuple(replicated)


def _same_computation(name: str, planned: TracedGraph, new: TracedGraph) -> bool:
    """Whether node `name` of `new` computes what its namesake in `planned` does, mode arguments aside."""
    if name not in planned.nodes:
        return False
    a, b = planned.node(name), new.node(name)
    if a.op != b.op or a.target != b.target or a.outputs != b.outputs:
        return False
    args_a, args_b = _tensor_args(a.node), _tensor_args(b.node)
    if [planned.node(x.name).outputs for x in args_a] != [new.node(x.name).outputs for x in args_b]:
        return False
    return _scalar_args(a.node) == _scalar_args(b.node)


def _scalar_args(node: torch.fx.Node) -> dict:
    """The non-tensor arguments of `node` by schema name (position when unnamed), mode arguments left out."""
    schema = getattr(node.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    blank = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: None)
    out = {(names[i] if i < len(names) else str(i)): repr(v) for i, v in enumerate(blank[0])}
    out.update({k: repr(v) for k, v in blank[1].items()})
    return {k: v for k, v in out.items() if k not in MODE_ARGUMENTS}


def _check_mutations(spec: ShardingSpec, traced: TracedGraph) -> None:
    """Every argument an op writes in place (and each view on the way to its base) must reach the op in its
    producer's layout; otherwise the op would write a copy and the write would be lost."""
    def produced(node: torch.fx.Node) -> Layout:
        info = traced.node(node.name)
        if info.param_fqn is not None:
            return spec.params[info.param_fqn]
        if node.name in spec.nodes:
            return spec.nodes[node.name].output
        return spec.inputs.get(node.name, Layout.replicate(spec.mesh.ndim))

    for info in traced.compute_nodes():
        for pos in mutated_args(info.node):
            consumer, arg = info.node, info.node.args[pos] if pos < len(info.node.args) else None
            while isinstance(arg, torch.fx.Node):
                k = _tensor_args(consumer).index(arg)
                if spec.nodes[consumer.name].inputs[k] != produced(arg):
                    raise UnsupportedOpError(
                        f"in this mode, {info.node.format_node()} writes its argument {arg.name} in place, but "
                        f"the plan's layouts would hand it a redistributed copy ({produced(arg)} -> "
                        f"{spec.nodes[consumer.name].inputs[k]} on mesh {spec.mesh}), so the write would be "
                        "lost. Remedy: trace and plan the model in this mode and build a ParallelModule for it")
                if alias_source(arg) is None:
                    break
                consumer, arg = arg, alias_source(arg)


def autocast_exactly(wanted: tuple[tuple[str, torch.dtype], ...]) -> contextlib.ExitStack:
    """A context with torch.autocast enabled for exactly the (device type, dtype) pairs `wanted` and disabled on the
    other `tracer.graph.AUTOCAST_DEVICES` that have it enabled now. A mode is traced again under the autocast the
    planned graph was traced under (`TracedGraph.autocast`), whatever autocast is around the call, and its program
    runs under the caller's, as the planned one does. Round 20 (r20f): an eval forward under the user's autocast (or
    a bf16 plan's) was traced with it, every output bfloat16, so no op matched its planned namesake (`carry_over`)
    and all of them ran replicated on every rank."""
    stack = contextlib.ExitStack()
    want = dict(wanted)
    for device in AUTOCAST_DEVICES:
        if device in want:
            stack.enter_context(torch.autocast(device, dtype=want[device]))
        elif torch.is_autocast_enabled(device):
            stack.enter_context(torch.autocast(device, enabled=False))
    return stack
