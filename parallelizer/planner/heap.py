"""Planning without rescanning the caller's heap: the cyclic garbage collector's full collections skip what was alive
when planning began.

Planning allocates about 10^6 small objects (layouts, steps, PuLP variables and expressions). CPython's collector
runs a full (generation 2) collection whenever the objects that survived younger collections exceed a quarter of the
old generation, and each one walks every tracked object of the process: the traced graph's fx nodes and FakeTensors,
earlier plans, torch and transformers' modules. Round 26 (r26a, benchmarks/RESULTS.md) measured 4 full collections
taking 1.17 s of 6.5 CPU s in one dp x tp plan of a 2-layer Llama on 4 devices (about 740k tracked objects; under
load). `gc.freeze()` (Python >= 3.7) moves every tracked object into a permanent generation that collections skip;
`gc.unfreeze()` moves them back into the oldest generation, so nothing is leaked: garbage among them (there is none
the planner made: they existed before) is collected by the next full collection after planning. Objects made while
planning are collected as before (cycles included).
"""
from __future__ import annotations

import contextlib
import functools
import gc


@contextlib.contextmanager
def frozen_heap():
    """Freeze the heap for the duration of the block (module docstring). Does nothing when the collector is off or
    something is frozen already (an enclosing `frozen_heap`, or a caller's own `gc.freeze()`, which must not be undone
    here): only the freeze made here is undone."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def on_frozen_heap(fn):
    """Decorator: run `fn` inside `frozen_heap()` (the planner's entry points, `parallelizer.api.plan`)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with frozen_heap():
            return fn(*args, **kwargs)
    return wrapper
