"""The action lists of the schedules the simulator prices (`planner.simulate`): what is priced is what runs, so the
lists are torch's. `action_schedule(name, p, m)` builds a validated `ActionSchedule` (`planner.action_schedule`: per
rank the compute actions F / B / I / W of torch.distributed.pipelining's `_Action` vocabulary, in run order, and the
stage -> rank map) for

=================== =========================================================== ==========================
name                list from                                                    placement (S stages)
=================== =========================================================== ==========================
"gpipe"             `ScheduleGPipe._get_pipeline_order`                          S = p, stage k on rank k
"1f1b"              the loop of `Schedule1F1B._step_microbatches` (p - k warm-up  S = p
                    forwards, then B/F pairs, then the remaining B) - torch's
                    `_get_pipeline_order` numbers the last rank's microbatches
                    1..m (a drawing helper; the runtime does not use it)
"interleaved_1f1b"  `ScheduleInterleaved1F1B._calculate_single_rank_operations`  S = 2p looped (k on k % p)
"zbv"               `ScheduleZBVZeroBubble._calculate_single_rank_operations`    S = 2p in a V
"dualpipev"         `ScheduleDualPipeV._calculate_single_rank_operations`        S = 2p in a V
"bitpipe"           `planner.bitpipe.bitpipe_actions` (when present)             its own (2 copies)
=================== =========================================================== ==========================

The multi-stage lists come from the schedule class's per-rank generator called on an instance made without
`__init__` (no process group, no stages: the generators read only p, m and the local stage count);
`__init__` would also insert the SEND/RECV actions (`_prepare_schedule_with_comms`), which takes minutes
at p = 64, m = 512. Lists are cached per (name, p, m).

Split out of `planner/simulate.py` in round 24 (over 600 lines); no behaviour changed.
"""
from __future__ import annotations

import functools
import importlib

from torch.distributed.pipelining import schedules as _torch

from ..errors import PipelineError
from .action_schedule import ActionSchedule, compute_actions

_V_STAGES = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2, "zbv": 2, "dualpipev": 2}
_TORCH_MULTI = {"interleaved_1f1b": _torch.ScheduleInterleaved1F1B, "zbv": _torch.ScheduleZBVZeroBubble,
                "dualpipev": _torch.ScheduleDualPipeV}


def _one_f_one_b(p: int, m: int) -> dict[int, list]:
    """Schedule1F1B's runtime order (module docstring): stage k runs min(m, p - k) forwards, then
    backward / forward pairs, then the remaining backwards."""
    out = {}
    for k in range(p):
        warm = min(m, p - k)
        acts = [_torch._Action(k, _torch.F, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [_torch._Action(k, _torch.B, i), _torch._Action(k, _torch.F, warm + i)]
        out[k] = acts + [_torch._Action(k, _torch.B, i) for i in range(m - warm, m)]
    return out


def _torch_multi(name: str, p: int, m: int) -> tuple[dict[int, list], dict[int, int]]:
    cls = _TORCH_MULTI[name]
    sched = object.__new__(cls)  # the generators read only these fields (module docstring)
    sched.pp_group_size, sched._n_microbatches, sched.n_local_stages, sched.num_stages = p, m, 2, 2 * p
    sched.number_of_rounds = max(1, m // p)
    sched.microbatches_per_round = m // sched.number_of_rounds
    style = "loop" if name == "interleaved_1f1b" else "v"
    return ({r: sched._calculate_single_rank_operations(r) for r in range(p)},
            _torch.generate_stage_to_rank_mapping(p, 2 * p, style=style))


@functools.lru_cache(maxsize=64)
def action_schedule(name: str, p: int, m: int) -> ActionSchedule:
    """The validated `ActionSchedule` of schedule `name` on p pipeline ranks with m microbatches (table in
    the module docstring; cached).

    Raises:
        PipelineError: an unknown name, p or m < 1, or (p, m) the schedule class refuses (torch's message).
    """
    if p < 1 or m < 1:
        raise PipelineError(f"schedule {name!r}: p={p}, m={m}; need p, m >= 1")
    try:
        if name == "bitpipe":
            sched = importlib.import_module(".bitpipe", __package__).bitpipe_actions(p, m)
        else:
            if name == "gpipe":
                lists, placement = _torch.ScheduleGPipe._get_pipeline_order(_GPipeShape(p, m)), None
            elif name == "1f1b":
                lists, placement = _one_f_one_b(p, m), None
            elif name in _TORCH_MULTI:
                lists, placement = _torch_multi(name, p, m)
            else:
                raise PipelineError(f"unknown pipeline schedule {name!r}; use one of {SIMULATED_SCHEDULES}")
            placement = placement or {k: k for k in range(p)}
            sched = ActionSchedule(name, {r: compute_actions(a) for r, a in lists.items()}, placement,
                                   p * _V_STAGES[name], m)
    except (ValueError, RuntimeError, ModuleNotFoundError) as e:
        if isinstance(e, PipelineError):
            raise
        raise PipelineError(f"schedule {name!r} with p={p}, m={m}: {e}") from e
    sched.validate()
    return sched


SIMULATED_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe")


class _GPipeShape:
    """The two fields `ScheduleGPipe._get_pipeline_order` reads."""

    def __init__(self, p: int, m: int) -> None:
        self._num_stages, self._n_microbatches = p, m
