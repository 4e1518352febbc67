"""Simulated ranks in one process: torch's threaded process group (one thread per rank), kept alive for the
whole test session, so that a rank program (with its collectives, forward and backward) runs on every rank
of a mesh of up to 4 devices in milliseconds instead of seconds per launch.

Private torch API (checked on torch 2.13.0): `torch.testing._internal.distributed.multi_threaded_pg`
(the backend DTensor's own tests use) and `torch._C._distributed_c10d._set_thread_isolation_mode`.
"""
from __future__ import annotations

import contextlib
import faulthandler
import queue
import threading
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist

from parallelizer.rewriter.collectives import find_group

WORLD = 4
GROUPS = ([0, 1], [0, 1, 2], [0, 2], [1, 3], [2, 3])  # sub-groups of meshes 2, 3, 2x2 (4 = the world)
TIMEOUT_S = 30.0


class SimWorld:
    """`run(fn)` calls `fn(rank)` on every rank's thread at once and returns the results by rank; an exception
    on any rank is re-raised with that rank's traceback. Collectives inside `fn` run over the threaded group."""

    def __init__(self) -> None:
        from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg

        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        _install_threaded_pg()
        self._store = dist.HashStore()
        self.broken = ""
        self._jobs = [queue.Queue() for _ in range(WORLD)]
        self._results: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._loop, args=(r,), daemon=True) for r in range(WORLD)]
        for t in self._threads:
            t.start()
        self.run(lambda rank: None)  # wait until every rank has joined

    def _loop(self, rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=WORLD, store=self._store)
        for ranks in GROUPS:
            dist.new_group(list(ranks))
        while True:
            fn = self._jobs[rank].get()
            try:
                self._results.put((rank, True, fn(rank)))
            except BaseException:  # noqa: BLE001 -- reported to the caller with the rank's traceback
                self._results.put((rank, False, traceback.format_exc()))

    def run(self, fn: Callable[[int], object]) -> list:
        if self.broken:
            raise RuntimeError(f"the simulated ranks are stuck since an earlier hang ({self.broken}); rerun alone")
        for q in self._jobs:
            q.put(fn)
        out, errors = [None] * WORLD, []
        for _ in range(WORLD):
            try:
                rank, ok, value = self._results.get(timeout=TIMEOUT_S)
            except queue.Empty:
                faulthandler.dump_traceback(all_threads=True)  # where each rank is stuck, to stderr
                self.broken = "; ".join(errors) or "timeout"
                raise TimeoutError(f"a simulated rank did not finish within {TIMEOUT_S} s (a collective that not "
                                   "every rank of its group called?)") from None
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        if errors:
            raise RuntimeError("\n".join(sorted(errors)))
        return out


_WORLD: SimWorld | None = None


def world() -> SimWorld:
    """The session's simulated world (started on first use)."""
    global _WORLD
    if _WORLD is None:
        _WORLD = SimWorld()
    return _WORLD


@contextlib.contextmanager
def agreed(size: int):
    """Run the block on ranks 0..size-1, then agree (an all-reduce of a failure flag) whether every rank got
    through it: a rank that raised re-raises, the others raise too instead of waiting in a later collective
    for a rank that is gone."""
    failure: BaseException | None = None
    try:
        yield
    except Exception as exc:  # noqa: BLE001 -- re-raised below once every rank knows
        failure = exc
    flag = torch.tensor([0.0 if failure is None else 1.0])
    group = find_group(list(range(size))) if size > 1 else None
    if size > 1:
        dist.all_reduce(flag, group=group)
    if failure is not None:
        raise failure
    if flag.item():
        raise RuntimeError("another simulated rank failed (see its error)")
