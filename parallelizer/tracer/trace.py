"""`trace`: model + example inputs -> `TracedGraph`, through torch.export (non-strict).

The graph is export's training IR: ATen ops with high-level ops kept whole (aten.linear, aten.layer_norm,
aten.scaled_dot_product_attention, aten.embedding), which is what per-op sharding rules are written for;
backward is left to autograd of the forward program (DESIGN.md rule 3). Normalisations are applied and
recorded in `TracedGraph.notes`: shape-assertion nodes are dropped, a `torch.no_grad()` region inside
forward is inlined as a stop-gradient, and biases are split off linear layers (see `normalize`).

What export needs of a model and its inputs, handled here (each recorded in `notes`):
- transformers models return a key/value cache object (DynamicCache, EncoderDecoderCache, ...) from forward
  when their config says `use_cache=True` (the default of generative models); a training step never reads
  it and export cannot return it. The model is traced with its own settings and the cache object is dropped
  from the traced output; what building it added to the graph is normalised away (`cache_output`). (Turning
  use_cache off while tracing changed the function: transformers masks packed sequences only without a cache);
- a non-tensor input (bool, int, float, None, str, inside any nesting of tuples/lists/dicts) is a traced
  constant: export bakes its value into the graph; `TracedGraph.constant_inputs` records it and
  `TracedGraph.tensor_inputs` checks that a later call passes the same value;
- a `torch.utils.checkpoint` region is inlined with its gradient (no recomputation in the graph; the
  reentrant variant would otherwise export as a no_grad region), and the nodes traced inside it are recorded
  (`NodeInfo.checkpoint`, `TracedGraph.user_recompute`) so that the emitted program recomputes them;
- a tensor created inside forward is a lifted constant (`ParamInfo.is_constant`);
- an export failure raised by the model's own code (outside torch) says so rather than blaming tracing.
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
import traceback
import warnings
from typing import Any

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils.checkpoint as checkpoint_module
from torch.export.graph_signature import ConstantArgument, InputKind
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils import _pytree as pytree

from ..errors import TraceError
from .blocks import find_repeated_blocks
from .cache_output import cache_dropped, drop_unused_constants
from .causal_hint import causal_mask_hint_as_given
from .fast_path import nested_fast_path_watch
from .device_free import canonical_constants, canonical_names
from .call_defaults import untraced_defaults
from .eager_check import compare_with_eager, eager_outcome
from .host_state import check_repeatable, host_state_kept, refuse_generator_objects, refuse_reseeding, seed_watch
from .normalize import normalize
from .graph import NodeInfo, ParamInfo, Role, TensorMeta, TracedGraph, ambient_autocast
from .node_facts import draws_random
from .export_errors import installed_site, library_call_remedy, translate
from .overflow_guard import overflow_guards_as_clamps
from . import packed
from .export_facts import named_inputs
from .slots import drop_phantom_input_writes, one_process_view, tensor_slots_kept, torch_bookkeeping_warning
from .watch import custom_backward_watch, host_rng_watch, internal as _internal, python_state_watch

_SCALAR_TYPES = (int, float, bool, type(None))


def trace(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None = None, *,
          allow_frozen_host_random: bool = False) -> TracedGraph:
    """Capture `model(*example_inputs, **example_kwargs)` as an ATen-level graph with node metadata.

    Args:
        model: any `torch.nn.Module`; its parameters may live on CPU or on the `meta` device (shapes only:
            nothing is allocated, so a 7B-parameter model traces in a few hundred MB).
        example_inputs: positional inputs (tensors, or nested tuples/lists/dicts of tensors and Python
            scalars). With a `meta` model, CPU tensors are moved to `meta` (recorded in `notes`).
        example_kwargs: keyword inputs, same rules.
        allow_frozen_host_random: trace a forward that draws from numpy's or Python's random generator in
            training mode (`tracer.watch.host_rng_watch`; e.g. Wav2Vec2 / HuBERT / WavLM SpecAugment with the
            default mask_time_prob 0.05) with the values of its one draw frozen into the graph, so that every
            step repeats them: warned and noted instead of refused. Default False: a TraceError names the draw
            and the remedies (its config switch, e.g. mask_time_prob=0; torch draws). Recorded in
            `TracedGraph.allow_frozen_host_random`, which the ParallelModule's retraces (another train/eval mode)
            inherit.
    Returns:
        A `TracedGraph` (see its docstring for the per-node facts).
    Raises:
        TraceError: an input of an unsupported type, data-dependent
            control flow (a Python branch on a tensor value), a numpy / Python random draw in training mode
            (without `allow_frozen_host_random`), an output that is not a tensor container, an
            error of the model's own code, or any other construct torch.export cannot capture; the message
            names the construct, the user's source file:line and a remedy.
    """
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"an object of type {type(model).__name__}", None,
                         "pass a torch.nn.Module (wrap a function in a Module whose forward calls it)")
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    example_kwargs = dict(example_kwargs or {})
    _check_input_types(example_inputs, example_kwargs)
    notes: list[str] = []
    _check_not_partly_meta(model)
    _refuse_module_backward_hooks(model)
    if _on_meta(model):
        example_inputs, example_kwargs = pytree.tree_map_only(
            torch.Tensor, lambda t: t.to("meta"), (example_inputs, example_kwargs))
        notes.append("model is on the meta device: traced shapes only; example inputs moved to meta")
    with one_process_view(notes):  # as on one device, also on ranks (the export and every eager call)
        exported = _exported_and_checked(model, example_inputs, example_kwargs, notes, allow_frozen_host_random)
    gm = exported.graph_module
    try:
        lifted = exported.graph_signature.inputs_to_lifted_tensor_constants
        normalize(gm, notes, {name: exported.constants[fqn] for name, fqn in lifted.items()
                              if fqn in exported.constants})
        drop_unused_constants(exported)
        canonical_constants(gm, exported)
        canonical_names(gm, exported)
    except GuardOnDataDependentSymNode:
        _refuse_data_dependent_shapes(gm)  # the TraceError `_static_metas` would raise, before a pass guarded
        raise
    renamed = _fx_legal_input_names(gm, exported.graph_signature)
    if renamed:
        notes.append("input(s) named like Python builtins are called " + ", ".join(
            f"{old} -> {new}" for old, new in renamed.items()) + " in the graph and the plan (fx's rule)")
    traced = _build(model, exported, gm, notes, renamed)
    traced.forward_positional, traced.untraced_defaults, traced.passed_defaults = untraced_defaults(
        model, example_inputs, example_kwargs)
    traced.allow_frozen_host_random = allow_frozen_host_random
    return traced


def _exported_and_checked(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict, notes: list[str],
                          allow_frozen_host_random: bool):
    """`trace`'s export under its watches, then its checks of the exported program against eager calls of the
    model (`compare_with_eager`, `check_repeatable`); `trace` runs it inside `one_process_view`."""
    reseeds: list[tuple[str, str | None]] = []
    with host_state_kept(model) as host_before, cache_dropped(model, notes), _checkpoint_regions(notes), \
            host_rng_watch(notes, model, allow=allow_frozen_host_random), custom_backward_watch(notes), \
            python_state_watch(model, notes), tensor_slots_kept(model, notes) as stored, \
            overflow_guards_as_clamps(notes), causal_mask_hint_as_given(notes), seed_watch(reseeds), \
            nested_fast_path_watch(model, notes):
        exported = _export(model, example_inputs, example_kwargs)
    refuse_generator_objects(exported, model)
    draws = any(draws_random(n) for n in exported.graph_module.graph.nodes if n.op == "call_function")
    refuse_reseeding(reseeds, draws, model.training, notes, allow_frozen_host_random)
    if stored:
        drop_phantom_input_writes(model, exported, example_inputs, example_kwargs, notes)
    with cache_dropped(model):  # the output export saw; after the watches (their notes decide a skip)
        eager = compare_with_eager(model, exported, example_inputs, example_kwargs, notes)
        check_repeatable(model, example_inputs, example_kwargs, notes, before=host_before, first=eager,
                         allow=allow_frozen_host_random)  # host state a call changes, frozen (`host_state`)
    return exported


def _refuse_module_backward_hooks(model: torch.nn.Module) -> None:
    """Raise TraceError for module backward hooks on `model` or its submodules (register_full_backward_hook,
    register_full_backward_pre_hook, the old register_backward_hook) and global ones
    (`torch.nn.modules.module.register_module_full_backward_hook` / `_pre_hook`): torch.export keeps no trace of
    them, so the traced program, and every plan made from it, ran backward without them while the model runs
    them (trial r13a: a hook halving a Linear's grad_output left every gradient before it 2x eager's, silently).
    Forward hooks are traced into the program and stay allowed; tensor hooks on parameters are carried by the
    ParallelModule (`ParallelModule._carry_parameter_hooks`)."""
    from torch.nn.modules import module as nn_module
    hooked = [f"{name or type(model).__name__} ({type(mod).__name__}): {kind}"
              for name, mod in model.named_modules()
              for kind, hooks in (("a backward hook", mod._backward_hooks),
                                  ("a backward pre-hook", mod._backward_pre_hooks)) if hooks]
    hooked += [f"every module: a global {kind}" for kind, hooks in
               (("backward hook", nn_module._global_backward_hooks),
                ("backward pre-hook", nn_module._global_backward_pre_hooks)) if hooks]
    if hooked:
        raise TraceError(
            f"module backward hooks ({'; '.join(hooked)})", None,
            "torch.export drops them, so the traced and the sharded program would run backward without them (a "
            "hook that changes grad_input / grad_output would silently train other gradients). Remove them before "
            "tracing (handle.remove()) and register the hook on the ParallelModule itself (pm.register_full_"
            "backward_hook works), or as tensor hooks on the parameters, or write its effect into forward "
            "(e.g. x * s + (x * (1 - s)).detach() scales the gradient of x by s)")


def _check_input_types(args: tuple, kwargs: dict) -> None:
    for where, leaf in named_inputs(args, kwargs):  # `example_inputs[0]` (was `inputs[0][0]`: the (args, kwargs) pair)
        if not isinstance(leaf, (torch.Tensor, *_SCALAR_TYPES, str)):
            raise TraceError(
                f"an input of type {type(leaf).__qualname__} ({where})", None,
                "pass tensors, Python scalars, or tuples/lists/dicts of them; register custom containers "
                "with torch.utils._pytree.register_pytree_node")


@contextlib.contextmanager
def _checkpoint_regions(notes: list[str]):
    """Inline every `torch.utils.checkpoint.checkpoint` region called during export, differentiably, tag the
    nodes traced inside the k-th call with `node.meta["custom"][CHECKPOINT_KEY] = k` (torch.fx.traceback.annotate
    under preserve_node_meta; `_name_checkpoint_regions` names them), and note where. The non-reentrant
    variant is traced through as it is (its saved-tensor hooks leave no trace in the graph); the reentrant one
    (`use_reentrant=True`) would be exported as a `torch.no_grad()` region, cutting the gradient of everything
    inside, so its function is called directly instead. Wraps the two module-level names `checkpoint`
    dispatches to (private torch API, checked on torch 2.13.0; when a name is absent it is left alone)."""
    calls: list[str] = []
    cut: list[str] = []  # reentrant regions none of whose tensor arguments requires grad
    patched: dict[str, object] = {}

    def record() -> dict:
        frames = [f for f in traceback.extract_stack()[:-2] if not _internal(f.filename)]
        calls.append(f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "an unknown location")
        return {CHECKPOINT_KEY: len(calls) - 1}

    original_gen = getattr(checkpoint_module, "_checkpoint_without_reentrant_generator", None)
    if original_gen is not None:
        def generator(*args, **kwargs):  # checkpoint() runs the region's function between its two yields
            with fx_traceback.annotate(record()):
                return (yield from original_gen(*args, **kwargs))
        patched["_checkpoint_without_reentrant_generator"] = original_gen
        checkpoint_module._checkpoint_without_reentrant_generator = generator
    original_function = getattr(checkpoint_module, "CheckpointFunction", None)
    if original_function is not None:
        class Inlined:  # CheckpointFunction.apply(function, preserve_rng_state, *args)
            @staticmethod
            def apply(function, _preserve_rng_state, *args):
                with fx_traceback.annotate(record()):
                    out = function(*args)
                if torch.is_grad_enabled() and not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                    # as on one device: CheckpointFunction's output needs no gradient when none of its tensor
                    # arguments does (torch warns "None of the inputs have requires_grad=True"), so nothing
                    # inside the region gets one; inlined without this, every plan trained the region's
                    # parameters where the model leaves them untouched (trial r13a)
                    cut.append(calls[-1])
                    out = pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out)
                return out
        patched["CheckpointFunction"] = original_function
        checkpoint_module.CheckpointFunction = Inlined
    try:
        with fx_traceback.preserve_node_meta():
            yield
    finally:
        for name, value in patched.items():
            setattr(checkpoint_module, name, value)
    if calls:
        where = ", ".join(sorted(set(calls))[:3]) + (" ..." if len(set(calls)) > 3 else "")
        notes.append(f"inlined {len(calls)} torch.utils.checkpoint region(s) ({where}) into the traced graph; "
                     "their nodes are recorded (TracedGraph.user_recompute) and recomputed in backward by the "
                     "emitted program (Plan.recompute)")
    if cut:
        notes.append(f"reentrant checkpoint region(s) at {', '.join(sorted(set(cut)))} have no tensor argument that "
                     "requires grad: as on one device (torch warns 'None of the inputs have requires_grad=True'), "
                     "nothing inside them gets a gradient. To train their parameters pass use_reentrant=False, or "
                     "make an argument require grad (transformers: model.enable_input_require_grads())")


CHECKPOINT_KEY = "parallelizer_checkpoint"
"""Key in `node.meta["custom"]` of the index of the user's checkpoint call a node was traced in."""


def _name_checkpoint_regions(nodes: dict[str, NodeInfo], blocks) -> None:
    """Set `NodeInfo.checkpoint` of the nodes traced inside a user's checkpoint call, naming each region as
    `TracedGraph.user_recompute` documents (the block member's FQN when it is exactly one block member)."""
    regions: dict[int, list[NodeInfo]] = {}
    for info in nodes.values():
        index = (info.node.meta.get("custom") or {}).get(CHECKPOINT_KEY)
        if index is not None and info.op == "call_function":
            regions.setdefault(index, []).append(info)
    block_nodes = {m: set(names) for g in blocks for m, names in zip(g.members, g.nodes)}
    per_module: dict[str, int] = {}
    for members in regions.values():  # in graph order of their first node
        fqn = _common_module([info.module_fqn for info in members])
        if block_nodes.get(fqn) == {info.name for info in members}:
            name = fqn
        else:
            name = f"{fqn}@checkpoint{per_module.get(fqn, 0)}"
            per_module[fqn] = per_module.get(fqn, 0) + 1
        for info in members:
            info.checkpoint = name


def _common_module(fqns: list[str]) -> str:
    """The innermost module FQN that holds every one of `fqns` ("" for the root)."""
    common = fqns[0].split(".") if fqns[0] else []
    for fqn in fqns[1:]:
        parts = fqn.split(".") if fqn else []
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return ".".join(common)


def _check_not_partly_meta(model: torch.nn.Module) -> None:
    """Raise TraceError when some parameters or buffers are on `meta` and others (not 0-dim, which ops take
    beside tensors of any device) are not: a model built under
    `with torch.device("meta"):` whose code makes tensors with a legacy constructor (`torch.FloatTensor(...)`,
    XLNet's `mask_emb` and attention weights), which ignores the device context. It failed deep in export with
    a FakeTensorDeviceMismatchError naming a line of the model, not the cause."""
    named = [*model.named_parameters(), *model.named_buffers()]
    meta = [n for n, t in named if t.device.type == "meta"]
    other = [(n, t.device.type) for n, t in named if t.device.type != "meta" and t.dim() > 0]  # 0-dim: any device
    if meta and other:
        listed = ", ".join(f"{n} ({d})" for n, d in other[:4])
        listed += f" and {len(other) - 4} more" if len(other) > 4 else ""
        raise TraceError(
            "a model that is partly on the meta device", None,
            _made_by_package(model, other[0][0]) + "build every tensor on one device: move the rest after building "
            "with `parallelizer.presets.to_meta(model)`, which keeps tied weights tied (`model.to('meta')` and "
            "`to_empty(device='meta')` make one Parameter per owning module and untie them, so the plan would not "
            "fit the model); in your own code, create parameters with `torch.empty(...)` / `torch.zeros(...)` (which "
            "follow `with torch.device(...)`) instead of legacy constructors such as `torch.FloatTensor(...)`; a "
            "factory for `parallelizer plan` is moved so by the CLI itself",
            f"{len(meta)} parameter(s) / buffer(s) are on meta, {len(other)} are not: {listed}")


def _made_by_package(model: torch.nn.Module, name: str) -> str:
    """The start of `_check_not_partly_meta`'s remedy when the module holding tensor `name` is a class of an
    installed package (transformers' FastSpeech2-Conformer makes `pos_bias_u` with `torch.Tensor(n, d)`): the
    user cannot change that constructor, only move the tensor; "" for the user's own module, and for torch's own
    (nn.Embedding, nn.Linear: they follow the device context, so their tensor was assigned by the user's code)."""
    owner = model.get_submodule(name.rpartition(".")[0])
    path = getattr(sys.modules.get(type(owner).__module__), "__file__", None)
    site = installed_site(f"{path}:0" if path else None)
    if site is None or site[0] == "torch":
        return ""
    return (f"the installed package {site[0]} (not your code: {type(owner).__name__} in {site[1]}) makes them with a "
            "constructor that ignores `with torch.device(...)`; ")


def _on_meta(model: torch.nn.Module) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(t.device.type == "meta" for t in tensors)


def _export(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    """torch.export (non-strict). On failure torch prints graph dumps and warnings before raising; they are
    held back so that the TraceError is what the user reads (on success, captured output is passed on)."""
    captured, captured_err = io.StringIO(), io.StringIO()
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes_log.level
    shapes_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured_err), _noop_module_to(), \
                warnings.catch_warnings():
            bookkeeping = torch_bookkeeping_warning(model)  # torch's own attributes: not the user's to register
            if bookkeeping:
                warnings.filterwarnings("ignore", message=bookkeeping)
            exported = torch.export.export(model, args, kwargs, strict=False)
    except Exception as exc:  # export raises many types; each is translated, the cause is kept
        raise translate(exc, lambda: eager_outcome(model, args, kwargs), _on_meta(model), model,
                        (args, kwargs)) from exc
    finally:
        shapes_log.setLevel(level)
    sys.stdout.write(captured.getvalue())  # e.g. the user's own prints inside forward
    sys.stderr.write(captured_err.getvalue())
    return exported


@contextlib.contextmanager
def _noop_module_to():
    """`module.to(dtype/device)` inside forward that changes nothing (SwitchTransformers' router runs
    `self.classifier = self.classifier.to(self.dtype)` every call) is the module itself, as eagerly: under
    export, `Module._apply` tried to swap each (fake) parameter and failed ("Couldn't swap Linear.weight")."""
    original = torch.nn.Module.to

    def to(self, *args, **kwargs):
        try:
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        except Exception:
            return original(self, *args, **kwargs)
        tensors = [*self.parameters(), *self.buffers()]
        same = memory_format is None and all(
            (device is None or t.device == device or (device.index is None and t.device.type == device.type))
            and (dtype is None or not (t.is_floating_point() or t.is_complex()) or t.dtype == dtype) for t in tensors)
        return self if same else original(self, *args, **kwargs)

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original


def _fx_legal_input_names(gm: torch.fx.GraphModule, sig) -> dict[str, str]:
    """Rename the user-input placeholders that fx would not name so; returns {export's name: new name}.

    export names a user input after the forward's argument, e.g. `input` (nn.Sequential, nn.Linear), but a
    graph built anew by fx (each rank's program, a pipeline stage) renames a placeholder that shadows a Python
    builtin or keyword (`input` -> `input_1`), so a lookup of the built node's name in the trace failed on
    every mesh (UnknownNodeError). Renamed once here, every graph built from the trace keeps the name."""
    user = {spec.arg.name for spec in sig.input_specs if spec.kind == InputKind.USER_INPUT}
    renamed = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        if node.name in user and not torch.fx.Graph().placeholder(node.name).name == node.name:
            old = node.name
            node._rename(f"{old}_1")  # the graph's namespace makes it unique (`input_1`, `input_2` if taken)
            renamed[old] = node.name
    if renamed:
        gm.recompile()
    return renamed


def _build(model: torch.nn.Module, exported: torch.export.ExportedProgram, gm: torch.fx.GraphModule,
           notes: list[str], renamed: dict[str, str]) -> TracedGraph:
    """The TracedGraph of the normalised `gm`; `renamed`: user inputs' export names -> their names in `gm`."""
    sig = exported.graph_signature
    canonical = _canonical_names(model)
    module_types: dict[str, str] = {"": type(model).__qualname__}
    nodes: dict[str, NodeInfo] = {}
    user_outputs = {a.name for a in pytree.tree_leaves(gm.graph.output_node().args)
                    if isinstance(a, torch.fx.Node)}
    for node in gm.graph.nodes:
        role, fqn = _role(node, sig, user_outputs)
        module = _module_of(node, fqn, module_types)
        nodes[node.name] = NodeInfo(
            name=node.name, node=node, op=node.op,
            target=node.target if node.op == "call_function" else None, role=role,
            outputs=_static_metas(node), module_fqn=module,
            param_fqn=canonical.get(fqn, (fqn,))[0] if fqn else None)
    parameters = _parameters(model, gm, nodes, canonical)
    blocks = find_repeated_blocks(nodes, module_types)
    _tag_blocks(blocks, nodes, parameters)
    _name_checkpoint_regions(nodes, blocks)
    user = [spec.arg for spec in sig.input_specs if spec.kind == InputKind.USER_INPUT]
    names = [renamed.get(arg.name, arg.name) for arg in user]
    constants = {n: arg.value for n, arg in zip(names, user) if isinstance(arg, ConstantArgument)}
    if constants:
        notes.append("traced with constant input(s) " + ", ".join(f"{k}={v!r}" for k, v in constants.items())
                     + ": their values are part of the graph (a call with other values is rejected)")
    return TracedGraph(exported=exported, graph_module=gm, nodes=nodes, parameters=parameters, blocks=blocks,
                       input_names=tuple(n for n in names if n not in constants), notes=notes,
                       constant_inputs=constants, call_inputs=tuple(names), training=model.training,
                       autocast=ambient_autocast())


def _canonical_names(model: torch.nn.Module) -> dict[str, tuple[str, bool]]:
    """Every FQN (aliases included) -> (canonical FQN, is_buffer); canonical = first name of the tensor."""
    first: dict[int, str] = {}
    out: dict[str, tuple[str, bool]] = {}
    for is_buffer, named in ((False, model.named_parameters(remove_duplicate=False)),
                             (True, model.named_buffers(remove_duplicate=False))):
        for fqn, tensor in named:
            out[fqn] = (first.setdefault(id(tensor), fqn), is_buffer)
    return out


def _role(node: torch.fx.Node, sig, user_outputs: set[str]) -> tuple[Role, str | None]:
    if node.op == "placeholder":
        if node.name in sig.inputs_to_parameters:
            return Role.PARAMETER, sig.inputs_to_parameters[node.name]
        if node.name in sig.inputs_to_buffers:
            return Role.BUFFER, sig.inputs_to_buffers[node.name]
        if node.name in sig.inputs_to_lifted_tensor_constants:  # a tensor created in forward: `ParamInfo.is_constant`
            return Role.BUFFER, sig.inputs_to_lifted_tensor_constants[node.name]
        return Role.INPUT, None
    if node.op == "output" or node.name in user_outputs:
        return Role.OUTPUT, None
    return Role.ACTIVATION, None


def _module_of(node: torch.fx.Node, fqn: str | None, module_types: dict[str, str]) -> str:
    if fqn is not None:
        return fqn.rpartition(".")[0]
    stack = node.meta.get("nn_module_stack") or {}
    path = ""
    for path, mtype in stack.values():
        module_types.setdefault(path, mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", str(mtype)))
    return path


def _static_metas(node: torch.fx.Node) -> tuple[TensorMeta, ...]:
    """`_tensor_metas` of a node's value; a shape that depends on tensor values (nonzero, masked_select, unique,
    boolean-mask indexing: export gives it an unbacked symbol) is a TraceError naming the node, its op and the
    user's source line (int() of such a symbol raised torch's GuardOnDataDependentSymNode from here)."""
    if packed.is_pack_node(node):
        raise packed.packed_sequence_error(_user_line(node))
    _refuse_tensor_read_as_number(node)
    leaves = [t for t in pytree.tree_leaves(node.meta.get("val")) if isinstance(t, torch.Tensor)]
    for t in leaves:
        if any(isinstance(d, torch.SymInt) and not isinstance(d.node.maybe_as_int(), int) for d in t.shape):
            where = _user_line(node)
            raise TraceError(
                f"an op whose output size depends on tensor values ({node.name}: {node.target}, shape "
                f"{tuple(t.shape)})", where, library_call_remedy(where) +
                "the sharded program needs every shape known when tracing: keep sizes fixed, e.g. "
                "torch.where(mask, x, 0) or x * mask instead of x[mask] / masked_select / nonzero / unique, "
                "and sums over the masked tensor instead of its selected elements")
    return _tensor_metas(node.meta.get("val"))


def _refuse_data_dependent_shapes(gm: torch.fx.GraphModule) -> None:
    """The TraceError of `_static_metas` for the first node whose value has a shape that depends on tensor
    values, raised when a graph pass (normalize: a cat's empty operands, views, dead code) compared such a
    symbolic size and torch raised its untyped GuardOnDataDependentSymNode (Idefics3 / SmolVLM keep the real
    images with `pixel_values[real_images_inds]`). Returns when there is none (the caller re-raises)."""
    for node in gm.graph.nodes:
        _static_metas(node)


_SYMBOLIC_CHECKS = ("_assert_scalar", "sym_constrain_range", "_assert_async")


def _refuse_tensor_read_as_number(node: torch.fx.Node) -> None:
    """A TraceError where a tensor's value, read as a Python number (`t.item()`, `int(t)`, indexing with a 0-dim
    tensor: `s[idx[-1]]`), is an argument of another op (select, narrow, roll, mul by a scalar...). Its value is
    unknown when tracing (export gives it an unbacked symbol), differs per rank where the tensor is sharded or a
    Partial sum, and a sharding rule sees only tensor arguments (the planner failed with a bare StopIteration)."""
    val = node.meta.get("val")
    if node.op != "call_function" or not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) \
            or isinstance(val.node.maybe_as_int() if isinstance(val, torch.SymInt) else None, int):
        return
    users = [u for u in node.users if u.op == "call_function"
             and not any(c in str(u.target) for c in _SYMBOLIC_CHECKS)]
    if not users:
        return
    raise TraceError(
        f"a tensor value read as a Python number ({node.name}: {node.target}) and passed to another op "
        f"({users[0].name}: {users[0].target})", _user_line(users[0], node),
        "keep the value a tensor: index with index_select / gather / take_along_dim (e.g. "
        "s.gather(0, idx[-1:]) instead of s[idx[-1]]), multiply by the 0-dim tensor instead of its .item(), "
        "or compute the number outside forward and pass it in as a Python value")


def _user_line(*nodes: torch.fx.Node) -> str | None:
    """"file:line" of the innermost frame outside torch and this package in the recorded stack trace of the
    first of `nodes` that has one (the user's line that made the node), else None."""
    text = next((n.meta["stack_trace"] for n in nodes if n.meta.get("stack_trace")), "")
    user = [f"{f}:{n}" for f, n in re.findall(r'File "([^"]+)", line (\d+)', text) if not _internal(f)]
    return user[-1] if user else None


def _tensor_metas(val: Any) -> tuple[TensorMeta, ...]:
    leaves = pytree.tree_leaves(val)
    return tuple(TensorMeta(tuple(int(d) for d in t.shape), t.dtype) for t in leaves if isinstance(t, torch.Tensor))


def _parameters(model: torch.nn.Module, gm: torch.fx.GraphModule, nodes: dict[str, NodeInfo],
                canonical: dict[str, tuple[str, bool]]) -> dict[str, ParamInfo]:
    tensors = {**dict(model.named_parameters(remove_duplicate=False)),
               **dict(model.named_buffers(remove_duplicate=False))}
    order = {name: i for i, name in enumerate(nodes)}
    placeholders: dict[str, list[str]] = {}
    for info in nodes.values():
        if info.role in (Role.PARAMETER, Role.BUFFER) and info.param_fqn is not None:
            placeholders.setdefault(info.param_fqn, []).append(info.name)
    aliases: dict[str, list[str]] = {}
    for fqn, (canon, _) in canonical.items():
        if fqn != canon:
            aliases.setdefault(canon, []).append(fqn)
    out: dict[str, ParamInfo] = {}
    for fqn, phs in placeholders.items():
        uses = sorted({u.name for ph in phs for u in nodes[ph].node.users}, key=order.__getitem__)
        meta = nodes[phs[0]].outputs[0]
        is_buffer = canonical.get(fqn, (fqn, True))[1]
        out[fqn] = ParamInfo(fqn=fqn, aliases=tuple(aliases.get(fqn, ())), shape=meta.shape, dtype=meta.dtype,
                             placeholders=tuple(phs), uses=tuple(uses), is_buffer=is_buffer,
                             is_constant=fqn not in canonical,
                             requires_grad=not is_buffer and tensors[fqn].requires_grad,
                             persistent=fqn in canonical and _persistent(model, fqn))
    return out


def _persistent(model: torch.nn.Module, fqn: str) -> bool:
    """Whether `fqn` is in `model.state_dict()`: parameters and buffers registered with persistent=True."""
    owner, _, name = fqn.rpartition(".")
    return name not in model.get_submodule(owner)._non_persistent_buffers_set


def _tag_blocks(blocks, nodes: dict[str, NodeInfo], parameters: dict[str, ParamInfo]) -> None:
    for group in blocks:
        for index, (member, names) in enumerate(zip(group.members, group.nodes)):
            for position, name in enumerate(names):
                info = nodes[name]
                info.block, info.block_group, info.block_index, info.position = member, group.name, index, position
    for p in parameters.values():
        owners = {(nodes[u].block, nodes[u].block_group, nodes[u].block_index) for u in p.uses}
        if len(owners) == 1:
            p.block, p.block_group, p.block_index = owners.pop()
