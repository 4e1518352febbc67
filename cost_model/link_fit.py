"""Fits of measured collective times and CPU (split from :mod:`cost_model.calibrate`, round 21; no behaviour change).

From ``(kind, num_ranks, nbytes, seconds)`` samples: the joint and per-kind alpha-beta fits of a :class:`Link`
(:func:`fit_link`, relative least squares through the ring coefficients of
:func:`cost_model.communication.alpha_beta_coefficients`), its piecewise size fits (:func:`fit_size_segments`, one
segment per pair of consecutive measured sizes through their medians made non-decreasing in size), and the per-call /
per-byte fit of a collective's process CPU (:func:`fit_collective_cpu`). Pure functions of the samples; the
measuring is :mod:`cost_model.measure`, the profile :mod:`cost_model.calibrate` (which re-exports these names).
"""
from __future__ import annotations

import math
import statistics
import warnings
from typing import Mapping, Sequence

import numpy as np

from cost_model.communication import alpha_beta_coefficients
from cost_model.topology import Link

__all__ = ["fit_link", "fit_size_segments", "fit_collective_cpu", "REUSED_KIND_FITS"]

# A kind that is not measured borrows the fits of its mirror (same ring steps and bytes factor).
REUSED_KIND_FITS = {"reduce_scatter": "all_gather"}


def _fit_alpha_beta(samples: Sequence[tuple[str, int, float, float]], what: str) -> tuple[float, float]:
    """``(alpha_s, beta_bytes_per_s)`` minimising relative error of ``steps*alpha + factor*nbytes/beta``."""
    rows = np.array([[alpha_beta_coefficients(kind, n)[0], alpha_beta_coefficients(kind, n)[1] * nbytes]
                     for kind, n, nbytes, _ in samples], dtype=float)
    seconds = np.array([s for *_, s in samples], dtype=float)
    weighted = rows / seconds[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(weighted, np.ones(len(samples)), rcond=None)
    if alpha < 0:  # refit bandwidth only
        alpha = 0.0
        inv_beta = float(np.linalg.lstsq(weighted[:, 1:], np.ones(len(samples)), rcond=None)[0][0])
    if inv_beta <= 0:
        raise ValueError(f"{what}: fitted a non-positive inverse bandwidth {inv_beta}: measurements are too "
                         "noisy; use larger message sizes or more repeats")
    return float(alpha), float(1 / inv_beta)


def fit_link(samples: Sequence[tuple[str, int, float, float]], name: str = "fitted", per_kind: bool = False,
             size_fits: bool = False) -> Link:
    """Least-squares alpha/beta from ``(kind, num_ranks, nbytes, seconds)`` samples (ring coefficients).

    The samples are first reduced to one median per (kind, process count, size), made non-decreasing in size
    per kind by a suffix minimum, as `fit_size_segments` does (on a shared machine noise only slows a sample
    down: under load 8-15 the raw repeats of 64 KiB - 4 MiB messages once fitted a negative inverse bandwidth).
    Minimises relative error, so small and large messages weigh alike; alpha is clamped at >= 0.
    The link's own alpha/beta are the joint fit over all samples.

    Args:
        per_kind: also fit each kind separately (same coefficients, so in the factor space
            :func:`cost_model.collective_time_s` prices it) and store the fits as ``Link.per_kind``
            overrides; a kind of :data:`REUSED_KIND_FITS` that was not measured (reduce_scatter) gets a copy
            of its mirror's fit (all_gather). A kind needs samples at >= 2 message sizes.
        size_fits: also fit each kind piecewise (:func:`fit_size_segments`, one process count per kind) into
            ``Link.size_fits``; an unmeasured kind of :data:`REUSED_KIND_FITS` borrows its mirror's segments.

    Raises:
        ValueError: fewer than 2 samples (per kind with ``per_kind``), or the joint fit gives no positive
            bandwidth (a per-kind fit that does is dropped with a warning: the joint fit prices that kind).
    """
    if len(samples) < 2:
        raise ValueError(f"fit_link needs >= 2 samples, got {len(samples)}; measure more message sizes")
    samples = _non_decreasing_medians(samples)
    alpha, beta = _fit_alpha_beta(samples, f"link {name!r}")
    overrides: dict[str, tuple[float, float]] = {}
    if per_kind:
        kinds = sorted({kind for kind, *_ in samples})
        for kind in kinds:
            kind_samples = [s for s in samples if s[0] == kind]
            if len({(n, nbytes) for _, n, nbytes, _ in kind_samples}) < 2:
                raise ValueError(f"fit_link(per_kind=True): kind {kind!r} has samples at "
                                 f"{len(kind_samples)} size(s); measure >= 2 message sizes per kind")
            try:
                overrides[kind] = _fit_alpha_beta(kind_samples, f"link {name!r} kind {kind!r}")
            except ValueError as err:  # too noisy for a fit of its own: the joint fit prices this kind
                warnings.warn(f"{err}; kind {kind!r} is priced with the joint fit of link {name!r}", stacklevel=2)
        for kind, mirror in REUSED_KIND_FITS.items():
            if kind not in overrides and mirror in overrides:
                overrides[kind] = overrides[mirror]
    segments: dict[str, tuple[tuple[float, float, float], ...]] = {}
    if size_fits:
        for kind in sorted({kind for kind, *_ in samples}):
            segments[kind] = fit_size_segments([(n, b, t) for k, n, b, t in samples if k == kind], kind)
        for kind, mirror in REUSED_KIND_FITS.items():
            if kind not in segments and mirror in segments:
                segments[kind] = segments[mirror]
    return Link(name=name, latency_s=alpha, bandwidth_bytes_per_s=beta, per_kind=overrides, size_fits=segments)


_MIN_INV_BANDWIDTH = 1e-15  # s/B: a flat segment (same median at two sizes) prices its bytes at 1 PB/s


def fit_size_segments(samples: Sequence[tuple[int, int, float]], kind: str) -> tuple[tuple[float, float, float], ...]:
    """Piecewise alpha-beta segments ``(upper_nbytes, latency_s, bandwidth_bytes_per_s)`` of one kind (module
    docstring) from ``(num_ranks, nbytes, seconds)`` samples at >= 2 sizes, one process count.

    Medians are first made non-decreasing in size by a suffix minimum (``t_i = min_{j >= i} t_j``: a smaller
    message never costs more than a larger one; on a shared machine noise only slows a sample down, so an
    inversion is taken as noise on the smaller size), then
    each pair of consecutive sizes s_i < s_{i+1} gives the line ``steps * alpha + factor * nbytes / beta``
    through both (``alpha_beta_coefficients(kind, num_ranks)``); alpha < 0 is clamped to 0 and the slope
    refitted through the upper point. Segment i covers sizes up to s_{i+1}.

    Raises:
        ValueError: fewer than 2 distinct sizes, several process counts, or a non-positive time.
    """
    ranks = {n for n, _, _ in samples}
    by_size: dict[int, list[float]] = {}
    for _, nbytes, seconds in samples:
        by_size.setdefault(nbytes, []).append(seconds)
    if len(ranks) != 1 or len(by_size) < 2 or any(t <= 0 for _, _, t in samples):
        raise ValueError(f"fit_size_segments({kind!r}): needs samples of one process count (got {sorted(ranks)}) at "
                         f">= 2 message sizes (got {sorted(by_size)}) with positive times; measure more sizes")
    steps, factor = alpha_beta_coefficients(kind, ranks.pop())
    sizes, times = _suffix_min_medians(by_size)
    segments = []
    for (s0, t0), (s1, t1) in zip(zip(sizes, times), zip(sizes[1:], times[1:])):
        inv_beta = max((t1 - t0) / (factor * (s1 - s0)), _MIN_INV_BANDWIDTH)
        alpha = (t0 - factor * s0 * inv_beta) / steps
        if alpha < 0:
            alpha, inv_beta = 0.0, t1 / (factor * s1)
        segments.append((float(s1), float(alpha), float(1 / inv_beta)))
    return tuple(segments)


def _suffix_min_medians(by_size: Mapping[int, Sequence[float]]) -> tuple[list[int], list[float]]:
    """(sizes ascending, their median seconds made non-decreasing: t_i = min over sizes >= s_i)."""
    sizes = sorted(by_size)
    medians = [statistics.median(by_size[b]) for b in sizes]
    return sizes, [float(t) for t in np.minimum.accumulate(medians[::-1])[::-1]]


def _non_decreasing_medians(samples: Sequence[tuple[str, int, float, float]]) -> list[tuple[str, int, float, float]]:
    """``(kind, num_ranks, nbytes, seconds)`` samples reduced to one median per (kind, num_ranks, nbytes), made
    non-decreasing in nbytes per (kind, num_ranks) (`_suffix_min_medians`)."""
    groups: dict[tuple[str, int], dict[int, list[float]]] = {}
    for kind, n, nbytes, seconds in samples:
        groups.setdefault((kind, n), {}).setdefault(nbytes, []).append(seconds)
    out = []
    for (kind, n), by_size in sorted(groups.items()):
        out += [(kind, n, b, t) for b, t in zip(*_suffix_min_medians(by_size))]
    return out


def fit_collective_cpu(cpu_by_size: Mapping[int, float]) -> tuple[float, float]:
    """``(seconds per call, seconds per byte)`` of one collective kind's process CPU per call from its medians
    by message size (bytes, nccl-tests convention -> CPU seconds): least squares of ``cpu = a + b * nbytes``,
    each size weighted by 1 / cpu^2 (relative error, so the 4 KiB calls are not drowned by the 64 MiB ones), both
    clamped at >= 0. One size: ``(cpu, 0)``.

    Raises:
        ValueError: no sizes, or a negative / non-finite CPU time.
    """
    pts = sorted(cpu_by_size.items())
    if not pts or any(not (math.isfinite(c) and c >= 0) for _, c in pts):
        raise ValueError(f"fit_collective_cpu: need >= 1 size with CPU seconds >= 0, got {dict(pts)}")
    if len(pts) == 1:
        return float(pts[0][1]), 0.0
    w = [1.0 / max(c, 1e-9) ** 2 for _, c in pts]
    sw = sum(w)
    mx = sum(wi * n for wi, (n, _) in zip(w, pts)) / sw
    my = sum(wi * c for wi, (_, c) in zip(w, pts)) / sw
    var = sum(wi * (n - mx) ** 2 for wi, (n, _) in zip(w, pts))
    b = max(0.0, sum(wi * (n - mx) * (c - my) for wi, (n, c) in zip(w, pts)) / var) if var else 0.0
    return max(0.0, my - b * mx), b


