"""Rank bodies for the float64 judge's tests (`test_trial_findings.py`): a rehearsal case as `rehearse` runs it
on this rank, and the same with a planted wrong gradient."""
from __future__ import annotations

import contextlib
from unittest import mock

import torch


def rehearsed(rank: int, world_size: int, model_fn, spec, steps: int) -> dict:
    """This rank's result of `rehearse(model_fn, {}, spec, steps=steps)` (`rehearsal._rank_cases`)."""
    from parallelizer.runtime import rehearsal

    return rehearsal._rank_cases(rank, world_size, [(model_fn, {}, spec)], steps, 1e-3, 1e-3)[0]


def _planted(rank: int, world_size: int, model_fn, spec, steps: int, fqn: str, hook) -> dict:
    """`rehearsed` with `hook` on parameter `fqn`'s gradient in every sharded program the rehearsal builds, its
    float64 replay's included (`runtime.replay64`)."""
    from parallelizer.runtime import rehearsal, replay64

    built = rehearsal.ParallelModule

    def planted(*args, **kwargs):
        pm = built(*args, **kwargs)
        pm.get_parameter(fqn).register_hook(hook)
        return pm

    with contextlib.ExitStack() as stack:
        for module in (rehearsal, replay64):
            stack.enter_context(mock.patch.object(module, "ParallelModule", planted))
        return rehearsed(rank, world_size, model_fn, spec, steps)


def rehearsed_with_a_flipped_gradient(rank: int, world_size: int, model_fn, spec, steps: int, fqn: str) -> dict:
    """The sign of `fqn`'s gradient flipped on every rank, in float32 and float64 alike (a wrong program)."""
    return _planted(rank, world_size, model_fn, spec, steps, fqn, lambda grad: -grad)


def rehearsed_with_float32_only_noise(rank: int, world_size: int, model_fn, spec, steps: int, fqn: str) -> dict:
    """`fqn`'s gradient moved by 1e-3 of its largest entry in float32 programs only: what rounding beyond the
    float64 judge's 8x looks like to the rehearsal (the float64 replay computes the gradient right)."""
    def noise(grad):
        return grad + 1e-3 * grad.abs().max() if grad.dtype == torch.float32 else grad

    return _planted(rank, world_size, model_fn, spec, steps, fqn, noise)
