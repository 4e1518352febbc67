"""`TracedGraph`: the ATen-level graph of a model with the facts every later stage needs.

Each node records its output tensor shapes and dtypes (from fake tensors), its role, the module that owns
it, and, when it sits in a repeated block (e.g. layer 3 of the 12 identical `transformer.h.*` layers of
GPT-2), which block instance and which position inside the block it has. `TracedGraph.tensor_inputs` checks a
call's inputs against the traced ones (the helpers below it). Facts about single nodes (aliasing, in-place writes,
random draws, kept metadata) live in `tracer.node_facts` and are re-exported here.
"""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import ConstantInputError, InputMismatchError, PlanMismatchError, UnknownNodeError
from .call_defaults import drop_passed_defaults, fill_omitted_defaults
from .node_facts import (AUTOCAST_DEVICES, COPIED_META, UNDECLARED_ALIASES, alias_source,  # noqa: F401 (re-exported:
                         ambient_autocast, as_real, carries_grad, draws_random, is_view,  # their home was this module)
                         may_alias, meta_like, mutated_args, returns_written, written_through)


class Role(str, enum.Enum):
    """What a node is to the training step."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    INPUT = "input"
    ACTIVATION = "activation"
    OUTPUT = "output"


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape and dtype of one tensor produced by a node. `nbytes` is shape product times element size."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"


@dataclass(slots=True)
class NodeInfo:
    """One fx node with its metadata.

    Attributes:
        name: the fx node name (unique in the graph).
        node: the `torch.fx.Node` itself (in `TracedGraph.graph_module`).
        op: fx opcode: "placeholder", "call_function", "output" (get_attr only for lifted constants).
        target: the ATen `OpOverload` (or `operator.getitem`) of a call_function node, else None.
        role: parameter / buffer / input / activation / output.
        outputs: shape and dtype of each tensor the node produces (a tuple; empty when it produces none).
        module_fqn: fully qualified name of the innermost module whose forward created the node ("" for the
            root module); for parameters and buffers, the module that owns them.
        param_fqn: for parameter/buffer placeholders, the canonical FQN (as `model.named_parameters()` or
            `named_buffers()` gives it).
        block: the repeated-block instance the node belongs to (e.g. "transformer.h.3"), else None.
        block_group: the group of identical blocks (e.g. "transformer.h.*"), else None.
        block_index: index of the instance inside its group (0-based), else None.
        position: index of the node inside its block instance; equal positions in two instances of one
            group hold the same op on the same shapes.
        checkpoint: the user's `torch.utils.checkpoint` region the node was traced in (its name, see
            `TracedGraph.user_recompute`), else None.
    """

    name: str
    node: torch.fx.Node
    op: str
    target: object
    role: Role
    outputs: tuple[TensorMeta, ...]
    module_fqn: str
    param_fqn: str | None = None
    block: str | None = None
    block_group: str | None = None
    block_index: int | None = None
    position: int | None = None
    checkpoint: str | None = None

    @property
    def op_name(self) -> str:
        """Short op name, e.g. "aten.linear.default" or "getitem"; the opcode for non-call nodes."""
        if self.op != "call_function":
            return self.op
        if isinstance(self.target, torch._ops.OpOverload):
            return str(self.target)
        return getattr(self.target, "__name__", str(self.target))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.outputs)


@dataclass(slots=True)
class ParamInfo:
    """One parameter or buffer, counted once even when several module attributes share it (tied weights).

    Attributes:
        fqn: canonical FQN (the first name `named_parameters()` reports for it).
        aliases: the other FQNs of the same tensor (e.g. ("lm_head.weight",) for GPT-2's tied wte).
        shape, dtype: of the full (unsharded) tensor.
        placeholders: the graph placeholders that stand for it (one per FQN that export lifted).
        uses: call_function nodes that read it, in graph order (two for GPT-2's tied embedding/lm_head).
        is_buffer: True for buffers (not trained).
        is_constant: True for a tensor created inside forward (e.g. `torch.tensor([1., 2.])`, or the index
            list of `x[..., [-2], :]`), which export lifts to a constant input named `lifted_tensor_N`: stored
            like a buffer (is_buffer is True too) but not part of the model's state dict; its value is
            `TracedGraph.constant_values()[fqn]`.
        requires_grad: True for a parameter the model trains; False for a frozen parameter
            (`requires_grad=False` when traced: no gradient, no gradient sync, no optimizer state) and for
            buffers.
        persistent: whether it is in the model's `state_dict()` (False for buffers registered with
            `persistent=False`, such as a rotary `inv_freq`, and for lifted constants).
        block, block_group, block_index: the repeated block whose nodes use it, when all uses sit in one.
    """

    fqn: str
    aliases: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    placeholders: tuple[str, ...]
    uses: tuple[str, ...]
    is_buffer: bool = False
    is_constant: bool = False
    requires_grad: bool = True
    persistent: bool = True
    block: str | None = None
    block_group: str | None = None
    block_index: int | None = None

    @property
    def numel(self) -> int:
        return TensorMeta(self.shape, self.dtype).numel

    @property
    def nbytes(self) -> int:
        return TensorMeta(self.shape, self.dtype).nbytes


@dataclass(frozen=True, slots=True)
class BlockGroup:
    """Structurally identical module instances, e.g. name "transformer.h.*" with members "transformer.h.0".. .

    `nodes[i]` lists the node names of member i in graph order; all members have the same length and the
    same op at each position.
    """

    name: str
    module_type: str
    members: tuple[str, ...]
    nodes: tuple[tuple[str, ...], ...]

    @property
    def count(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        return (f"BlockGroup({self.name!r}, {self.count} x {self.module_type.rpartition('.')[2]}, "
                f"{self.nodes_per_block} nodes each)")

    @property
    def nodes_per_block(self) -> int:
        return len(self.nodes[0])


@dataclass
class TracedGraph:
    """The traced model: an ATen-level fx graph plus per-node and per-parameter facts.

    Attributes:
        exported: the `torch.export.ExportedProgram` (non-strict, training IR: ops such as
            aten.linear / aten.layer_norm stay whole, backward comes from autograd).
        graph_module: `exported.graph_module`, whose placeholders are parameters, buffers, then user inputs.
        nodes: `NodeInfo` per node, in graph (topological) order, keyed by node name.
        parameters: `ParamInfo` per canonical parameter/buffer FQN, in `named_parameters()` order then buffers.
        blocks: the groups of repeated blocks found, outermost first.
        input_names: placeholder names of the TENSOR user inputs, in call order (flattened).
        notes: normalisations applied while tracing (e.g. inlined no_grad regions), for the user to read.
        constant_inputs: placeholder name -> value of each non-tensor user input (bool, int, float, None,
            str; nested containers are flattened, e.g. {"cfg": {"k": 3}} -> "cfg_k": 3). Export bakes these
            values into the graph, so the placeholders have no users.
        call_inputs: placeholder names of ALL user inputs (tensor and constant) in flattened call order.
        training: the model's `training` flag when traced: export bakes the mode into mode-dependent ops
            (`batch_norm(training=...)`, `dropout(train=...)`) and into Python branches on `self.training`.
        autocast: ((device type, dtype), ...) of the torch.autocast contexts enabled around the trace (`ambient_autocast`):
            export traces under them (outputs in bf16 without explicit casts), so another mode is traced under the
            same ones (`runtime.modes.autocast_exactly`) to give the same graph.
        forward_positional, untraced_defaults, passed_defaults: the forward's positional parameter names, and
            {name: default} of its parameters the traced call left at (passed as) a plain-constant default: a call
            passing (omitting) one of them with that value computes the traced function (`tracer.call_defaults`).
        allow_frozen_host_random: traced with `trace(..., allow_frozen_host_random=True)`: a numpy / Python random
            draw in training mode is frozen into the graph (noted) instead of refused; retraces inherit it.
        cut_from: for a pipeline stage's graph (`runtime.stage_cut.stage_graph`), the whole graph it was cut from:
            the planner prices the values the stage receives in their dtypes as run there (`planner.costs.Pricer.
            node_dtypes`); None for a traced model.
    """

    exported: torch.export.ExportedProgram
    graph_module: torch.fx.GraphModule
    nodes: dict[str, NodeInfo]
    parameters: dict[str, ParamInfo]
    blocks: list[BlockGroup]
    input_names: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    constant_inputs: dict[str, Any] = field(default_factory=dict)
    call_inputs: tuple[str, ...] = ()
    training: bool = True
    autocast: tuple[tuple[str, torch.dtype], ...] = ()
    forward_positional: tuple[str, ...] = ()
    untraced_defaults: dict[str, Any] = field(default_factory=dict)
    passed_defaults: dict[str, Any] = field(default_factory=dict)
    allow_frozen_host_random: bool = False
    cut_from: "TracedGraph | None" = field(default=None, repr=False, compare=False)
    _owners: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def _bind_positional_keywords(self, spec, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A call that passes by keyword inputs traced positionally (`pm(user=u, item=i)` for a model traced with
        `(u, i)`; `pm(input_ids=ids)` for `(ids,)`), as Python binds them for the model's forward: each traced
        positional input is a tensor leaf whose placeholder carries the forward's parameter name, so those
        keywords are moved to their positions. Before, such a call was a TypeError although the model takes it."""
        if spec is None or spec.num_children != 2 or not isinstance(kwargs, dict) or not kwargs:
            return args, kwargs
        positional = spec.child(0)
        n = positional.num_children
        if len(args) >= n or any(positional.child(i).num_children for i in range(n)):
            return args, kwargs
        names = list(self.call_inputs or self.input_names)[:n]
        missing = names[len(args):]
        if len(names) != n or not all(name in kwargs for name in missing):
            return args, kwargs
        rest = {k: v for k, v in kwargs.items() if k not in missing}
        return (*args, *(kwargs[name] for name in missing)), rest

    def _bind_extra_positional(self, traced_args: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A call that passes positionally inputs beyond the traced positional ones (`pm(ids, mask)` for a model
        traced as `model(ids, mask=mask)`), as Python binds them: each is moved to the keyword of the forward's
        parameter at its position (`forward_positional`), unless the call passes that keyword too (Python's own
        TypeError then stands). Before, such a call was a TypeError although the model takes it (trial r13c)."""
        extra = args[traced_args:]
        names = self.forward_positional[traced_args:traced_args + len(extra)]
        if not extra or len(names) != len(extra) or any(name in kwargs for name in names):
            return args, kwargs
        return args[:traced_args], {**kwargs, **dict(zip(names, extra))}

    def _check_input_device(self, name: str, got: torch.device) -> None:
        """Raise PlanMismatchError when an input is on another device type than traced (a CPU batch given to a
        model traced on GPU; a meta tensor): the program's ops and collectives would meet it deep inside, where
        the model's own `x.to(device)` was baked away when the input already lay there. Model on meta: no check."""
        node = next(iter(self.graph_module.graph.find_nodes(op="placeholder", target=name)), None)
        val = node.meta.get("val") if node is not None else None
        want = val.device if isinstance(val, torch.Tensor) else None
        if want is not None and want.type != "meta" and got.type != want.type:
            raise PlanMismatchError(
                f"input {name!r} is on device {got} but the graph was traced (and planned) with it on {want}: the "
                f"program runs on the traced devices. Remedy: move it there first (`.to({str(want)!r})`), or trace "
                "and plan again with inputs on that device")

    def tensor_inputs(self, args: tuple, kwargs: dict, microbatches: int = 1) -> list[torch.Tensor]:
        """The tensor leaves of a call `model(*args, **kwargs)` in `input_names` order, after checking that the
        call has the traced structure and passes every constant input with its traced value. The call is first
        bound as Python binds it for the forward (keywords for traced positions, positions for traced keywords,
        dict keys in any order). `microbatches` > 1: the call is the first microbatch of a pipeline's global call
        (`runtime.microbatches`), so messages give tensors' shapes as the caller's, dim 0 times `microbatches`
        (before round 24 they named the microbatch's shapes as if the user had passed them: "input 'ids' has shape
        (4, 6)" for a call with (8, 6)).

        Raises:
            TypeError: the call's structure (positional count, keyword names, nesting, dict keys) differs from the
                trace; an input the traced call left at its default is passed with another value (`call_defaults`);
                a non-tensor (None) is passed where a tensor was traced.
            ValueError: a constant input has another value than when traced (names it and both values).
            PlanMismatchError: a tensor of another shape, dtype (integer width aside: `check_input_dtype`) or
                device type than traced.
        """
        spec = self.exported.call_spec.in_spec
        if spec is not None and spec.num_children == 2 and isinstance(kwargs, dict):
            args, kwargs = self._bind_extra_positional(spec.child(0).num_children, tuple(args), kwargs)
        if spec is not None and spec.num_children == 2 and isinstance(kwargs, dict) and self.untraced_defaults:
            args, kwargs = drop_passed_defaults(spec.child(0).num_children, set(spec.child(1).context or ()),
                                                self.forward_positional, self.untraced_defaults, tuple(args), kwargs)
        if spec is not None and spec.num_children == 2 and isinstance(kwargs, dict) and self.passed_defaults:
            args, kwargs = fill_omitted_defaults(spec.child(0).num_children, set(spec.child(1).context or ()),
                                                 self.forward_positional, self.passed_defaults, tuple(args), kwargs)
        args, kwargs = self._bind_positional_keywords(spec, tuple(args), kwargs)
        if spec is not None:  # keywords and dict keys in the traced order (a call may order them freely)
            args, kwargs = _in_traced_order((tuple(args), kwargs), spec)
        flat, in_spec = pytree.tree_flatten((tuple(args), kwargs))
        if spec is not None and in_spec != spec:
            raise InputMismatchError(_call_mismatch(spec, in_spec, args, kwargs))
        names = self.call_inputs or self.input_names
        whole = lambda shape: (shape[0] * microbatches, *shape[1:]) if shape else ()  # noqa: E731 (the caller's)
        per = f" ({microbatches} pipeline microbatches)" if microbatches > 1 else ""
        tensors = []
        for name, value in zip(names, flat):
            if name not in self.constant_inputs and not isinstance(value, torch.Tensor):
                raise InputMismatchError(_not_a_tensor(name, value, self.nodes[name].outputs[0] if name in self.nodes and
                                              self.nodes[name].outputs else None, whole))
            if isinstance(value, torch.Tensor) and name in self.nodes and self.nodes[name].outputs:
                want = tuple(self.nodes[name].outputs[0].shape)
                if tuple(value.shape) != want:
                    raise PlanMismatchError(
                        f"input {name!r} has shape {whole(tuple(value.shape))} but the graph was traced (and planned) "
                        f"with {whole(want)}{per}: a sharded program is made for the traced shapes. Remedy: "
                        + _shape_remedy(whole(tuple(value.shape)), whole(want)))
                check_input_dtype(name, value.dtype, self.nodes[name].outputs[0].dtype)
                self._check_input_device(name, value.device)
            if name in self.constant_inputs:
                traced = self.constant_inputs[name]
                if type(value) is not type(traced) or value != traced:
                    raise ConstantInputError(
                        f"input {name!r} is {_short(value, whole)} but the graph was traced with {traced!r}: a non-tensor "
                        "input is a constant of the traced graph. Remedy: pass the traced value, or trace (and plan) "
                        "again with the new one")
            else:
                tensors.append(value)
        return tensors

    @property
    def user_checkpoint_nodes(self) -> dict[str, tuple[str, ...]]:
        """Region name -> the call_function nodes (graph order) traced inside one of the user's
        `torch.utils.checkpoint` calls (`NodeInfo.checkpoint`; naming: `user_recompute`)."""
        out: dict[str, list[str]] = {}
        for info in self.compute_nodes():
            if info.checkpoint is not None:
                out.setdefault(info.checkpoint, []).append(info.name)
        return {region: tuple(names) for region, names in out.items()}

    @property
    def user_recompute(self) -> dict[str, str]:
        """The user's own checkpoint regions as recomputation decisions (`planner.recompute`), region -> "full".

        A region is named by the repeated-block member's module FQN (e.g. "transformer.h.3") when it covers
        exactly that block's nodes (transformers' `gradient_checkpointing_enable()` checkpoints each decoder
        layer); otherwise by the innermost module FQN holding all its nodes plus "@checkpoint<k>", k counting
        that module's regions in graph order from 0 (e.g. "encoder.mlp@checkpoint0"; "@checkpoint0" for the
        root module). A region nested in another is reported as the innermost. The planner takes these as
        forced, and `parallelizer.plan` puts them into `Plan.recompute`, so they are emitted (respected)."""
        return {region: "full" for region in self.user_checkpoint_nodes}

    def constant_values(self) -> dict[str, torch.Tensor]:
        """FQN -> value of each lifted constant (`ParamInfo.is_constant`), from the exported program."""
        return {fqn: self.exported.constants[fqn] for fqn, p in self.parameters.items() if p.is_constant}

    def node(self, name: str) -> NodeInfo:
        """The `NodeInfo` of node `name`; UnknownNodeError (a KeyError) names close matches when absent."""
        try:
            return self.nodes[name]
        except KeyError:
            raise UnknownNodeError(name, "the traced graph", self.nodes) from None

    def param_of_placeholder(self, placeholder: str) -> ParamInfo | None:
        """The parameter/buffer a placeholder stands for (tied aliases resolve to one `ParamInfo`); the map is
        built once per `parameters` dict (rebuilt when the attribute is given a new dict, as a stage graph does)."""
        if self._owners is None or self._owners[0] is not self.parameters:
            self._owners = (self.parameters, {ph: p for p in self.parameters.values() for ph in p.placeholders})
        return self._owners[1].get(placeholder)

    def mutated_buffers(self) -> dict[str, str]:
        """`mutated_state` restricted to buffers."""
        return {fqn: node for fqn, node in self.mutated_state().items() if self.parameters[fqn].is_buffer}

    def mutated_state(self) -> dict[str, str]:
        """Buffer or parameter FQN -> the first node writing it in place in forward (`self.seen.add_(...)`, an
        EMA's `mul_`, batch_norm's running statistics, a frozen key encoder updated as an EMA of the query
        encoder (MoCo), prototypes re-normalised (SwAV); also through views and chained in-place ops), in
        graph order.

        Such state is kept ONCE on one device and updated in microbatch order; a runtime that keeps several
        copies of it (BitPipe's two stage copies, stages each holding their own copy) must refuse or merge it
        (`planner.schedules.buffer_copies_reason`, `runtime.pipeline.build`), and a reference that runs the
        forward once more must not (`runtime.pipeline_rehearsal`). Parameters count as buffers do: their
        gradients are summed across copies, but a value written in forward is not (round 13, r13b). Export's
        `graph_signature.buffers_to_mutate` is empty for this training IR (the in-place ops stay in the
        graph), so the written arguments are followed back to their placeholders (`mutated_args`, `alias_source`).
        """
        out: dict[str, str] = {}
        for node in self.graph_module.graph.nodes:
            for i in mutated_args(node):
                arg = node.args[i] if i < len(node.args) else None
                while isinstance(arg, torch.fx.Node) and (alias_source(arg) is not None or returns_written(arg)):
                    arg = alias_source(arg) or arg.args[0]  # a view / an in-place op's result aliases its input
                info = self.param_of_placeholder(arg.name) if isinstance(arg, torch.fx.Node) else None
                if info is not None:
                    out.setdefault(info.fqn, node.name)
        return out

    def compute_nodes(self) -> list[NodeInfo]:
        """call_function nodes in graph order."""
        return [n for n in self.nodes.values() if n.op == "call_function"]

    @property
    def num_parameters(self) -> int:
        """Trainable parameter count (tied parameters counted once)."""
        return sum(p.numel for p in self.parameters.values() if not p.is_buffer)

    @property
    def parameter_bytes(self) -> int:
        return sum(p.nbytes for p in self.parameters.values() if not p.is_buffer)

    def op_counts(self) -> Counter:
        """Number of call_function nodes per op name."""
        return Counter(n.op_name for n in self.compute_nodes())

    def largest_activations(self, k: int = 5) -> list[NodeInfo]:
        """The k call_function nodes with the largest outputs (bytes), largest first, ties by graph order."""
        nodes = [n for n in self.compute_nodes() if n.outputs]
        return sorted(nodes, key=lambda n: -n.nbytes)[:k]

    def summary(self) -> str:
        """A text summary: op counts, parameters (count, bytes), repeated blocks, largest activations."""
        lines = [
            f"TracedGraph: {len(self.nodes)} nodes, {len(self.compute_nodes())} ops, "
            f"{len(self.input_names)} input(s)",
            f"parameters: {self.num_parameters:,} ({_fmt_bytes(self.parameter_bytes)}) in "
            f"{sum(not p.is_buffer for p in self.parameters.values())} tensors; "
            f"buffers: {sum(p.is_buffer for p in self.parameters.values())}",
        ]
        tied = [p for p in self.parameters.values() if p.aliases]
        for p in tied:
            lines.append(f"  tied: {p.fqn} = {', '.join(p.aliases)} ({len(p.uses)} uses)")
        if self.blocks:
            lines.append("repeated blocks:")
            for b in self.blocks:
                lines.append(f"  {b.name}: {b.count} x {b.module_type} ({b.nodes_per_block} nodes each)")
        else:
            lines.append("repeated blocks: none")
        lines.append("ops:")
        for op, count in sorted(self.op_counts().items(), key=lambda kv: (-kv[1], kv[0]))[:12]:
            lines.append(f"  {count:5d}  {op}")
        lines.append("largest activations:")
        for n in self.largest_activations():
            lines.append(f"  {_fmt_bytes(n.nbytes):>10}  {n.name} = {n.op_name} -> "
                         f"{', '.join(map(str, n.outputs))}  [{n.module_fqn or '<root>'}]")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        blocks = ", ".join(f"{b.name} x{b.count}" for b in self.blocks) or "none"
        return (f"TracedGraph(ops={len(self.compute_nodes())}, params={self.num_parameters:,} "
                f"({_fmt_bytes(self.parameter_bytes)}), blocks=[{blocks}])")


def _short(value, whole=tuple) -> str:
    """A call's value for a message: a tensor by shape (`whole`: the caller's shape of it) and dtype (a batch's repr
    would fill the screen)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {whole(tuple(value.shape))} ({value.dtype})"
    return repr(value)


def integer_width_only(got: torch.dtype, want: torch.dtype) -> bool:
    """Whether two dtypes differ only in integer width (int32 token ids where int64 was traced): both integer,
    neither bool."""
    return not (got.is_floating_point or got.is_complex or want.is_floating_point or want.is_complex
                or torch.bool in (got, want))


def check_input_dtype(name: str, got: torch.dtype, want: torch.dtype) -> None:
    """Raise PlanMismatchError when an input has another dtype than traced, unless only its integer width differs
    (int32 token ids: the program runs them as given, as the model does). Dtype-reading code (transformers'
    RMSNorm `x.to(input_dtype)`, `.float()` on an fp32 input, a branch on `mask.dtype == torch.bool`) is baked or
    dropped at trace time, so the program would compute in the traced dtype where the model computes (or refuses)
    otherwise: an fp64 `inputs_embeds` ran in fp32 while eager Llama raised; a float input given where an integer
    was traced (or a bool mask where a float one was) ran the traced branch, or raised torch's error from inside
    the program (trial r13c)."""
    if got != want and not integer_width_only(got, want):
        raise PlanMismatchError(
            f"input {name!r} has dtype {got} but the graph was traced (and planned) with {want}: code reading the "
            f"input's dtype was fixed when tracing. Remedy: cast it (`.to({want})`), or trace and plan again with "
            "inputs of that dtype")


def _not_a_tensor(name: str, value, traced, whole=tuple) -> str:
    """The TypeError text of a call passing a non-tensor (None for an optional mask) where a tensor was traced;
    `whole`: the caller's shape of a traced (microbatch) shape."""
    what = f"a tensor of shape {whole(tuple(traced.shape))} and dtype {traced.dtype}" if traced is not None else "a tensor"
    return (f"input {name!r} is {_short(value)} but the graph was traced (and planned) with {what}: the program "
            f"computes with that tensor. Remedy: pass a tensor of that shape and dtype (for an optional mask, the "
            f"value meaning 'no mask', e.g. all ones), or trace and plan again with {name}={_short(value)} "
            "(example_inputs / example_kwargs)")


def _in_traced_order(value, spec):
    """`value` with every plain dict (the keywords, a dict input and dicts nested in it) holding the same keys as
    its traced counterpart in `spec` rebuilt in the traced key order: a dict's keys are a set to the model, but
    pytree's structure compares them in order, so `pm({"y": y, "x": x})` for a model traced with `{"x": x, "y": y}`
    was a TypeError "the nesting of the inputs differs" (trial r13c). Anything else is returned as it is."""
    if spec.type is dict and type(value) is dict and set(value) == set(spec.context or ()):
        return {k: _in_traced_order(value[k], spec.child(i)) for i, k in enumerate(spec.context)}
    if spec.type in (tuple, list) and type(value) is spec.type and len(value) == spec.num_children:
        return spec.type(_in_traced_order(v, spec.child(i)) for i, v in enumerate(value))
    return value


def _call_mismatch(spec, got, args: tuple, kwargs: dict) -> str:
    """The TypeError text of a call whose structure is not the traced one: the positional count and the
    keywords missing or extra, then both structures."""
    traced_args = spec.child(0).num_children if spec.num_children == 2 else None
    traced_kwargs = set(spec.child(1).context or []) if spec.num_children == 2 else set()
    parts = []
    if traced_args is not None and traced_args != len(args):
        parts.append(f"{len(args)} positional input(s), traced with {traced_args}")
    if set(kwargs) - traced_kwargs:
        parts.append(f"unexpected keyword(s) {sorted(set(kwargs) - traced_kwargs)}")
    if traced_kwargs - set(kwargs):
        parts.append(f"missing keyword(s) {sorted(traced_kwargs - set(kwargs))}")
    what = "; ".join(parts) or _first_difference(spec, got) or "the nesting of the inputs differs"
    return (f"inputs do not match the traced call: {what}. Remedy: call the module with the inputs it was traced "
            f"with (example_inputs / example_kwargs), or trace and plan again for this call. Traced structure: "
            f"{spec}; got: {got}")


def _shape_remedy(given: tuple, traced: tuple) -> str:
    """What to do about an input of shape `given` where `traced` was traced, from the dims that differ: only the
    first (a batch: drop or pad it), or others (the rank, a sequence length or feature size: no short batch)."""
    if len(given) == len(traced) and given[1:] == traced[1:]:
        return ("pass batches of the traced shape (drop or pad the last short batch of an epoch), or trace and plan "
                "again for the new shape")
    if len(given) != len(traced):
        what = f"it has {len(given)} dim(s), traced with {len(traced)}"
    else:
        dims = [d for d in range(1, len(given)) if given[d] != traced[d]]
        what = "dim(s) " + ", ".join(f"{d} ({given[d]}, traced {traced[d]})" for d in dims) + " differ, not only the batch"
    return (f"{what}: pass inputs of the traced shape (pad a sequence to the traced length), or trace and plan "
            "again for the new shape")


def _first_difference(spec, got, path: str = "") -> str | None:
    """Where two call structures first differ, in words (`inputs[0]['y']` missing, a list where a dict was
    traced), or None when they agree (the top level's counts and keywords are told by `_call_mismatch`)."""
    def at(i):
        key = spec.context[i] if spec.type is dict else i
        return path + (f"[{key!r}]" if path else ("inputs" if i == 0 else "keywords"))
    if spec.type is not got.type:  # a leaf's type is None: a tensor (or a constant)
        kind = lambda t: f"a {t.__name__}" if t is not None else "a tensor"  # noqa: E731
        return f"{path or 'the call'} is {kind(got.type)} where {kind(spec.type)} was traced"
    if spec.type is dict and spec.context != got.context:
        traced, given = set(spec.context or ()), set(got.context or ())
        missing, extra = sorted(traced - given, key=str), sorted(given - traced, key=str)
        return (f"{path or 'the call'} has keys {list(got.context)}, traced with {list(spec.context)}"
                + (f" (missing {missing})" if missing else "") + (f" (unexpected {extra})" if extra else ""))
    if spec.num_children != got.num_children:
        return f"{path or 'the call'} has {got.num_children} element(s), traced with {spec.num_children}"
    for i in range(spec.num_children):
        found = _first_difference(spec.child(i), got.child(i), at(i))
        if found:
            return found
    return None


def _fmt_bytes(n: int) -> str:
    """Human-readable bytes in binary units (KiB, MiB, GiB)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit}"
