"""Several rank bodies in ONE launch of ranks (importable by name in spawned ranks).

Starting a gloo rank costs seconds of CPU (a fresh interpreter imports torch, transformers and the package),
so a test module with several checks on the same number of ranks runs them in one `runtime.spawn` and its
tests read their parts of the results from a module-scoped fixture.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist


def run_each(rank: int, world_size: int, calls: list[tuple[Callable[..., Any], tuple]]) -> list[Any]:
    """Run `fn(rank, world_size, *args)` for each (fn, args) of `calls` in order (module-level functions) and
    return their results in that order. A barrier follows each body, so that no rank starts the next body's
    collectives while another still runs the previous one's."""
    results = []
    for fn, args in calls:
        results.append(fn(rank, world_size, *args))
        dist.barrier()
    return results
