"""What torch.export does not keep, watched while tracing (`tracer.trace` enters these around export).

export runs forward once and keeps the aten ops it saw. Three things a model can do in forward leave no op:
- draw from numpy's or Python's random generator (`host_rng_watch`): the values drawn become constants;
- change Python attributes of its modules (`python_state_watch`): the values read become constants and export
  restores the attributes, so the program computes with the first call's values at every step;
- call a `torch.autograd.Function` with its own backward, or register a tensor hook (`custom_backward_watch`):
  the program differentiates the Function's forward ops instead, and the hook is dropped.
Each is noted in `TracedGraph.notes` and warned; a Function whose backward is not the derivative of its forward
(checked in float64 on random inputs of the traced shapes) is a TraceError, since training would silently use
other gradients.
"""
from __future__ import annotations

import contextlib
import os
import sys
import traceback
import warnings

import torch
from torch.utils import _pytree as pytree

from ..errors import TraceError
from .graph import carries_grad


def internal(filename: str) -> bool:
    """Whether a source file belongs to torch or to this package (not to the user's model)."""
    return filename.startswith((os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))) \
        or filename.startswith("<")



HOST_RNG_NOTE = ("forward drew random numbers from numpy's or Python's generator (not torch's): tracing froze the "
                 "values it drew into the graph as constants, so the traced and the parallel program repeat them at "
                 "every step while the model draws new ones per call (e.g. Wav2Vec2's SpecAugment time mask, "
                 "mask_time_prob > 0); draw them with torch (torch.rand / torch.bernoulli) to keep them random, "
                 "or switch the augmentation off")


_NUMPY_DRAWS = ("rand", "randn", "randint", "random", "random_sample", "ranf", "sample", "choice", "uniform",
                "normal", "permutation", "shuffle", "binomial", "poisson", "beta", "exponential")
_PYTHON_DRAWS = ("random", "randint", "randrange", "choice", "choices", "uniform", "shuffle", "sample", "gauss")


@contextlib.contextmanager
def host_rng_watch(notes: list[str]):
    """Note, and warn, when the traced forward advanced numpy's or Python's global random generator
    (`HOST_RNG_NOTE`): export runs forward once and lifts what it drew as constants. Checked by comparing the
    generators' states before and after tracing (export itself draws from neither); the module-level draw
    functions are wrapped meanwhile so that the note names the first call's source line (e.g. a LayerDrop
    `np.random.random()` or a SpecAugment mask)."""
    import random

    np = sys.modules.get("numpy")
    calls: list[str] = []
    patched = [(random, name, getattr(random, name)) for name in _PYTHON_DRAWS]
    if np is not None:
        patched += [(np.random, name, getattr(np.random, name)) for name in _NUMPY_DRAWS if hasattr(np.random, name)]
    for module, name, fn in patched:
        setattr(module, name, _recording(fn, f"{'numpy.random' if module is not random else 'random'}.{name}", calls))
    before = (random.getstate(), np.random.get_state() if np is not None else None)
    try:
        yield
    finally:
        for module, name, fn in patched:
            setattr(module, name, fn)
    after_np = np.random.get_state() if np is not None else None
    moved = random.getstate() != before[0] or (
        after_np is not None and (after_np[2] != before[1][2] or not (after_np[1] == before[1][1]).all()))
    if moved:
        note = HOST_RNG_NOTE + (f"; first draw: {calls[0]}" if calls else "")
        notes.append(note)
        warnings.warn(note, stacklevel=4)


def _recording(fn, name: str, calls: list[str]):
    """`fn` that records, on its first call, `name` and the calling source line outside this module."""
    def draw(*args, **kwargs):
        if not calls:
            frame = next((f for f in reversed(traceback.extract_stack()[:-1]) if f.filename != __file__), None)
            calls.append(f"{name} at {frame.filename}:{frame.lineno} ({(frame.line or '').strip()})" if frame
                         else name)
        return fn(*args, **kwargs)
    return draw


_PLAIN = (int, float, bool, str, type(None))


def _plain_state(model: torch.nn.Module) -> dict[str, object]:
    """Python-valued attributes (numbers, strings, flags; not tensors, modules or containers of them) of every
    submodule, by dotted name."""
    return {f"{name}.{k}" if name else k: v for name, mod in model.named_modules()
            for k, v in vars(mod).items() if not k.startswith("_") and k != "training" and isinstance(v, _PLAIN)}


@contextlib.contextmanager
def python_state_watch(model: torch.nn.Module, notes: list[str]):
    """Note, and warn, when forward changes Python attributes of the model (`self.calls += 1`, a warm-up
    counter): export runs forward once, bakes the values it read into the graph as constants and then restores
    the attributes, so the traced and the sharded program compute with the first call's values at every step
    while the model would not. Seen by a forward hook on the root (run before torch restores them)."""
    before = _plain_state(model)
    changed: dict[str, tuple] = {}

    def hook(module, args, output):
        after = _plain_state(model)
        changed.update({k: (before.get(k), v) for k, v in after.items() if k not in before or before[k] != v})

    handle = model.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
    if changed:
        text = ("forward changes Python attributes of the model (" + ", ".join(
            f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items())[:5]) + "): tracing bakes the values forward "
            "read into the graph, so the traced and the parallel program compute with them at every step while "
            "the model would read the new ones; keep such state in a registered buffer (a tensor updated in place) "
            "or pass it as an input")
        notes.append(text)
        warnings.warn(text, stacklevel=4)


@contextlib.contextmanager
def custom_backward_watch(notes: list[str]):
    """A `torch.autograd.Function` called in forward: export keeps only the ops of its forward, so the traced
    (and every sharded) program differentiates those ops instead of calling its `backward`. Each Function
    class defined outside torch and this package is checked once after tracing (`_check_custom_backward`): its
    backward against autograd of its forward, on random inputs of the traced shapes. Equal (BLOOM's GeLU, a
    fused op written for speed): noted. Different (a gradient reversal layer, a straight-through estimator):
    TraceError, since the program would train with other gradients than the model, silently. Not checkable
    (non-float inputs, a forward that needs more of ctx than save_for_backward): warned and noted."""
    function = torch.autograd.function.Function
    original = function.__dict__["apply"]
    seen: dict[type, tuple] = {}
    grad_off: set[type] = set()  # Functions whose forward turns gradients off (torch.no_grad inside)

    def apply(cls, *args, **kwargs):
        if cls not in seen and not internal(getattr(sys.modules.get(cls.__module__), "__file__", None) or "<"):
            metas = pytree.tree_map_only(torch.Tensor, lambda t: (tuple(int(d) for d in t.shape), t.dtype,
                                                                  t.requires_grad), (args, kwargs))
            user = [f for f in traceback.extract_stack()[:-1] if not internal(f.filename)]
            seen[cls] = (metas, f"{user[-1].filename}:{user[-1].lineno}" if user else None)
        # apply runs forward with grad mode off in C++ and turns it back on after, where export does not see
        # it: a no_grad block inside forward (or an enable_grad block's exit) leaves the rest of forward AND
        # every later op of the model exported under no_grad. Such a Function is refused after tracing
        # (`grad_off`); the mode is set again after apply, where export sees it, so the refusal is the error
        # the user gets rather than a graph without gradients.
        enabled, set_grad = torch.is_grad_enabled(), torch._C._set_grad_enabled

        def watched_set_grad(mode: bool):
            if not mode:
                grad_off.add(cls)
            return set_grad(mode)

        torch._C._set_grad_enabled = watched_set_grad
        try:
            return original.__func__(cls, *args, **kwargs)
        finally:
            torch._C._set_grad_enabled = set_grad
            torch.set_grad_enabled(enabled)

    hook_calls: list[str] = []
    register_hook = torch.Tensor.register_hook

    def watched_hook(tensor, hook):
        user = [f for f in traceback.extract_stack()[:-1] if not internal(f.filename)]
        hook_calls.append(f"{user[-1].filename}:{user[-1].lineno}" if user else "an unknown location")
        return register_hook(tensor, hook)

    function.apply = classmethod(apply)
    torch.Tensor.register_hook = watched_hook
    try:
        yield
    finally:
        function.apply = original
        torch.Tensor.register_hook = register_hook
    if hook_calls:
        text = (f"forward registers a gradient hook on a tensor (register_hook at {', '.join(sorted(set(hook_calls)))}): "
                "torch.export drops it, so the traced and the sharded program run without it; a hook that changes "
                "the gradient (scaling, clipping) must become ops of forward (e.g. a detach form) or a hook on the "
                "ParallelModule's parameters")
        notes.append(text)
        warnings.warn(text, stacklevel=4)
    for cls, (metas, location) in seen.items():
        _check_custom_backward(cls, metas, location, notes, grad_off=cls in grad_off)


_CUT_REMEDY = ("its backward computes the gradients itself (a reversible or recomputing layer, e.g. Reformer's "
               "RevNet) while torch.export keeps only the forward's ops, so the program's gradient would stop there, "
               "silently. Write forward without the Function (for the memory saving, torch.utils.checkpoint regions "
               "are supported and recomputed in backward)")


class _Ctx:
    """A stand-in for the ctx of an autograd.Function's forward, called directly (autograd records its ops)."""

    def __init__(self) -> None:
        self.saved_tensors = ()
        self.needs_input_grad = ()

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *args) -> None:
        pass

    def set_materialize_grads(self, value) -> None:
        pass

    def mark_dirty(self, *args) -> None:
        raise RuntimeError("mark_dirty")


def _check_custom_backward(cls: type, metas, location: str | None, notes: list[str], *, grad_off: bool = False) -> None:
    """Non-float tensor inputs (masks, indices) are ones: every position valid (YOSO's int query/key masks,
    which made the check give up before). Float inputs are drawn from N(0, scale^2), at scale 1 and else
    0.1: a forward defined only on part of the line (YOSO's acos of q . k) gives NaN at scale 1, and NaN
    gradients compared with `>` would have read as equal.

    Both calls draw from torch's generator in the same state, so a Function drawing random numbers in forward
    (XDropout) is compared with the same draws (before, its two masks differed and it was refused).
    Compared: the gradients of the float inputs AND of the parameters of modules passed to `apply` (a
    reversible layer, Reformer's `_ReversibleFunction(hidden, layers, ...)`, runs them in forward and
    accumulates their gradients inside its backward). An output whose forward ops carry no gradient (they
    run under `torch.no_grad()`, which the traced program keeps as a stop-gradient) has a derivative of zero.
    In float64 when the Function's modules allow it, else in the traced dtypes (float32: a looser bound).

    A Function whose forward turns gradients off (`grad_off`: torch.no_grad inside it) is a TraceError without
    the check: export keeps the rest of its forward without gradient, while its backward supplies one
    (Reformer's `_ReversibleFunction`; its cache argument, filled by the traced call, also makes a re-run fail)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if grad_off:
        raise TraceError(f"a torch.autograd.Function with its own backward ({name}) whose forward turns gradients "
                         "off (torch.no_grad(), or the exit of torch.enable_grad(), inside it)", location, _CUT_REMEDY,
                         detail="torch.export keeps the ops after that point in forward without gradient")

    def is_meta(x):
        return isinstance(x, tuple) and len(x) == 3 and isinstance(x[1], torch.dtype)

    modules = [m for m in pytree.tree_leaves(metas, is_leaf=is_meta) if isinstance(m, torch.nn.Module)]
    params = list(dict.fromkeys(p for m in modules for p in m.parameters() if p.requires_grad))

    def attempt(scale: float, dtype: torch.dtype | None):
        gen = torch.Generator().manual_seed(0)

        def real(meta):
            shape, traced_dtype, grad = meta
            if not carries_grad(traced_dtype):
                return torch.ones(shape, dtype=traced_dtype)
            wide = torch.complex128 if traced_dtype.is_complex else torch.float64
            x = scale * torch.randn(shape, generator=gen, dtype=wide)
            return x.to(traced_dtype if dtype is None or traced_dtype.is_complex else dtype).requires_grad_(grad)

        args, kwargs = pytree.tree_map(lambda m: real(m) if is_meta(m) else m, metas, is_leaf=is_meta)
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not inputs:
            return None
        leaves = [*inputs, *params]

        def grads(run):  # gradients of `leaves` for the seeded outputs of `run` (None: none carries one)
            kept = [p.grad for p in params]
            for t in leaves:
                t.grad = None
            try:  # both runs draw the same numbers (XDropout's mask in DeBERTa-v2 / SEW-D)
                with torch.enable_grad(), torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)
                    # complex outputs too (skipped before, trial r12a: a Function from real to complex values whose
                    # backward is wrong passed with neither error nor note)
                    outs = [o for o in pytree.tree_leaves(run()) if isinstance(o, torch.Tensor) and carries_grad(o.dtype)]
                    seeds = [torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=o.dtype) for o in outs]
                    pairs = [(o, s) for o, s in zip(outs, seeds) if o.requires_grad]
                    if pairs:
                        torch.autograd.backward([o for o, _ in pairs], [s for _, s in pairs])
                return [t.grad for t in leaves], bool(pairs)
            finally:
                for p, g in zip(params, kept):
                    p.grad = g

        g_custom, any_custom = grads(lambda: cls.apply(*args, **kwargs))
        if not any_custom:
            return None
        g_plain, _ = grads(lambda: cls.forward(_Ctx(), *args, **kwargs))
        return g_custom, g_plain

    def finite(grads):
        return all(g is None or bool(torch.isfinite(g).all()) for g in (*grads[0], *grads[1]))

    try:
        leaves = [m for m in pytree.tree_leaves(metas, is_leaf=is_meta) if is_meta(m)]
        if not any(carries_grad(m[1]) for m in leaves):
            raise RuntimeError("no float tensor inputs")
        try:
            dtype, bound = torch.float64, 1e-6
            grads = attempt(1.0, dtype)
        except RuntimeError:  # modules passed to the Function hold float32 parameters: check in their dtype
            dtype, bound = None, 1e-4
            grads = attempt(1.0, dtype)
        if grads is not None and not finite(grads):
            grads = attempt(0.1, dtype)
            if grads is not None and not finite(grads):
                raise RuntimeError("non-finite gradients on random inputs at scales 1 and 0.1")
        if grads is None:
            return
        g_custom, g_plain = grads
    except Exception as exc:  # the check could not run: say so, do not guess
        text = (f"forward calls the torch.autograd.Function {name}: the traced program differentiates the ops of "
                f"its forward instead of calling its backward, and whether the two agree could not be checked "
                f"({type(exc).__name__}: {str(exc)[:120]}); if its backward is not the derivative of its forward "
                "(gradient reversal, straight-through estimators), the sharded program's gradients differ")
        notes.append(text)
        warnings.warn(text, stacklevel=4)
        return
    zero = torch.zeros(())
    worst = max((((a if a is not None else zero) - (b if b is not None else zero)).abs().max().item()
                 for a, b in zip(g_custom, g_plain)), default=0.0)
    scale = max((g.abs().max().item() for g in (*g_custom, *g_plain) if g is not None), default=0.0)
    if worst > bound * max(scale, 1.0):
        cut = all(g is None or not bool(g.any()) for g in g_plain)
        # no gradient path at all (a detached forward: a reversible layer) vs ops whose derivative is zero (a
        # quantiser's rounding: a straight-through estimator, whose remedy is the detach form; trial r19g)
        detached = all(g is None for g in g_plain)
        raise TraceError(
            f"a torch.autograd.Function with its own backward ({name}) whose backward is not the derivative of "
            "its forward", location,
            (_CUT_REMEDY if detached else
             "torch.export keeps only the ops of its forward, so the program would be trained with their "
             "derivative instead, silently. Write the custom gradient with detach instead: a straight-through "
             "estimator as x + (f(x) - x).detach(), a gradient reversal by a as (1 + a) * x.detach() - a * x"),
            detail=f"on random inputs of the traced shapes its backward and the derivative of its forward differ "
                   f"by {worst:.3g} (largest gradient {scale:.3g}" + ("; the forward's ops carry no gradient)"
                                                                     if cut else ")"))
    notes.append(f"forward calls the torch.autograd.Function {name}: traced as the ops of its forward; its backward "
                 f"equals their derivative on random inputs of the traced shapes (checked in "
                 f"{'float64' if dtype is not None else 'the traced dtypes'})")
