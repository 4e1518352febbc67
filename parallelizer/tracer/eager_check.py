"""Does the exported program compute what the model computes eagerly? (one call on the example inputs)

torch.export runs forward under tracing, and model code can take another path there than in an eager call:
a `torch.compiler.is_compiling()` / `is_exporting()` / `torch.jit.is_tracing()` branch, or a mask that a
library builds only when traced (transformers 5.24's PaliGemma, default config: eager attention gets no mask
and attends both ways, the exported program builds the causal mask; logits 7e-2 apart on one device). Every
sharded program computes the EXPORTED function, so such a model would train to other numbers than the user's,
on every mesh, without an error. `compare_with_eager` runs both once on the example inputs and warns (and
notes) when they differ beyond 10x torch.testing's default tolerance of the output dtype.

A forward that draws from torch's generators (dropout: BERT, GPT-2, ViT and T5 have 0.1 in their default
configs) is compared too: both calls start from the same generator state, and the exported program draws in
the order the traced code does, so the same path gives the same masks (GPT-2, BERT, Llama with attention
dropout, ViT: bitwise equal; T5 1e-6) and another path does not. Skipped where one call cannot decide:
parameters or inputs on the meta device (nothing computes; the trace notes the meta device already), and,
with a note saying why, forward drawing from the host generators (Python's random, numpy) or changing
Python attributes of the model, or more than `MAX_ELEMENTS` parameter elements (two forwards of a large
model on the host would cost more than the trace). Buffers forward writes (BatchNorm statistics) and torch's
RNG state are restored after the two calls, and each call gets copies of the inputs, so tracing leaves the
model and the example inputs as they were.
"""
from __future__ import annotations

import contextlib
import sys
import warnings

import torch
from torch.utils import _pytree as pytree

from .graph import as_real, draws_random
from .slots import tensor_slots_kept
from .leaves import leaves_by_path, pair_by_path

MAX_ELEMENTS = 50_000_000  # parameter elements (~200 MB in fp32): two host forwards stay cheaper than the trace
_FACTOR = 10.0  # times torch.testing's default rtol / atol of the dtype: eager and exported run the same kernels


def compare_with_eager(model: torch.nn.Module, exported, args: tuple, kwargs: dict, notes: list[str]):
    """Run `model(*args, **kwargs)` and `exported.module()(*args, **kwargs)` once and warn when an output leaf
    differs (module docstring). Appends a note in every case but a match or a meta model. Never raises for a
    mismatch: the user decides (rehearse shows the numbers); raises nothing of its own. Returns the eager call's
    output when the two were compared, else None (`host_state.check_repeatable` calls forward a second time)."""
    if _on_meta(model, args, kwargs):  # nothing computes (the trace notes the meta device already)
        return None
    reason = _skip_reason(model, notes)
    if reason:
        notes.append(f"exported program not compared with eager forward: {reason}")
        return None
    try:
        with _state_kept(model) as restore:
            try:
                eager = model(*_fresh(args), **_fresh(kwargs))
            except Exception as exc:  # noqa: BLE001 - the model's own error, reported, not raised
                _warn_eager_raises(exc, notes)
                return None
            restore()  # both calls start from the same state (a buffer forward writes, then reads)
            traced = exported.module()(*_fresh(args), **_fresh(kwargs))
    except Exception as exc:  # noqa: BLE001 - the comparison is advisory; the trace itself succeeded
        notes.append(f"exported program not compared with eager forward: a call raised {type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
        return None
    paired = pair_by_path(eager, traced)  # by key path: a ModelOutput rebuilt by export may order its fields
    if paired is None:                    # otherwise than eager's (`tracer.leaves`)
        notes.append(f"exported program not compared with eager forward: {len(leaves_by_path(eager))} output "
                     f"leaves eagerly, {len(leaves_by_path(traced))} exported, at other paths")
        return None
    pairs = [(f"{i}{' ' + path if path else ''}", a, b) for i, (path, a, b) in enumerate(paired)
             if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)]
    worst = _worst(pairs)
    if worst is not None:
        i, diff, shape = worst
        text = (f"the exported program differs from the model's eager forward on the example inputs (output leaf "
                f"{i} of shape {shape}: max |eager - exported| = {diff:.3g}): the model's code takes another path "
                "under torch.export than when called (a torch.compiler.is_compiling() / is_exporting() or "
                "torch.jit.is_tracing() branch, or a mask a library builds only when traced), and every parallel "
                "program computes the exported one, so it would train to other numbers than your model on any "
                "mesh. Remedy: make both paths compute the same (e.g. pass the mask or option that makes the "
                "eager path explicit), then trace again"
                + ("" if not any(draws_random(n) for n in exported.graph_module.graph.nodes if n.op == "call_function")
                   else " (the forward draws random numbers: both calls started from the same generator state, so "
                        "the same code path draws the same masks)"))
        notes.append(text)
        warnings.warn(text, stacklevel=3)
    return eager


def _warn_eager_raises(exc: Exception, notes: list[str]) -> None:
    """Warn and note that the model's eager forward raised on the example inputs although export traced it:
    export runs on fake tensors, which check no values (TAPAS's token type 2 into an embedding of 2 rows traced;
    every rank of every plan then raised IndexError inside the sharded program)."""
    text = (f"the model's eager forward raises {type(exc).__name__} on the example inputs "
            f"({str(exc).splitlines()[0][:200] if str(exc) else ''}) although torch.export traced it (export checks "
            "no tensor values, e.g. indices beyond an embedding's rows): every parallel program would raise too. "
            "Remedy: fix the example inputs (or the model) until model(*args, **kwargs) runs, then trace again")
    notes.append(text)
    warnings.warn(text, stacklevel=4)


def runs_eagerly(model: torch.nn.Module, args: tuple, kwargs: dict) -> bool | None:
    """Whether `model(*args, **kwargs)` returns without raising (no_grad; state and torch's RNG state restored),
    or None where one call is not run: meta tensors, or more than `MAX_ELEMENTS` parameter elements."""
    return eager_outcome(model, args, kwargs)[0]


def eager_outcome(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[bool | None, Exception | None]:
    """(`runs_eagerly`'s answer, the exception the eager call raised or None): an export failure's message
    states what the eager call did instead of guessing it (`export_errors.translate`)."""
    if _on_meta(model, args, kwargs) or _too_large(model):
        return None, None
    try:
        with _state_kept(model), torch.no_grad():
            model(*_fresh(args), **_fresh(kwargs))
        return True, None
    except Exception as exc:  # noqa: BLE001 - any error of the model's eager call answers the question
        return False, exc


def data_reads(model: torch.nn.Module, args: tuple, kwargs: dict) -> list[str]:
    """"file:line" of each place forward reads `.data` of a tensor (first seen first, each once), from one eager call
    with the model's state and the RNG kept (`_state_kept`), on meta too (a call that fails part-way still gives
    the reads before it). Only asked on the error path: an export that found a `.data` constant names no line
    (`export_errors.translate`; round 27: Gemma3n's AltUp clamp in modeling_gemma3n.py was named only as
    "model.layers.0.lifted_tensor_0"). [] for a model too large for a host forward (`_too_large`, not on meta)."""
    if _too_large(model) and not _on_meta(model, args, kwargs):
        return []
    getset = torch._C.TensorBase.__dict__["data"]  # the attribute torch.Tensor and nn.Parameter inherit
    sites: dict[str, None] = {}

    def read(tensor):
        frame = sys._getframe(1)
        sites.setdefault(f"{frame.f_code.co_filename}:{frame.f_lineno}")
        return getset.__get__(tensor)

    own = torch.Tensor.__dict__.get("data")  # None in the torch versions checked (2.13): inherited from TensorBase
    torch.Tensor.data = property(read, getset.__set__)  # shadows the C attribute for this one call
    try:
        with _state_kept(model), torch.no_grad():
            model(*_fresh(args), **_fresh(kwargs))
    except Exception:  # noqa: BLE001 - the reads before a failure are what is asked
        pass
    finally:
        if own is None:
            del torch.Tensor.data
        else:
            torch.Tensor.data = own
    return list(sites)


@contextlib.contextmanager
def _state_kept(model: torch.nn.Module):
    """Inside: torch's RNG state forked (CPU and the CUDA devices the model is on); on exit the model's state
    (`state_tensors`: buffers and parameters) is back to its values on entry, and whenever the yielded
    `restore()` is called the state AND the generators are (so a second forward draws what the first drew).
    Parameters count: a forward that writes one in place under no_grad (MoCo's momentum update of its key
    encoder) advanced it by one update per check call, so tracing changed the user's model (and the exported
    program, run second, read the written values: a false "differs from eager forward" warning)."""
    saved = {name: t.detach().clone() for name, t in state_tensors(model)}
    devices = sorted({t.device.index or 0 for t in [*model.parameters(), *model.buffers()] if t.device.type == "cuda"})

    def restore() -> None:
        with torch.no_grad():
            for name, t in state_tensors(model):
                if name in saved and t.shape == saved[name].shape:
                    t.copy_(saved[name])
        torch.set_rng_state(cpu_state)
        for d, state in zip(devices, cuda_states):
            torch.cuda.set_rng_state(state, d)
    try:
        with torch.random.fork_rng(devices=devices), tensor_slots_kept(model):
            cpu_state = torch.get_rng_state()
            cuda_states = [torch.cuda.get_rng_state(d) for d in devices]
            yield restore
    finally:
        restore()


def state_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter and buffer of `model`: what a forward may write in place."""
    return [*model.named_parameters(), *model.named_buffers()]


def _too_large(model: torch.nn.Module) -> bool:
    return sum(p.numel() for p in model.parameters()) > MAX_ELEMENTS


def _fresh(tree):
    """Copies of the tensors of `tree` (requires_grad kept): a forward that writes an input in place must
    neither change the caller's example inputs nor feed the second call a written one."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.requires_grad), tree)


def _on_meta(model, args, kwargs) -> bool:
    tensors = [*model.parameters(), *model.buffers(), *(t for t in pytree.tree_leaves((args, kwargs))
                                                       if isinstance(t, torch.Tensor))]
    return any(t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor) for t in tensors)


def _skip_reason(model, notes) -> str:
    if _too_large(model):
        return f"more than {MAX_ELEMENTS:,} parameter elements (two host forwards)"
    if any(n.startswith(("forward drew random numbers", "forward changes Python attributes")) for n in notes):
        return "forward draws host random numbers or changes Python attributes"
    return ""


def _worst(pairs) -> tuple[str, float, tuple] | None:
    """(leaf index and key path, largest |difference|, shape) of the first pair beyond `_FACTOR` times the dtype's bound
    (`runtime.tolerance.excess`: torch.testing's defaults; integers and bool exact), or None when all agree."""
    from ..runtime.tolerance import excess  # (runtime imports the tracer)

    for i, a, b in pairs:
        if a.shape != b.shape or a.dtype != b.dtype:
            return i, float("inf"), tuple(a.shape)
        if a.numel() and (not torch.equal(a.detach().isnan(), b.detach().isnan())
                          or excess(b.nan_to_num(0.0), a.nan_to_num(0.0)) > _FACTOR):
            diff = as_real(a.detach()).double() - as_real(b.detach()).double()
            return i, float(diff.abs().nan_to_num(0.0).max()), tuple(a.shape)
    return None
