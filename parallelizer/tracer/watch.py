"""What torch.export does not keep, watched while tracing (`tracer.trace` enters these around export).

export runs forward once and keeps the aten ops it saw. Three things a model can do in forward leave no op:
- draw from numpy's or Python's random generator (`host_rng_watch`): the values drawn become constants;
- change Python attributes of its modules (`python_state_watch`): the values read become constants and export
  restores the attributes, so the program computes with the first call's values at every step;
- call a `torch.autograd.Function` with its own backward, or register a tensor hook (`custom_backward_watch`):
  the program differentiates the Function's forward ops instead, and the hook is dropped.
Each is noted in `TracedGraph.notes` and warned; a Function whose backward is not the derivative of its forward
(checked in float64 on random inputs of the traced shapes) is a TraceError, since training would silently use
other gradients, and so is a host draw made in training mode (every step would reuse one draw) unless the
caller opts in with `allow_frozen_host_random=True` (round 20).
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

# The opt-in keyword of `trace` / `auto_parallelize` (and `parallelizer plan --allow-frozen-host-random`) that
# keeps a training-mode host draw a warning and a note instead of a TraceError.
HOST_RNG_OPT_IN = "allow_frozen_host_random"
HOST_RNG_SITES = "drawn at: "  # precedes the draw sites in the note (`runtime.rehearsal.random_ops` reads them)

# transformers config fields whose value > 0 makes forward draw with numpy in training (the `np.random` call
# sites of transformers 5.x: `_compute_mask_indices` (SpecAugment) of the wav2vec2 family, HuBERT, WavLM, SEW,
# Data2VecAudio, SpeechT5, Whisper; LayerDrop as `np.random.random()` / `np.random.uniform` in modules holding a
# `layerdrop` attribute: WavLM's and Data2VecAudio's adapters, VITS' text encoder). Setting each to 0 is the switch.
SPEC_AUGMENT_FIELDS = ("mask_time_prob", "mask_feature_prob")
LAYERDROP_FIELDS = ("layerdrop", "encoder_layerdrop", "decoder_layerdrop")


_NUMPY_DRAWS = ("rand", "randn", "randint", "random", "random_sample", "ranf", "sample", "choice", "uniform",
                "normal", "permutation", "shuffle", "binomial", "poisson", "beta", "exponential")
_PYTHON_DRAWS = ("random", "randint", "randrange", "choice", "choices", "uniform", "shuffle", "sample", "gauss")
_MAX_SITES = 5  # distinct draw sites named in the note / error


@contextlib.contextmanager
def host_rng_watch(notes: list[str], model: torch.nn.Module | None = None, *, allow: bool = False):
    """Watch the traced forward for draws from numpy's or Python's global random generator (`HOST_RNG_NOTE`):
    export runs forward once and lifts what it drew as constants, so every step of the program reuses ONE draw
    while the model draws anew per call (a silent wrong training: Wav2Vec2 with its default SpecAugment, rehearse
    ratio 4160-5359, round 19). Detected by comparing the generators' states before and after tracing (export
    itself draws from neither); the module-level draw functions are wrapped meanwhile so that each distinct call
    site is named: the draw function, the Python function and file:line that called it, and the nn.Module whose
    forward was running (its dotted name in `model`, and whether it was in training mode).

    A draw made while that module was in training mode raises TraceError naming the sites and the remedies
    (the config fields that switch them off, `_config_switches`; torch draws; the opt-in), unless `allow`
    (the `HOST_RNG_OPT_IN` keyword): then, as for a draw in eval mode (where the model draws and ignores it, e.g.
    WavLM's LayerDrop), it is noted and warned. A draw the wrappers cannot see (a function imported by name
    before tracing, `from numpy.random import rand`) is judged by `model.training`.

    A draw made after forward seeded the generator with a fixed value (`random.seed(0)`, `np.random.seed(0)`)
    gives the same values at every call, which is what the program repeats: noted, not refused (round 21, r21b:
    it was refused; `host_state.check_repeatable` still refuses a forward whose two eager calls differ)."""
    import random

    np = sys.modules.get("numpy")
    sites: dict[tuple, dict] = {}
    seeded = [False]  # forward seeded a global generator with a fixed value (draws after it repeat per call)
    names = {id(m): name for name, m in model.named_modules()} if model is not None else {}
    patched = [(random, name, getattr(random, name)) for name in _PYTHON_DRAWS]
    if np is not None:
        patched += [(np.random, name, getattr(np.random, name)) for name in _NUMPY_DRAWS if hasattr(np.random, name)]
    for module, name, fn in patched:
        setattr(module, name, _recording(fn, f"{'numpy.random' if module is not random else 'random'}.{name}", sites,
                                         names, seeded))
    seeds = [(module, "seed", module.seed) for module in (random, np.random if np is not None else None)
             if module is not None]
    for module, name, fn in seeds:
        setattr(module, name, _seeding(fn, seeded))
    patched += seeds
    before = (random.getstate(), np.random.get_state() if np is not None else None)
    try:
        yield
    except TraceError as exc:  # export refused something later in forward (LayerDrop's branch on a torch draw):
        # the training-mode host draws made before it are named in the same error, so that one round of
        # remedies traces (HuBERT's default config: layerdrop=0.0, then mask_time_prob=0, round 20)
        frozen = _training_sites(list(sites.values()), model)
        if not frozen or allow:
            raise
        text = str(exc).split("\n", 1)[1].rsplit("\nRemedy: ", 1)[0] if "\nRemedy: " in str(exc) else ""
        first_detail = "" if text.startswith("Remedy: ") else text
        raise TraceError(exc.construct, exc.location, exc.remedy.rstrip(".") + ". Also, before that point: "
                         + _refusal_remedy(model, sites),
                         detail="\n".join(filter(None, (first_detail, _refusal_detail(sites))))) from exc
    finally:
        for module, name, fn in patched:
            setattr(module, name, fn)
    after_np = np.random.get_state() if np is not None else None
    moved = random.getstate() != before[0] or (
        after_np is not None and (after_np[2] != before[1][2] or not (after_np[1] == before[1][1]).all()))
    if not moved:
        return
    drawn = list(sites.values())
    texts = [_site_text(site) for site in drawn[:_MAX_SITES]]
    training = _training_sites(drawn, model) if drawn else (
        [{}] if model is not None and model.training and not seeded[0] else [])
    if training and not allow:
        first = next((site for site in training if site), None)
        raise TraceError("random numbers drawn from numpy's or Python's generator in training mode, which tracing "
                         "freezes into the graph as constants", first["location"] if first else None,
                         _refusal_remedy(model, sites), detail=_refusal_detail(sites))
    note = HOST_RNG_NOTE + (f"; {HOST_RNG_SITES}{'; '.join(texts)}" if texts else "")
    notes.append(note)
    warnings.warn(note, stacklevel=4)


def _training_sites(drawn: list[dict], model: torch.nn.Module | None) -> list[dict]:
    """The draw sites made by a module in training mode (a site without a module: the root's mode), except
    those made after a fixed seed in forward (the same values at every call)."""
    root_training = model is not None and model.training
    return [site for site in drawn if not site.get("after_seed")
            and (site["training"] or (site["training"] is None and root_training))]


def _seeding(fn, seeded: list[bool]):
    """`fn` (random.seed / numpy.random.seed) that records whether the seed is a fixed value (not None)."""
    def seed(*args, **kwargs):
        value = args[0] if args else kwargs.get("a", kwargs.get("seed"))
        seeded[0] = value is not None
        return fn(*args, **kwargs)
    return seed


def _refusal_remedy(model: torch.nn.Module | None, sites: dict) -> str:
    """The remedies of a training-mode host draw: the model's config switches of the draws (`_config_switches`),
    torch draws, eval mode, the opt-in."""
    switches = _config_switches(model, list(sites.values()))
    spec_augment = "; SpecAugment also by apply_spec_augment=False" if any(
        k.endswith(SPEC_AUGMENT_FIELDS) for k in switches) else ""
    return ((f"switch the draw off with the model's config: {', '.join(f'{k}=0' for k in switches)} (e.g. "
             f"`model.config.{switches[0]} = 0.0` before tracing{spec_augment}); or " if switches else "")
            + "draw with torch (torch.rand / torch.randint / torch.randperm / torch.bernoulli: the program then draws "
            "anew at every step); or trace in eval mode (model.eval()) if you do not train; or, to train with ONE "
            f"draw repeated at every step knowingly, pass {HOST_RNG_OPT_IN}=True to parallelizer.trace / "
            "auto_parallelize (`parallelizer plan --allow-frozen-host-random`)")


def _refusal_detail(sites: dict) -> str:
    texts = [_site_text(site) for site in list(sites.values())[:_MAX_SITES]]
    return ("numpy / Python random drawn in training mode: every step of the traced and the parallel program would "
            "reuse the one draw made while tracing, while the model draws new values per call (a silently different "
            "training); drawn at: " + ("; ".join(texts) if texts else "a call the tracer could not name (a draw "
                                       "function imported by name before tracing)"))


def _recording(fn, name: str, sites: dict, names: dict, seeded: list[bool]):
    """`fn` that records each distinct calling site (`_site`) outside this module, and whether it drew after a
    fixed seed (`seeded[0]`)."""
    def draw(*args, **kwargs):
        frame = sys._getframe(1)
        key = (frame.f_code.co_filename, frame.f_lineno)
        if key not in sites and len(sites) < 4 * _MAX_SITES:
            sites[key] = {**_site(name, frame, names), "after_seed": seeded[0]}
        return fn(*args, **kwargs)
    return draw


def _site(name: str, frame, names: dict) -> dict:
    """The draw `name` called at `frame`: the calling function, file:line and source, and the innermost
    nn.Module whose method is on the stack (its dotted name in the traced model, class, training flag)."""
    import linecache

    location = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    owner, outer = None, frame
    while outer is not None and owner is None:
        candidate = outer.f_locals.get("self")
        owner = candidate if isinstance(candidate, torch.nn.Module) else None
        outer = outer.f_back
    module = None if owner is None else (names.get(id(owner)), type(owner).__name__)
    layerdrop = getattr(owner, "layerdrop", None)
    return {"name": name, "function": frame.f_code.co_name, "location": location, "code": code, "module": module,
            "training": owner.training if owner is not None else None,
            "layerdrop": isinstance(layerdrop, (int, float)) and layerdrop > 0}


def _site_text(site: dict) -> str:
    """'numpy.random.rand in _compute_mask_indices at file:line (code), in module 'hubert' (HubertModel, training)'."""
    text = f"{site['name']} in {site['function']} at {site['location']}" + \
        (f" ({site['code']})" if site["code"] else "")
    if site["module"] is not None:
        name, cls = site["module"]
        mode = {True: "training", False: "eval", None: "mode unknown"}[site["training"]]
        text += (f", in module {name!r} ({cls}, {mode})" if name else
                 f", in the root module ({cls}, {mode})" if name == "" else f", in a {cls} ({mode})")
    return text


def _config_switches(model: torch.nn.Module | None, drawn: list[dict]) -> list[str]:
    """The config fields of `model.config` (a transformers model) or of its sub-configs (`text_config`, ...),
    as 'field' or 'sub_config.field', that are > 0 and switch the draws off: `SPEC_AUGMENT_FIELDS` for a draw in
    `_compute_mask_indices`, `LAYERDROP_FIELDS` for a draw in a module with a `layerdrop` > 0."""
    config = getattr(model, "config", None)
    fields = (SPEC_AUGMENT_FIELDS if any(site["function"] == "_compute_mask_indices" for site in drawn) else ()) \
        + (LAYERDROP_FIELDS if any(site["layerdrop"] for site in drawn) else ())
    if config is None or not fields:
        return []
    found = []
    for prefix, cfg in [("", config)] + [(f"{k}.", v) for k, v in vars(config).items()
                                         if k.endswith("_config") and hasattr(v, "__dict__")]:
        found += [prefix + field for field in fields
                  if isinstance(getattr(cfg, field, None), (int, float)) and getattr(cfg, field) > 0]
    return found


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
