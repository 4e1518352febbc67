"""How far two calibration profiles of one machine differ, quantity by quantity (`parallelizer calibrate --compare`,
issue 13's stability criterion: two calibrations within 10%).

:func:`compare_profiles` returns ``b / a - 1`` of EVERY quantity a profile prices, found by walking the fields of
:class:`cost_model.calibrate.Profile`, :class:`cost_model.hardware.DeviceSpec` and
:class:`cost_model.hardware.PipelineActionCost` (round 22, r22g: until then the comparison listed its quantities by
hand and missed the per-node host seconds ``op_host_s`` / ``op_host_bwd_s`` of round 21, which moved 2.1x between
the lead's idle pair, and ``launch_overhead_s``, ``optimizer_tensor_s`` and ``Profile.collective_cpu``). A field
that is not priced is named in :data:`DEVICE_NOT_COMPARED` / :data:`PROFILE_NOT_COMPARED` with the reason; a field of
a type this module cannot compare raises ``TypeError`` rather than being left out, so a new measured field has to
be placed here before any profile is compared.

Keys (what is compared):

* device: ``matmul_flops_per_s`` (fp32 peak; other dtypes ``peak_flops_per_s[DTYPE]``), ``memory_bytes_per_s``,
  ``step_efficiency`` (the matmul and memory efficiencies, equal on a calibrated CPU; ``memory_efficiency`` apart
  only where they differ), every other numeric field under its own name (``launch_overhead_s``, ``op_host_s``,
  ``op_host_bwd_s``, ``optimizer_bytes_per_s``, ``optimizer_tensor_s``); ``pipeline action [own runner ]NAME``
  for every seconds field of the pipeline action costs;
* per process count calibrated in both: ``xN collective_sync (of a 4 KiB all_reduce)`` (the change relative to the
  4 KiB all-reduce it adds to: the wait is 0 on few ranks), ``xN contention matmul|memory|optimizer``,
  ``xN comm_overlap (abs)`` (an absolute difference of a fraction), ``xN KIND SIZE KiB`` (the collective's seconds,
  :func:`cost_model.communication.flat_collective_time_s`, at each size-fit segment's upper size; a kind priced
  by the per-kind or joint alpha/beta instead, e.g. broadcast, at 64 KiB and 64 MiB, key suffix ``(alpha-beta)``),
  ``xN collective_cpu KIND per call|per byte``.

Both zero (a cost the profiles do not have, e.g. an own-runner field the runner has no action for): left out, it
would count as a perfect match. One zero: ``inf`` (a quantity that appeared or vanished).

What a user meets is not one quantity but a plan's step time (round 23, r23c): :func:`compare_step_predictions`
compares the predicted step seconds of the same plans priced on each profile (a caller that can plan gives them:
``python -m benchmarks.bench_steptime --compare-profiles A.json B.json``, the 42 bench plans made on A and
estimated on A and on B), median and worst |difference| and the count within 10%. A quantity's difference weighs in
a plan only through its share of the step: on the idle pair of round 22, 44 of 107 quantities moved by more than
10% (x2 send_recv 1 MiB +64%), while the 42 plans' predictions moved by a median of a few per cent
(benchmarks/RESULTS.md, round 23 r23c).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Mapping

import torch

from cost_model.communication import flat_collective_time_s
from cost_model.hardware import DeviceSpec, PipelineActionCost
from cost_model.topology import COLLECTIVE_KINDS, Link

__all__ = ["compare_profiles", "worst", "StepPredictionDiff", "compare_step_predictions", "DEVICE_NOT_COMPARED", "PROFILE_NOT_COMPARED", "LINK_NOT_COMPARED"]

# Fields that price nothing a calibration measures, with the reason.
DEVICE_NOT_COMPARED = {
    "name": "a label",
    "kind": "a label ('cpu' on every calibrated profile)",
    "hbm_bytes": "the machine's RAM, read from sysconf, not measured",
    "comm_overlap": "replaced per process count by Profile.comm_overlap (Profile.device_for), compared there",
    "collective_sync_s": "replaced per process count by Profile.collective_sync (Profile.device_for), compared there",
}
PROFILE_NOT_COMPARED = {"cpu_count": "the machine's core count, read from os.cpu_count, not measured"}
LINK_NOT_COMPARED = {"name": "a label"}
_DEVICE_KEYS = {"hbm_bytes_per_s": "memory_bytes_per_s", "matmul_efficiency": "step_efficiency"}
_ALPHA_BETA_SIZES = (1 << 16, 1 << 26)  # where a kind priced without a size fit is compared: latency and bandwidth
_SYNC_BASE_BYTES = 4096


def _rel(a: float | None, b: float | None) -> float | None:
    """``b / a - 1``; None where both are zero or unset (nothing priced), inf where only ``a`` is."""
    a, b = a or 0.0, b or 0.0
    if a == 0.0 and b == 0.0:
        return None
    return math.inf if a == 0.0 else b / a - 1


def _put(out: dict[str, float], key: str, value: float | None) -> None:
    if value is not None:
        out[key] = value


def _pipeline_diffs(a: PipelineActionCost, b: PipelineActionCost, label: str, out: dict[str, float]) -> None:
    for f in dataclasses.fields(PipelineActionCost):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if f.name == "own_runner":
            if va is not None and vb is not None:
                _pipeline_diffs(va, vb, "own runner ", out)
        else:
            _put(out, f"pipeline action {label}{f.name}", _rel(va, vb))


def _device_diffs(da: DeviceSpec, db: DeviceSpec, out: dict[str, float]) -> None:
    for f in dataclasses.fields(DeviceSpec):
        name = f.name
        if name in DEVICE_NOT_COMPARED:
            continue
        va, vb = getattr(da, name), getattr(db, name)
        if name == "peak_flops_per_s":
            for dtype in sorted(set(va) & set(vb), key=str):
                key = "matmul_flops_per_s" if dtype == torch.float32 else f"peak_flops_per_s[{dtype}]"
                _put(out, key, _rel(va[dtype], vb[dtype]))
        elif name == "memory_efficiency":
            if (va, vb) != (da.matmul_efficiency, db.matmul_efficiency):  # equal on a calibrated CPU: one key
                _put(out, name, _rel(va, vb))
        elif isinstance(va, PipelineActionCost):
            _pipeline_diffs(va, vb, "", out)
        elif va is None or isinstance(va, (int, float)):
            _put(out, _DEVICE_KEYS.get(name, name), _rel(va, vb))
        else:
            raise TypeError(f"compare_profiles: DeviceSpec.{name} ({type(va).__name__}) has no comparison. Remedy: "
                            "compare it in cost_model.profile_compare or name it in DEVICE_NOT_COMPARED with why")


def _link_diffs(n: int, la: Link, lb: Link, out: dict[str, float]) -> None:
    """Every kind at the sizes its price changes over (module docstring); the link's fields all price through
    :func:`flat_collective_time_s` (``Link.alpha_beta``: size fit, else per-kind, else joint alpha/beta)."""
    for kind in COLLECTIVE_KINDS:
        if kind in la.size_fits and kind in lb.size_fits:
            sizes, suffix = [int(upper) for upper, *_ in la.size_fits[kind]], ""
        else:
            sizes, suffix = list(_ALPHA_BETA_SIZES), " (alpha-beta)"
        for nbytes in sizes:
            ta, tb = (flat_collective_time_s(kind, nbytes, n, link) for link in (la, lb))
            _put(out, f"x{n} {kind} {nbytes >> 10} KiB{suffix}", _rel(ta, tb))


def _per_count(a, b, n: int, out: dict[str, float]) -> None:
    if n in a.collective_sync and n in b.collective_sync:  # relative to the 4 KiB all-reduce it adds to
        base = flat_collective_time_s("all_reduce", _SYNC_BASE_BYTES, n, a.links[n]) + a.collective_sync[n]
        out[f"x{n} collective_sync (of a 4 KiB all_reduce)"] = (b.collective_sync[n] - a.collective_sync[n]) / base
    if n in a.contention and n in b.contention:
        for i, what in enumerate(("matmul", "memory", "optimizer")[:min(len(a.contention[n]), len(b.contention[n]))]):
            _put(out, f"x{n} contention {what}", _rel(a.contention[n][i], b.contention[n][i]))
    if n in a.comm_overlap and n in b.comm_overlap:
        out[f"x{n} comm_overlap (abs)"] = b.comm_overlap[n] - a.comm_overlap[n]
    _link_diffs(n, a.links[n], b.links[n], out)
    ca, cb = a.collective_cpu.get(n, {}), b.collective_cpu.get(n, {})
    for kind in sorted(set(ca) & set(cb)):
        for i, what in enumerate(("per call", "per byte")):
            _put(out, f"x{n} collective_cpu {kind} {what}", _rel(ca[kind][i], cb[kind][i]))


# The Profile fields compared per process count (by `_per_count`), and the one compared as a whole.
_PER_COUNT_FIELDS = frozenset({"links", "contention", "comm_overlap", "collective_sync", "collective_cpu"})


def compare_profiles(a, b) -> dict[str, float]:
    """Relative difference ``b / a - 1`` of every quantity the two profiles (:class:`cost_model.calibrate.Profile`)
    price, keyed by name (module docstring: the keys, and the rules for zeros and absolute differences).

    Raises:
        TypeError: a field of Profile or DeviceSpec this module does not compare and does not list as unpriced.
    """
    fields = {f.name for f in dataclasses.fields(a)}
    unknown = fields - _PER_COUNT_FIELDS - set(PROFILE_NOT_COMPARED) - {"device"}
    if unknown:
        raise TypeError(f"compare_profiles: Profile fields {sorted(unknown)} have no comparison. Remedy: compare "
                        "them in cost_model.profile_compare or name them in PROFILE_NOT_COMPARED with why")
    out: dict[str, float] = {}
    _device_diffs(a.device, b.device, out)
    for n in sorted(set(a.links) & set(b.links)):
        _per_count(a, b, n, out)
    return out


def worst(diffs: Mapping[str, float]) -> str:
    """The key of the largest |difference| (inf first)."""
    return max(diffs, key=lambda k: abs(diffs[k]))


@dataclass(frozen=True, slots=True)
class StepPredictionDiff:
    """How far the predicted step seconds of the same plans differ between two profiles (module docstring).

    Attributes:
        differences: per plan name, ``b / a - 1`` of its predicted step seconds (dimensionless).
        median_abs: median of ``|differences|``.
        worst: the plan name of the largest ``|difference|``.
        within_10: how many plans differ by at most 10% (issue 13's stability bound).
    """

    differences: dict[str, float]
    median_abs: float
    worst: str
    within_10: int

    def line(self) -> str:
        """One line for ``calibrate --compare``-style output."""
        return (f"{len(self.differences)} plans' predicted step time: median |difference| {self.median_abs:.1%}, "
                f"worst {self.worst} {self.differences[self.worst]:+.1%}, within 10%: {self.within_10}")


def compare_step_predictions(a: Mapping[str, float], b: Mapping[str, float]) -> StepPredictionDiff:
    """Relative difference ``b[p] / a[p] - 1`` of each plan p's predicted step seconds under profile A (``a``) and
    profile B (``b``), with its median |difference|, worst plan and the count within 10%.

    Raises:
        ValueError: no plans, the two mappings name different plans (names both lists lack), or a step time
            that is not finite and > 0 (names the plan).
    """
    if not a or set(a) != set(b):
        raise ValueError(f"compare_step_predictions: need the same >= 1 plans under both profiles; only under A: "
                         f"{sorted(set(a) - set(b))}, only under B: {sorted(set(b) - set(a))}. Remedy: price the "
                         "same plans on both profiles")
    for side, got in (("A", a), ("B", b)):
        for name, t in got.items():
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise ValueError(f"compare_step_predictions: plan {name!r} has step seconds {t!r} under profile "
                                 f"{side}: need a finite time > 0")
    diffs = {name: b[name] / a[name] - 1 for name in sorted(a)}
    return StepPredictionDiff(diffs, statistics.median(abs(v) for v in diffs.values()), worst(diffs),
                              sum(abs(v) <= 0.1 for v in diffs.values()))
