"""Rank bodies for the float64 judge's tests (`test_trial_findings.py`): a rehearsal case as `rehearse` runs it
on this rank, and the same with a planted wrong gradient."""
from __future__ import annotations

from unittest import mock


def rehearsed(rank: int, world_size: int, model_fn, spec, steps: int) -> dict:
    """This rank's result of `rehearse(model_fn, {}, spec, steps=steps)` (`rehearsal._rank_cases`)."""
    from parallelizer.runtime import rehearsal

    return rehearsal._rank_cases(rank, world_size, [(model_fn, {}, spec)], steps, 1e-3, 1e-3)[0]


def rehearsed_with_a_flipped_gradient(rank: int, world_size: int, model_fn, spec, steps: int, fqn: str) -> dict:
    """`rehearsed` with the sign of parameter `fqn`'s gradient flipped in the sharded program on every rank (a
    planted wrong program): the judge must flag it however it judges."""
    from parallelizer.runtime import rehearsal

    built = rehearsal.ParallelModule

    def flipped(*args, **kwargs):
        pm = built(*args, **kwargs)
        pm.get_parameter(fqn).register_hook(lambda grad: -grad)
        return pm

    with mock.patch.object(rehearsal, "ParallelModule", flipped):
        return rehearsed(rank, world_size, model_fn, spec, steps)
