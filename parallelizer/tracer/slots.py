"""Tensors a forward stores on the model's modules, put back after tracing (`tensor_slots_kept`).

A forward may store a tensor on a module instead of writing one in place: a cache registered in forward
(x-transformers' ALiBi: `self.register_buffer('bias', bias, persistent=False)` on its first call, read on later
calls), `self.cache = tensor`, a parameter replaced. export runs forward on FakeTensors and restores only the
tensors it swapped in, so such a slot kept a FakeTensor: the user's model, and every copy of it (the rehearsal's
references, the eager check), then raised torch's "DataDependentOutputException: aten.equal" or read a tensor
without data on its next call (before: `rehearse` of x-transformers' `alibi_pos_bias=True` failed on every rank).
The slots are put back as they were (added ones removed), the traced program computes such a tensor at every
call, and the change is noted and warned: equal for a cache, while state meant for the next call is not carried.

torch.export (2.13) also records such a store as a write into a USER INPUT: `register_buffer('bias', t)` into a
slot that held None gave `aten.copy_(x, t)` on the input `x`, so the exported (and every parallel) program
overwrote the caller's batch with the bias (1.66 off), or crashed building the program when the shapes differ
(`VerificationError`). `drop_phantom_input_writes` removes such a write when the eager forward does not write
that input (checked on copies of the example inputs).
"""
from __future__ import annotations

import contextlib
import re
import warnings

import torch
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm
from torch.export.graph_signature import InputKind
from torch.utils import _pytree as pytree

_KINDS = ("_parameters", "_buffers")


def _slots(model: torch.nn.Module) -> dict[tuple[str, str, str], object]:
    """(module name, kind, key) -> object of every parameter / buffer slot and tensor-valued plain attribute."""
    found = {}
    for name, module in model.named_modules():
        for kind in _KINDS:
            found.update({(name, kind, key): value for key, value in vars(module)[kind].items()})
        found.update({(name, "", key): value for key, value in vars(module).items()
                      if isinstance(value, torch.Tensor)})
    return found


@contextlib.contextmanager
def tensor_slots_kept(model: torch.nn.Module, notes: list[str] | None = None):
    """On exit, every parameter / buffer slot and tensor attribute of `model`'s modules holds the object it held
    on entry (a plain attribute that held a non-tensor, such as None, holds it again; slots added inside are
    removed). With `notes`, a change is noted there and warned. Yields a list that holds, after exit, the
    (module name, kind, key) of each slot changed inside."""
    before = _slots(model)
    # plain attributes holding something else on entry (`self.src_mask = None` in __init__, a tensor after
    # forward: pytorch/examples' word_language_model) get that back; deleting them broke the model (trial r16b)
    held = {(name, "", key): value for name, module in model.named_modules() for key, value in vars(module).items()
            if not isinstance(value, torch.Tensor)}
    changed: list[tuple[str, str, str]] = []
    try:
        yield changed
    finally:
        after = _slots(model)
        changed += sorted(k for k, v in after.items() if k not in before or before[k] is not v)
        modules, entry = dict(model.named_modules()), {**held, **before}
        for name, kind, key in changed:
            module = modules[name]
            if (name, kind, key) in entry:
                (vars(module)[kind] if kind else vars(module))[key] = entry[(name, kind, key)]
            else:
                del (vars(module)[kind] if kind else vars(module))[key]
        if changed and notes is not None:
            text = ("forward stores tensors on the model (" + ", ".join(
                f"{name + '.' if name else ''}{key}" for name, _, key in changed[:5]) + "): tracing put them "
                "back as they were; the traced and the parallel program compute them at every call, which is equal "
                "for a cache (x-transformers' ALiBi bias) but does not carry state to the next call as the model "
                "would (a memory kept as `self.mem = ...`): keep such state in a registered buffer written in "
                "place, or pass it as an input")
            notes.append(text)
            warnings.warn(text, stacklevel=4)


def drop_phantom_input_writes(model: torch.nn.Module, exported, args: tuple, kwargs: dict, notes: list[str]) -> None:
    """Erase the `copy_`s into user inputs that export recorded after forward stored a tensor on the model
    (module docstring) when the eager forward, run on copies of the inputs, writes none of its inputs.
    Raises TraceError when the model cannot run here (meta) to tell."""
    from ..errors import TraceError
    from .eager_check import _fresh, _on_meta, _state_kept

    gm = exported.graph_module
    inputs = {s.arg.name for s in exported.graph_signature.input_specs
              if s.kind == InputKind.USER_INPUT and hasattr(s.arg, "name")}
    writes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
              and not n.users and isinstance(n.args[0], torch.fx.Node) and n.args[0].name in inputs]
    if not writes:
        return
    if _on_meta(model, args, kwargs):
        raise TraceError(f"a tensor stored on the model in forward, which torch.export records as a write into the "
                         f"input(s) {sorted({n.args[0].name for n in writes})}", None,
                         "build the model on CPU to trace it, or call it once before tracing so that its cache "
                         "exists (then forward reads it instead of storing it)")
    copies = _fresh((args, kwargs))
    with _state_kept(model), torch.no_grad():
        model(*copies[0], **copies[1])
    if any(isinstance(a, torch.Tensor) and not torch.equal(a, b)
           for a, b in zip(pytree.tree_leaves((args, kwargs)), pytree.tree_leaves(copies))):
        return  # the forward writes an input itself: its writes are kept (and planned as such)
    names = sorted({n.args[0].name for n in writes})
    for node in writes:
        gm.graph.erase_node(node)
    gm.recompile()
    notes.append(f"torch.export recorded a write into the input(s) {', '.join(names)} where forward stored a tensor "
                 "on the model; the eager forward writes no input, so the write was removed from the graph")


@contextlib.contextmanager
def one_process_view(notes: list[str]):
    """Inside, the default process group is hidden: the model runs as it does on one device, on the global batch
    the example inputs hold, which is what every parallel program must compute. A model written for DDP that
    syncs batch statistics itself when a process group exists (vector-quantize-pytorch's LFQ:
    `dist.nn.all_reduce(avg_prob) / world_size` of its codebook entropy; FLAVA's global contrastive head, which
    all-gathers the embeddings and offsets its labels by the rank) could not be exported on ranks (torch's
    "all_reduce is not supported under torch.compile", a TraceError on every rank of `rehearse` and of
    `auto_parallelize` under torchrun), and its eager calls on ranks (the trace's eager checks, `rehearse`'s
    single-device references: `runtime.module_copy.reference_copy`) computed its distributed variant.
    Every way of asking answers "no group": `torch.distributed.is_initialized()`, the same function imported
    by name (`from torch.distributed import is_initialized`) or read from `distributed_c10d`, and
    `get_world_size()` / `get_rank()` (they raise as without a group, which such code catches), since the default
    group itself (`GroupMember.WORLD`, a public class property of torch.distributed; checked on torch 2.13.0) is
    None inside and restored on exit. Round 24 (r24e): before, only the module attribute `is_initialized` was
    replaced, and the three other forms failed on ranks with a TraceError blaming the export. Sub-groups made by
    `new_group` are untouched. Noted when forward asked `torch.distributed.is_initialized()` while a group
    exists."""
    import torch.distributed as dist

    if not dist.is_available():
        yield
        return
    world = dist.GroupMember.WORLD  # the default group, None without one
    original = dist.is_initialized
    asked: list[bool] = []

    def is_initialized() -> bool:
        asked.append(world is not None)
        return False

    dist.is_initialized = is_initialized
    dist.GroupMember.WORLD = None
    try:
        yield
    finally:
        dist.GroupMember.WORLD = world
        dist.is_initialized = original
    if any(asked):
        notes.append("forward asked torch.distributed.is_initialized() while a process group exists: traced as on "
                     "one device (False), since the parallel program computes the model's step on the global batch "
                     "and does its own communication")


def torch_bookkeeping_warning(model: torch.nn.Module) -> str | None:
    """A `warnings.filterwarnings` message pattern for torch.export's "The tensor attributes ... were assigned
    during export. Such attributes must be registered as buffers" (torch/_functorch/_aot_autograd/
    frontend_utils.py) when every attribute it names is torch's own bookkeeping, recomputed at every call and
    restored by export: nn.LSTM / GRU / RNN's `_flat_weights[i]` (refreshed when export swaps the parameters) and
    the weight that the hook forms of `torch.nn.utils.weight_norm` / `spectral_norm` set in their forward
    pre-hook. Round 23 (r23f): every RNN and hook-form user was told to register torch's attributes as buffers.
    A warning naming any other attribute (the model's own state) is not matched. None when the model has none."""
    names = []
    for path, module in model.named_modules():
        prefix = re.escape(f"self.{path}." if path else "self.")
        if isinstance(module, torch.nn.RNNBase):
            names.append(prefix + r"_flat_weights\[\d+\]")
        names += [prefix + re.escape(hook.name) for hook in module._forward_pre_hooks.values()
                  if isinstance(hook, (WeightNorm, SpectralNorm))]
    if not names:
        return None
    one = "(?:" + "|".join(names) + ")"
    return rf"The tensor attributes? {one}(?:, {one})* (?:were|was) assigned during export\."
