"""Host state a forward reads and changes: evaluated once by tracing, frozen into the program (round 21, r21b).

torch.export runs forward once and keeps the aten ops it saw; a value forward computes on the host (Python,
numpy) from state that changes between calls becomes a constant of the program, so every step of the traced
and of every parallel program repeats the first call's value while the model computes a new one per call:
- a draw through a generator OBJECT (`np.random.default_rng(0)` / `np.random.RandomState` / `random.Random()`
  held by a module or a global: `tracer.watch.host_rng_watch` sees only numpy's and Python's global generators);
- a counter forward advances (`self.step += 1` then a warm-up scale or a curriculum branch read from it; a
  global or closure counter): `tracer.watch.python_state_watch` only noted the attributes;
- the clock (`time.time()`), or any other host value that a call changes.
`torch.manual_seed` called inside forward leaves no op either: export drops it, so the program draws new
masks at every step while the model reseeds (`seed_watch`). A `torch.Generator` object passed to a draw
(`generator=g`) is lifted as an opaque input no plan can feed (`refuse_generator_objects`).

`check_repeatable` decides by running the model's forward twice eagerly from the same tensor state and torch
generator state (its first call is `eager_check.compare_with_eager`'s): a forward that is a function of its
parameters, buffers, inputs and torch's generator gives the same outputs twice (within 10x torch.testing's
default tolerance of the dtype), whatever host values it reads (a config field, a shape, `os.environ`: constant
between calls, so they never raise). Outputs that differ mean the second call computed what the program cannot:
in training mode a TraceError naming the host state the first call changed (`host_snapshot`: plain attributes of
the modules, plain globals and closure cells of their classes' code, and generator objects held there) and the
remedies, unless the caller opts in with `allow_frozen_host_random=True` (`watch.HOST_RNG_OPT_IN`; then noted and
warned, as in eval mode). Skipped where one eager call cannot run: meta / fake tensors (the skeleton's retraces),
more than `eager_check.MAX_ELEMENTS` parameter elements. Host state is restored after the calls, so tracing leaves
the model's counters and generators where they were.

A plain attribute changed between steps by the training loop (`pm.temperature = t`, Gumbel tau annealing) is not
this module's business: the ParallelModule holds the root's settings and its mirrors the submodules', snapshots
them, and traces again when one changes (`runtime.mirror.changed_settings`).
"""
from __future__ import annotations

import contextlib
import copy
import random
import sys
import types
import warnings

import torch

from ..errors import TraceError
from .eager_check import _fresh, _on_meta, _state_kept, _too_large, _worst
from .leaves import pair_by_path
from .watch import HOST_RNG_OPT_IN, _PLAIN, internal

_MAX_NAMED = 5  # changed host values named in the error
REPEAT_NOTE = "two eager calls of forward on the same inputs, parameters and torch generator state differ"
"""How `check_repeatable`'s note (and error detail) begins: `frozen_host_state` finds it among a trace's notes."""
REPEAT_REMEDY = ("keep such state in a registered buffer updated in place (self.register_buffer('step', "
                 "torch.zeros((), dtype=torch.long)); self.step += 1 is then an op of the program), or pass the value "
                 "as an input of forward (a warm-up scale, a temperature), or draw with torch (torch.rand / "
                 "torch.randint / torch.randperm / torch.bernoulli) instead of a numpy / Python generator object")
RESEED_NOTE = "forward reseeds torch's generator"
"""How `refuse_reseeding`'s note begins."""
RESEED_REMEDY = ("seed once in the training loop, outside forward; for the same draw at every call, make a "
                 "torch.Generator once and pass it to the draw (torch.rand(..., generator=g)), or draw the mask "
                 "outside forward and pass it in")


def _generator_types() -> tuple[type, ...]:
    """Generator objects whose state a draw advances: numpy's Generator / RandomState (when numpy is loaded),
    Python's random.Random, torch.Generator."""
    np = sys.modules.get("numpy")
    numpy_types = (np.random.Generator, np.random.RandomState) if np is not None else ()
    return (*numpy_types, random.Random, torch.Generator)


def _state(obj):
    """The state of a generator object (a value `_same` compares and `_set_state` writes back)."""
    if isinstance(obj, random.Random):
        return obj.getstate()
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if hasattr(obj, "bit_generator"):  # numpy Generator
        return copy.deepcopy(obj.bit_generator.state)
    return obj.get_state()  # numpy RandomState


def _set_state(obj, state) -> None:
    if isinstance(obj, random.Random):
        obj.setstate(state)
    elif isinstance(obj, torch.Generator):
        obj.set_state(state)
    elif hasattr(obj, "bit_generator"):
        obj.bit_generator.state = state
    else:
        obj.set_state(state)


def _same(a, b) -> bool:
    """Equality of plain values and generator states (dicts / tuples of numbers, numpy arrays, tensors)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "shape") and hasattr(a, "dtype"):  # numpy array
        return hasattr(b, "shape") and a.shape == b.shape and bool((a == b).all())
    return type(a) is type(b) and a == b


def _holders(model: torch.nn.Module):
    """(description, namespace) of where forward keeps host state: each module's attributes ('attribute x of
    module 'a.b' (Cls)'), the globals of the Python modules defining the model's classes outside torch and this
    package, and the closure cells of their forward functions. The namespace is (dict, key) pairs: settable."""
    seen_globals: set[str] = set()
    for name, mod in model.named_modules():
        where = f"module {name!r}" if name else "the root module"
        yield (lambda k, where=where, cls=type(mod).__name__: f"attribute {k!r} of {where} ({cls})"), vars(mod)
        cls = type(mod)
        source = sys.modules.get(cls.__module__)
        if source is not None and cls.__module__ not in seen_globals and not internal(
                getattr(source, "__file__", None) or "<"):
            seen_globals.add(cls.__module__)
            yield (lambda k, m=cls.__module__: f"global {k!r} of {m}"), vars(source)
        forward = getattr(cls, "forward", None)
        for i, cell in enumerate(getattr(forward, "__closure__", None) or ()):
            names = forward.__code__.co_freevars
            with contextlib.suppress(ValueError):  # an empty cell
                yield ((lambda k, q=cls.__qualname__: f"closure variable {k!r} of {q}.forward"),
                       {names[i]: cell.cell_contents, "__cell__": cell})


def host_snapshot(model: torch.nn.Module) -> dict[str, tuple]:
    """{description: (kind, object or (namespace, key), value)} of the host state forward may read: plain
    values (bool, int, float, str, None) and generator objects (`_generator_types`) in `_holders`."""
    generators = _generator_types()
    out: dict[str, tuple] = {}
    for describe, namespace in _holders(model):
        cell = namespace.get("__cell__")
        for key, value in list(namespace.items()):
            if key == "__cell__" or key == "training" or (key.startswith("__") and key.endswith("__")):
                continue
            if isinstance(value, generators):
                out.setdefault(describe(key), ("generator", value, _state(value)))
            elif isinstance(value, _PLAIN) and not key.startswith("_") and not isinstance(value, types.ModuleType):
                out.setdefault(describe(key), ("plain", (cell, key) if cell is not None else (namespace, key), value))
    return out


def changed_host_state(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """'description: old -> new' (or 'description advanced') of each host value `after` holds otherwise."""
    changed = []
    for key, (kind, target, value) in after.items():
        old = before.get(key)
        if old is None or _same(old[2], value):
            continue
        changed.append(f"{key}: {old[2]!r} -> {value!r}" if kind == "plain" else
                       f"{key} ({type(target).__module__}.{type(target).__qualname__}) advanced")
    return changed


def restore_host_state(snapshot: dict[str, tuple]) -> None:
    """Write back the plain values and generator states of `snapshot`."""
    for kind, target, value in snapshot.values():
        if kind == "generator":
            _set_state(target, value)
        else:
            holder, key = target
            if isinstance(holder, types.CellType):
                holder.cell_contents = value
            else:
                holder[key] = value


def check_repeatable(model: torch.nn.Module, args: tuple, kwargs: dict, notes: list[str], *,
                     before: dict[str, tuple], first=None, allow: bool = False) -> None:
    """Run forward a second time (and a first, when `first`, the output of compare_with_eager's eager call,
    is None) and refuse, in training mode, outputs that differ (module docstring). `before`: `host_snapshot(model)`
    of the state both the trace and the first call started from (`host_state_kept` restored it after export,
    which advances globals and generator objects: a global counter read by `if CALLS > 1` was seen one call late);
    restored on return.

    Raises:
        TraceError: training mode, not `allow`, and the two calls' outputs differ beyond 10x the dtype's default
            tolerance; names the host values the first call changed and the remedies."""
    if _on_meta(model, args, kwargs) or _too_large(model):
        return
    try:
        with _state_kept(model):
            if first is None:
                first = model(*_fresh(args), **_fresh(kwargs))
        after = host_snapshot(model)
        with _state_kept(model):
            second = model(*_fresh(args), **_fresh(kwargs))
    except Exception:  # noqa: BLE001 - compare_with_eager reports an eager call that raises
        return
    finally:
        restore_host_state(before)
    paired = pair_by_path(first, second)
    if paired is None:
        worst = ("", float("inf"), ())
    else:
        worst = _worst([(f"{i}{' ' + path if path else ''}", a, b) for i, (path, a, b) in enumerate(paired)
                        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)])
    if worst is None:
        return
    changed = changed_host_state(before, after)
    named = ("; ".join(changed[:_MAX_NAMED]) + (" ..." if len(changed) > _MAX_NAMED else "") if changed else
             "nothing the tracer could name (a value the call reads and changes elsewhere: the clock, time.time(); "
             "a container held by a global; an unseeded generator made in forward)")
    detail = (f"{REPEAT_NOTE} (output "
              f"leaf {worst[0]} of shape {worst[2]}: max |first - second| = {worst[1]:.3g}): forward computes with "
              f"host values that a call changes. The traced program keeps the values of the call it traced as "
              f"constants and repeats them at every step. Changed by one call: {named}")
    if model.training and not allow:
        raise TraceError("a forward that reads host state it changes (a counter, a generator object, the clock), "
                         "which tracing freezes into the graph as constants", None,
                         REPEAT_REMEDY + "; or trace in eval mode (model.eval()) if you do not train; or, to "
                         f"train with the first call's values repeated knowingly, pass {HOST_RNG_OPT_IN}=True to "
                         "parallelizer.trace / auto_parallelize", detail=detail)
    notes.append(detail)
    warnings.warn(detail, stacklevel=3)


@contextlib.contextmanager
def host_state_kept(model: torch.nn.Module):
    """Yield `host_snapshot(model)` and write it back on exit: export runs forward once and restores the module
    attributes it changed, but not globals, closure cells or generator objects (a global counter stayed advanced
    after tracing, and the first eager call started from another state than the trace)."""
    before = host_snapshot(model)
    try:
        yield before
    finally:
        restore_host_state(before)


@contextlib.contextmanager
def seed_watch(calls: list[tuple[str, str | None]]):
    """Record in `calls` each call of `torch.manual_seed` / `torch.random.manual_seed` / `torch.seed` /
    `torch.set_rng_state` in forward as (function, file:line of the user's frame or None): export runs the call
    on the host and keeps no op, so the program never reseeds (`refuse_reseeding`)."""
    import traceback

    patched = [(owner, name, getattr(owner, name)) for owner in (torch, torch.random)
               for name in ("manual_seed", "seed", "set_rng_state") if hasattr(owner, name)]

    def recording(fn, name):
        def call(*a, **k):
            user = [f for f in traceback.extract_stack()[:-1] if not internal(f.filename)]
            calls.append((f"torch.{name}", f"{user[-1].filename}:{user[-1].lineno}" if user else None))
            return fn(*a, **k)
        return call

    for owner, name, fn in patched:
        setattr(owner, name, recording(fn, name))
    try:
        yield
    finally:
        for owner, name, fn in patched:
            setattr(owner, name, fn)


def refuse_reseeding(calls: list[tuple[str, str | None]], draws: bool, training: bool, notes: list[str],
                     allow: bool) -> None:
    """TraceError (training mode, the graph draws random numbers, not `allow`) for a reseed inside forward
    (`seed_watch`): every step of the model draws the same masks, the program new ones. Else noted."""
    if not calls:
        return
    sites = ", ".join(f"{name} at {where}" if where else name
                      for name, where in sorted(set(calls), key=str)[:_MAX_NAMED])
    detail = (f"{RESEED_NOTE} ({sites}): torch.export runs the call while tracing and keeps no "
              "op of it, so the traced and the parallel program draw new random numbers at every step (dropout "
              "masks) while the model reseeds and draws the same ones per call")
    if draws and training and not allow:
        raise TraceError("torch.manual_seed (or torch.seed / torch.set_rng_state) inside forward", calls[0][1],
                         RESEED_REMEDY + "; or, to train without the reseeding knowingly, pass "
                         f"{HOST_RNG_OPT_IN}=True", detail=detail)
    notes.append(detail)
    warnings.warn(detail, stacklevel=3)


def refuse_generator_objects(exported, model: torch.nn.Module) -> None:
    """TraceError for a `torch.Generator` object passed to a draw in forward (`torch.randn(..., generator=g)`):
    export lifts it as a custom-object input of the program (InputKind.CUSTOM_OBJ), which no plan can shard or
    feed (the planner stopped on it with a bare StopIteration: round 21, r21b). Names the draws that use it and
    the module attribute holding it, with the remedies."""
    from torch.export.graph_signature import InputKind

    lifted = {spec.arg.name: spec.target for spec in exported.graph_signature.input_specs
              if spec.kind == InputKind.CUSTOM_OBJ and "Generator" in getattr(spec.arg, "class_fqn", "")}
    if not lifted:
        return
    held = [f"{name + '.' if name else ''}{key}" for name, mod in model.named_modules()  # export lifts a copy:
            for key, g in vars(mod).items() if isinstance(g, torch.Generator)][:_MAX_NAMED]  # named by type
    nodes = [n for n in exported.graph_module.graph.nodes if n.op == "placeholder" and n.name in lifted]
    draws = [user.format_node() for n in nodes for user in n.users][:_MAX_NAMED]
    raise TraceError(
        "a torch.Generator object passed to a random draw in forward (generator=...)" +
        (f" (the model holds one as model.{', model.'.join(held)})" if held else ""), None,
        "draw from torch's default generator instead (seed it once in the training loop with torch.manual_seed: the "
        "program then draws anew at every step, each rank its shard of one device's draw), or draw the noise "
        "outside forward with your generator and pass it as an input",
        detail="torch.export lifts the generator as an opaque input of the program, which no plan can shard or "
               f"feed; draws using it: {'; '.join(draws)}")


HOST_STATE_LEADS = ("host state a forward call changes", RESEED_NOTE)
"""How each part `frozen_host_state` returns begins (a report's wording: host state, not random draws)."""


def frozen_host_state(notes: list[str]) -> str:
    """What a trace made with `allow_frozen_host_random=True` noted of host state frozen into its program
    (`check_repeatable`: a generator object, a counter, a global, the clock; `refuse_reseeding`: torch.manual_seed
    in forward), each with the remedy its TraceError gives; '' if nothing. For reports that run such a trace (a
    rehearsal names it next to a DIFFER, `runtime.rehearsal.random_ops`: before round 22 it named numpy's and
    Python's global generators only, and its float64 replay called the difference rounding)."""
    out = []
    for note in notes:
        if note.startswith(REPEAT_NOTE):
            named = note.split("Changed by one call: ", 1)[-1]
            out.append(f"{HOST_STATE_LEADS[0]}, FROZEN at trace time ({named}): the program repeats the "
                       f"traced call's values at every step while the model computes new ones per call; remedy: "
                       f"{REPEAT_REMEDY}")
        elif note.startswith(RESEED_NOTE):
            out.append(note.split(":", 1)[0] + ", which the program never does (it draws new masks at every step); "
                       f"remedy: {RESEED_REMEDY}")
    return "; ".join(out)
