"""Measure this machine and turn the measurements into a :class:`Profile` (a "cpu" DeviceSpec + Links).

What is measured (:mod:`cost_model.measure`: medians of repeated samples after warm-up, never the fastest
sample; compute with one intra-op thread, :func:`calibration_threads`, like one gloo rank). Robust to a shared
machine: the device quantities (matmul, memory, launch, AdamW) are measured in ``DEVICE_ROUNDS`` interleaved
rounds (each round samples every quantity once, after a warm-up round) and each takes the median over the
rounds, so a burst of outside load shifts one round of every quantity rather than every sample of one:

* matmul FLOP/s: fp32 ``torch.mm`` of n x n matrices for a few n; FLOPs = 2 n^3 (flop_counter's mm
  formula); the median rate over the sizes becomes ``peak_flops_per_s[float32]``.
* memory bandwidth: ``torch.add(a, b, out=c)`` on large fp32 tensors, bytes = 3 x tensor bytes (two
  reads, one write; the STREAM "add" kernel, McCalpin 1995).
* step efficiency: the forward + backward of a small reference transformer LM, measured and priced on the
  two rates above (:mod:`cost_model.step_efficiency`); priced / measured becomes the device's
  ``matmul_efficiency`` and ``memory_efficiency`` (0.78 on this machine: a step's ops run slower than the
  isolated kernels).
* launch overhead: ``torch.add`` on one-element tensors (the fixed cost of dispatching one op).
* host seconds per ATen node of a training step (round 21, :mod:`cost_model.host_cost`): the fx program's call,
  dispatch and autograd record beyond the launch, forward and backward (``DeviceSpec.op_host_s`` /
  ``op_host_bwd_s``); taken out of the measured reference step before its step efficiency. Round 22: a device round
  quantity (the slope, medians of runs), so spread over the passes and pooled like the others.
* optimizer: torch's AdamW step, as ``DeviceSpec.optimizer_bytes_per_s`` and ``optimizer_tensor_s``
  (:func:`cost_model.measure.measure_optimizer`, priced by :func:`cost_model.compute.optimizer_step_time_s`).
* contention: how much slower each of k processes computes when k run at once (matmul, memory and AdamW slowdown,
  :func:`cost_model.contention.measure_contention`), for k = 1 and every calibrated process count; the machine's
  core count is recorded with it. :meth:`Profile.cluster` prices an ``n``-rank mesh on the device slowed by
  the factors of ``n`` (``DeviceSpec.scaled``): on 2 cores, 4 ranks compute at about half speed each.
* collectives: every kind the plans use (all_reduce, all_gather, reduce_scatter, all_to_all, send_recv) over
  gloo with ``nprocs`` processes, message sizes 4 KiB-256 MiB (fewer repeats for large ones), and the
  fraction of an all-reduce that hides under compute (``DeviceSpec.comm_overlap`` of that process count),
  and the wait of a blocking collective that follows compute for the slowest rank (``sync_s``,
  :func:`cost_model.measure._measure_sync`; ``Profile.collective_sync``, priced as
  ``DeviceSpec.collective_sync_s`` on every collective).
* pipeline actions: the fixed host seconds torch's pipelining runtime spends per action (F, I, W, B, send,
  recv) and per step beyond the stage's compute, on 2 processes (:mod:`cost_model.pipeline_actions`;
  ``DeviceSpec.pipeline_action``, priced per action by ``parallelizer.planner.simulate``).

Fits per process count (one :class:`Link`; the fitting functions live in :mod:`cost_model.link_fit` since round 21,
re-exported here):

* ``Link.size_fits``: per measured kind, a piecewise alpha-beta fit through the medians (made
  non-decreasing in size first, by a suffix minimum: :func:`fit_size_segments`): between consecutive measured sizes s_i < s_{i+1} the segment is the line
  ``steps * alpha + factor * nbytes / beta`` through both points (the ring coefficients of
  :func:`cost_model.communication.alpha_beta_coefficients`, so :func:`cost_model.collective_time_s` prices it;
  alpha clamped at >= 0, then the line passes through the upper point); below s_0 the first segment, above the
  largest size the last segment extrapolates. So every measured median is reproduced and no size range is
  priced by a line fitted on another range.
* ``Link.per_kind`` (one alpha/beta per kind, least squares on relative error over all sizes) and the link's
  own joint alpha/beta stay as before: they price a kind without a size fit. A kind of
  :data:`REUSED_KIND_FITS` that is not measured borrows its mirror's fits (reduce_scatter <- all_gather).

Stability: :func:`compare_profiles` (:mod:`cost_model.profile_compare`, round 22) gives the relative difference of
every priced quantity between two profiles (``parallelizer calibrate --compare OLD.json`` prints it); on this 2-core machine shared with other
jobs two calibrations differ by more than on an idle one (benchmarks/RESULTS.md, step-time section). Each
calibration also predicts that difference from inside itself (round 19): ``measurements`` records, per device
quantity (``<key>_split_half``) and per collective kind and size (``collective_split_half``), the split-half
difference of its rounds (:func:`cost_model.rounds.split_half_difference`), and their median
(``split_half_median``, :func:`predicted_drift`); a second calibration of the same machine state differs by about
that / sqrt(2). The measuring processes pin glibc's malloc thresholds (:func:`cost_model.measure.pin_allocator`),
and the AdamW rate is the median over fresh processes (until round 19 one process's malloc state made it bimodal,
2.6x apart). These are new keys of ``measurements`` only: the format version stays 3 and older profiles load.
Round 20: two idle calibrations minutes apart moved whole blocks of measurements together (every x4 collective
+12..+34%, most x2 ones -5..-49%, the matmul rate +19%), more than each run's rounds predicted (6%): a machine state
lasting about one block. The collectives' rounds are therefore taken in ``COLLECTIVE_PASSES`` passes (3 x 7 rounds, fresh
processes each), one before each of the other measurements, and pooled (:func:`cost_model.rounds.pool_passes`);
``measurements`` records per kind and size the pass-half difference (odd against even passes,
``collective_pass_half``) and its median (``pass_half_median``), the prediction that sees such states.
Round 21: the quantities still measured in one block then moved most between the lead's idle pair (pipeline actions
-22..-29%, gloo's per-byte thread CPU -50%), so every measurement is now spread over the passes
(:mod:`cost_model.passes`: each pass measures the collectives, then its share of the device rounds, the pipeline
action steps and the contention windows), and a reference matmul timed before every block lets the calibration leave
out a pass run in another machine state, with a warning (``pass_reference_flops_per_s``, ``passes_dropped``,
``pass_steal``; the pass-half differences of the device, pipeline-action and contention quantities join
``pass_half_median``).

The profile JSON has sorted keys. Format version 3 adds ``size_fits`` to links, ``contention`` and
``comm_overlap`` per process count and the optimizer constants of the device; versions 1 and 2 still load
(without those: no slowdown, full overlap, the optimizer priced at memory bandwidth). The device's optional
``pipeline_action_s`` (round 16) holds the per-action costs; a profile without it gets
:data:`cost_model.pipeline_actions.CPU_PIPELINE_ACTION` (measured on this machine, documented there). Its
optional ``own_runner`` (round 17) holds the costs of the package's own BitPipe runner, measured when a
benchmark for it is registered (:func:`cost_model.pipeline_actions.register_own_runner_benchmark`; the
``parallelizer calibrate`` CLI registers it); without it BitPipe is priced at torch's costs. Its
``comm_thread_s`` (round 18: gloo's own threads' CPU per P2P op) is absent from profiles written before; they get
``CPU_PIPELINE_ACTION.comm_thread_s`` (measured on this machine, documented there).
``python -m cost_model.calibrate -o profile.json`` writes one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
from tqdm import tqdm

from cost_model.hardware import DeviceSpec, PipelineActionCost
from cost_model.link_fit import (_MIN_INV_BANDWIDTH, REUSED_KIND_FITS, _fit_alpha_beta,  # noqa: F401 (re-exported)
                                 fit_collective_cpu, fit_link, fit_size_segments)
from cost_model.device_rounds import (CALIBRATION_NUM_THREADS, DEFAULT_MATMUL_SIZES, DEVICE_ROUNDS,  # noqa: F401
                                      calibration_threads, measure_device, time_callable_s)
from cost_model.contention import contention_floor
from cost_model.measure import COLLECTIVE_REPEATS, LARGE_REPEATS, MEASURABLE_KINDS, measure_collectives  # noqa: F401
from cost_model.host_cost import with_op_host
from cost_model.passes import pool_all, run_passes
from cost_model.pipeline_actions import CPU_PIPELINE_ACTION
from cost_model.profile_compare import compare_profiles, worst
from cost_model.rounds import PASS_REFERENCE_TOLERANCE
from cost_model.step_efficiency import price_reference_s, step_efficiency
from cost_model.topology import Cluster, CoreSharing, Link

__all__ = ["Profile", "calibrate", "measure_device", "load_profile", "time_callable_s", "calibration_threads", "measure_collectives",
           "fit_link", "fit_size_segments", "fit_collective_cpu", "compare_profiles", "predicted_drift", "summary", "refit", "DEFAULT_MESSAGE_SIZES_BYTES", "QUICK_MESSAGE_SIZES_BYTES",
           "CALIBRATED_KINDS", "MEASURABLE_KINDS", "REUSED_KIND_FITS"]

PROFILE_FORMAT_VERSION = 3
_READABLE_FORMAT_VERSIONS = (1, 2, 3)  # 1: no per_kind overrides; 2: no size fits, contention, optimizer
# 4 KiB .. 256 MiB: the gradient buckets (25 MiB) and the gathered parameters/activations of the plans priced here.
DEFAULT_MESSAGE_SIZES_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28)
QUICK_MESSAGE_SIZES_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26)
CALIBRATED_KINDS = MEASURABLE_KINDS
PIPELINE_STEPS = 10  # timed steps of the pipeline action measurement (cost_model.pipeline_actions), over the passes
CONTENTION_ROUNDS = 9  # windows per contention kernel (cost_model.contention.measure_contention), over the passes
# Round 20 (r20b): the collectives' rounds are taken in this many passes (fresh processes each), separated by the
# calibration's other measurements, and pooled (:func:`cost_model.rounds.pool_passes`: why). 21 rounds = 3 x 7.
# Round 21 (r21c): every measurement is shared over these passes (cost_model.passes).
COLLECTIVE_PASSES = 3


@dataclass(frozen=True, slots=True)
class Profile:
    """A calibration result: the CPU as a device (one process alone), a fitted Link per process count
    (joint alpha/beta, per-kind overrides ``Link.per_kind``, piecewise ``Link.size_fits``), and per process
    count ``n``: ``contention[n] = (matmul, memory[, optimizer])`` slowdown of each of n concurrent processes,
    ``comm_overlap[n]`` (fraction of a collective that hides under compute) and ``collective_sync[n]`` (seconds
    a blocking collective after compute waits for the slowest rank); ``cpu_count``: the machine's cores;
    ``collective_cpu[n][kind] = (seconds per call, seconds per byte)``: the process CPU one of n ranks spends in
    one collective (:func:`fit_collective_cpu`; empty in profiles written before round 18). Recorded, not priced:
    pricing collectives on more ranks than cores by processor sharing of this CPU alone made the planner's pick
    worse (benchmarks/RESULTS.md, round 18 r18d)."""

    device: DeviceSpec
    links: Mapping[int, Link]
    contention: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    comm_overlap: Mapping[int, float] = field(default_factory=dict)
    cpu_count: int | None = None
    collective_sync: Mapping[int, float] = field(default_factory=dict)
    collective_cpu: Mapping[int, Mapping[str, tuple[float, float]]] = field(default_factory=dict)

    def device_for(self, nprocs: int) -> DeviceSpec:
        """The device as each of ``nprocs`` ranks sharing this machine sees it: FLOP/s and bytes/s divided by the
        measured slowdown of ``nprocs`` concurrent processes, ``comm_overlap`` and ``collective_sync_s`` of
        that count (unchanged where the profile did not measure them)."""
        device = self.device
        if nprocs in self.contention:
            device = device.scaled(*self.slowdown(nprocs))
        if nprocs in self.comm_overlap:
            device = dataclasses.replace(device, comm_overlap=self.comm_overlap[nprocs])
        if nprocs in self.collective_sync:
            device = dataclasses.replace(device, collective_sync_s=self.collective_sync[nprocs])
        return device

    def slowdown(self, nprocs: int) -> tuple[float, ...]:
        """``contention[nprocs]``, each factor at least :func:`cost_model.contention.contention_floor` (1, and
        ``nprocs / cpu_count`` with more processes than cores: profiles written before that clamp)."""
        floor = contention_floor(nprocs, self.cpu_count)
        return tuple(max(floor, f) for f in self.contention[nprocs])

    def cluster(self, nprocs: int) -> Cluster:
        """A Cluster of 1 node x ``nprocs`` devices (:meth:`device_for`: slowed by the contention of all
        ``nprocs`` processes, right when all compute at once) whose links are the fitted one, and, when the
        profile measured contention, its :class:`~cost_model.topology.CoreSharing`: the measured slowdown
        points (matmul and optimizer columns) and the matmul factor applied to the device, from which the
        pipeline search prices ranks that wait in their bubbles and leave the cores to the others
        (``planner.sharing``).

        Raises:
            ValueError: ``nprocs`` was not calibrated; lists the calibrated counts.
        """
        if nprocs not in self.links:
            raise ValueError(f"no link calibrated for nprocs={nprocs}; calibrated: {sorted(self.links)}. "
                             f"Remedy: calibrate that count too (`parallelizer calibrate -o PROFILE.json --nprocs "
                             f"{' '.join(str(n) for n in sorted({*self.links, nprocs}))}`, or "
                             f"calibrate(nprocs=({nprocs},)) in Python), or plan for {sorted(self.links)} devices")
        link = self.links[nprocs]
        sharing = None
        if self.contention:
            factors = {n: self.slowdown(n) for n in self.contention}
            sharing = CoreSharing(
                tuple((n, f[0]) for n, f in factors.items()),
                tuple((n, f[2]) for n, f in factors.items() if len(f) > 2),
                factors[nprocs][0] if nprocs in factors else 1.0,
                tuple((k, *ab) for k, ab in sorted(self.collective_cpu.get(nprocs, {}).items())),
                ranks_over_cores=self.cpu_count is not None and nprocs > self.cpu_count)
        return Cluster(self.device_for(nprocs), num_nodes=1, devices_per_node=nprocs, intra_node_link=link,
                       inter_node_link=link, sharing=sharing)


def _profile_to_json(profile: Profile, measurements: dict) -> dict:
    dev = profile.device
    return {
        "format_version": PROFILE_FORMAT_VERSION,
        "torch_version": torch.__version__,
        "num_threads": CALIBRATION_NUM_THREADS,
        "cpu_count": profile.cpu_count,
        "device": {
            "name": dev.name,
            "peak_flops_per_s": {str(k).removeprefix("torch."): v for k, v in dev.peak_flops_per_s.items()},
            "hbm_bytes": dev.hbm_bytes, "hbm_bytes_per_s": dev.hbm_bytes_per_s,
            "matmul_efficiency": dev.matmul_efficiency, "memory_efficiency": dev.memory_efficiency,
            "launch_overhead_s": dev.launch_overhead_s, "optimizer_bytes_per_s": dev.optimizer_bytes_per_s,
            "optimizer_tensor_s": dev.optimizer_tensor_s,
            "op_host_s": dev.op_host_s, "op_host_bwd_s": dev.op_host_bwd_s,
            "pipeline_action_s": _pipeline_action_to_json(dev.pipeline_action),
        },
        "links": {str(n): _link_to_json(link) for n, link in profile.links.items()},
        "contention": {str(n): dict(zip(("matmul", "memory", "optimizer"), f)) for n, f in profile.contention.items()},
        "comm_overlap": {str(n): v for n, v in profile.comm_overlap.items()},
        "collective_sync_s": {str(n): v for n, v in profile.collective_sync.items()},
        "collective_cpu": {str(n): {k: list(ab) for k, ab in fits.items()} for n, fits in profile.collective_cpu.items()},
        "measurements": measurements,
    }


def _link_to_json(link: Link) -> dict:
    out = {"name": link.name, "latency_s": link.latency_s, "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s}
    if link.per_kind:
        out["per_kind"] = {kind: {"latency_s": alpha, "bandwidth_bytes_per_s": beta}
                           for kind, (alpha, beta) in link.per_kind.items()}
    if link.size_fits:
        out["size_fits"] = {kind: [{"upper_nbytes": u, "latency_s": a, "bandwidth_bytes_per_s": b} for u, a, b in segs]
                            for kind, segs in link.size_fits.items()}
    return out


def _link_from_json(spec: dict) -> Link:
    per_kind = {kind: (v["latency_s"], v["bandwidth_bytes_per_s"]) for kind, v in spec.get("per_kind", {}).items()}
    size_fits = {kind: tuple((v["upper_nbytes"], v["latency_s"], v["bandwidth_bytes_per_s"]) for v in segs)
                 for kind, segs in spec.get("size_fits", {}).items()}
    return Link(name=spec["name"], latency_s=spec["latency_s"], bandwidth_bytes_per_s=spec["bandwidth_bytes_per_s"],
                per_kind=per_kind, size_fits=size_fits)


def _pipeline_action_to_json(cost: PipelineActionCost) -> dict:
    """``pipeline_action_s``: the seconds fields, and ``own_runner`` (the same, nested) when measured."""
    out: dict = {name: getattr(cost, name) for name in PipelineActionCost.seconds_fields()}
    if cost.own_runner is not None:
        out["own_runner"] = _pipeline_action_to_json(cost.own_runner)
    return out


def _pipeline_action_from_json(spec: dict | None, nested: bool = False) -> PipelineActionCost:
    """The device's per-action pipeline costs (``pipeline_action_s``), or, for a profile written before round
    16, :data:`CPU_PIPELINE_ACTION`; ``own_runner`` (round 17) is optional (absent: None, own-runner schedules
    priced at torch's costs). An unknown key raises KeyError (load_profile says to re-run calibration)."""
    if spec is None:
        return CPU_PIPELINE_ACTION
    known = {*PipelineActionCost.seconds_fields(), "own_runner"}
    if set(spec) - known:
        raise KeyError(f"pipeline_action_s has unknown keys {sorted(set(spec) - known)}; known {sorted(known)}")
    own = spec.get("own_runner")
    fields = {k: float(v) for k, v in spec.items() if k != "own_runner"}
    if not nested:  # written before round 18: gloo's threads at the documented figure (the top level's only)
        fields.setdefault("comm_thread_s", CPU_PIPELINE_ACTION.comm_thread_s)
        for name in ("comm_thread_per_byte_s", "split_backward_per_node_s"):  # written before round 19
            fields.setdefault(name, getattr(CPU_PIPELINE_ACTION, name))
        fields.setdefault("first_touch_per_byte_s", CPU_PIPELINE_ACTION.first_touch_per_byte_s)  # before round 23
        fields.setdefault("split_backward_per_byte_s", CPU_PIPELINE_ACTION.split_backward_per_byte_s)  # before round 26
    return PipelineActionCost(**fields, own_runner=None if own is None else _pipeline_action_from_json(own, True))


def load_profile(path: str | os.PathLike) -> Profile:
    """Read a profile JSON written by :func:`calibrate` (format version 3, or 1/2 without the newer fields).

    Raises:
        ValueError: wrong format version or missing keys; says to re-run calibration.
    """
    with open(path) as f:
        data = json.load(f)
    try:
        if data["format_version"] not in _READABLE_FORMAT_VERSIONS:
            raise KeyError("format_version")
        dev = data["device"]
        device = DeviceSpec(
            name=dev["name"],
            peak_flops_per_s={getattr(torch, k): v for k, v in dev["peak_flops_per_s"].items()},
            hbm_bytes=dev["hbm_bytes"], hbm_bytes_per_s=dev["hbm_bytes_per_s"],
            matmul_efficiency=dev["matmul_efficiency"], memory_efficiency=dev["memory_efficiency"],
            launch_overhead_s=dev["launch_overhead_s"], kind="cpu",  # calibrate measures this machine's CPU
            optimizer_bytes_per_s=dev.get("optimizer_bytes_per_s"), optimizer_tensor_s=dev.get("optimizer_tensor_s", 0.0),
            op_host_s=dev.get("op_host_s", 0.0), op_host_bwd_s=dev.get("op_host_bwd_s", 0.0),  # older: none
            pipeline_action=_pipeline_action_from_json(dev.get("pipeline_action_s")))
        links = {int(n): _link_from_json(spec) for n, spec in data["links"].items()}
        contention = {int(n): (v["matmul"], v["memory"]) + ((v["optimizer"],) if "optimizer" in v else ())
                      for n, v in data.get("contention", {}).items()}
        overlap = {int(n): float(v) for n, v in data.get("comm_overlap", {}).items()}
        sync = {int(n): float(v) for n, v in data.get("collective_sync_s", {}).items()}
        cpu = {int(n): {k: (float(a), float(b)) for k, (a, b) in fits.items()}
               for n, fits in data.get("collective_cpu", {}).items()}
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{path}: not a version-{'/'.join(map(str, _READABLE_FORMAT_VERSIONS))} profile ({exc}); "
                         "re-run `python -m cost_model.calibrate -o PATH`") from exc
    return Profile(device=device, links=links, contention=contention, comm_overlap=overlap,
                   cpu_count=data.get("cpu_count"), collective_sync=sync, collective_cpu=cpu)


def calibrate(nprocs: Sequence[int] = (2, 4), out_path: str | os.PathLike | None = None, progress: bool = True,
              message_sizes_bytes: Sequence[int] = DEFAULT_MESSAGE_SIZES_BYTES,
              matmul_sizes: Sequence[int] = DEFAULT_MATMUL_SIZES, memory_numel: int = 1 << 24,
              repeats: int = COLLECTIVE_REPEATS, kinds: Sequence[str] = CALIBRATED_KINDS, per_kind: bool = True,
              contention: bool = True, device_rounds: int = DEVICE_ROUNDS, pipeline_actions: bool = True,
              collective_passes: int = COLLECTIVE_PASSES, pipeline_steps: int = PIPELINE_STEPS,
              contention_rounds: int = CONTENTION_ROUNDS, pass_tolerance: float = PASS_REFERENCE_TOLERANCE) -> Profile:
    """Measure this machine (module docstring) and return a :class:`Profile`; write JSON if ``out_path``.

    Takes ~3-4 minutes with the defaults on a 2-core machine (the 64-256 MiB collectives and process start-up
    dominate); ``message_sizes_bytes=QUICK_MESSAGE_SIZES_BYTES`` less.

    Args:
        nprocs: gloo process counts to calibrate (each >= 2).
        repeats: samples (rounds) per collective below 64 MiB (fewer above: :func:`cost_model.measure.repeats_for`).
        kinds: collectives to measure (subset of :data:`MEASURABLE_KINDS`, >= 1).
        per_kind: fit per-kind ``Link.per_kind`` overrides and piecewise ``Link.size_fits`` (module docstring);
            ``False`` gives the joint fit only (the behaviour of format version 1).
        contention: measure the compute slowdown of ``nprocs`` concurrent processes (``Profile.contention``).
        device_rounds: interleaved rounds of the device measurements, shared over the passes.
        pipeline_actions: measure the per-action pipeline costs (:mod:`cost_model.pipeline_actions`, ~20-40 s);
            ``False`` records :data:`CPU_PIPELINE_ACTION` instead.
        collective_passes: passes over every measurement (:mod:`cost_model.passes`; the name is round 20's, when only
            the collectives were spread): each takes ``ceil(repeats / passes)`` rounds of every collective
            (``ceil(LARGE_REPEATS / passes)`` at 64 MiB and above) in fresh processes, then its share of
            ``device_rounds``, ``pipeline_steps`` and ``contention_rounds``; comm_overlap and sync are measured in the
            last pass; pooled by :func:`cost_model.passes.pool_all`.
        pipeline_steps: timed steps of the pipeline action measurement, shared over the passes.
        contention_rounds: windows of each contention kernel, shared over the passes.
        pass_tolerance: how far a pass's reference matmul may be off the median pass's before the pass is left out
            (:func:`cost_model.rounds.deviating_passes`).

    Raises:
        ValueError: ``nprocs`` entries < 2, or ``kinds`` empty or unmeasurable, or ``collective_passes`` outside
            1..``repeats``.
        RuntimeError: a measuring process failed (see :func:`cost_model.measure.measure_collectives`).
    """
    if any(not isinstance(n, int) or n < 2 for n in nprocs):
        raise ValueError(f"nprocs={tuple(nprocs)}: each process count must be an int >= 2")
    kinds = tuple(kinds)
    if not kinds or any(k not in MEASURABLE_KINDS for k in kinds):
        raise ValueError(f"kinds={kinds}: measure >= 1 of {MEASURABLE_KINDS}")
    if not isinstance(collective_passes, int) or not 1 <= collective_passes <= repeats:
        raise ValueError(f"collective_passes={collective_passes}: need an int from 1 to repeats={repeats} (each pass "
                         "takes >= 1 round of every collective)")
    if device_rounds < 1:
        raise ValueError(f"device_rounds={device_rounds}: need >= 1 round")
    bar = tqdm(total=collective_passes, desc="calibrate", disable=not progress)
    measurements: dict = {"collectives": {}}
    started = time.perf_counter()

    with calibration_threads():
        records = run_passes(nprocs, kinds, message_sizes_bytes, passes=collective_passes,
                             rounds_per_pass=-(-repeats // collective_passes),
                             large_per_pass=-(-LARGE_REPEATS // collective_passes), device_rounds=device_rounds,
                             matmul_sizes=matmul_sizes, memory_numel=memory_numel, pipeline_steps=pipeline_steps,
                             pipeline_actions=pipeline_actions, own_runner=True, contention_rounds=contention_rounds,
                             contention=contention, step=bar.set_postfix_str)
        bar.update(collective_passes)
        pooled = pool_all(records, nprocs, pass_tolerance)
        dev = {**pooled["device"]["median"], **{f"{k}_split_half": h for k, h in pooled["device"]["split_half"].items()}}
        rates = DeviceSpec(name="cpu", peak_flops_per_s={torch.float32: dev["matmul_flops_per_s"]},
                           hbm_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                           hbm_bytes_per_s=dev["memory_bytes_per_s"], matmul_efficiency=1.0, memory_efficiency=1.0,
                           launch_overhead_s=dev["launch_overhead_s"], kind="cpu",
                           optimizer_bytes_per_s=dev["optimizer_bytes_per_s"],
                           optimizer_tensor_s=dev["optimizer_tensor_s"])
        dev["reference_priced_s"] = price_reference_s(rates)
        rates = with_op_host(rates, dev)  # round 21: host seconds per node, out of the step efficiency (host_cost)
        dev["step_efficiency"] = step_efficiency(dev["reference_priced_s"],
                                                 [dev["reference_step_s"] - dev["reference_host_s"]])
    bar.close()
    measurements.update(dev)
    action = CPU_PIPELINE_ACTION
    if pooled["pipeline"] is not None:
        action = pooled["pipeline"][0] if pooled["own_runner"] is None else dataclasses.replace(
            pooled["pipeline"][0], own_runner=pooled["own_runner"])
    device = dataclasses.replace(rates, matmul_efficiency=dev["step_efficiency"],
                                 memory_efficiency=dev["step_efficiency"], pipeline_action=action)
    links, overlap, sync, cpu = {}, {}, {}, {}
    for n in nprocs:
        got = pooled["collectives"][n]
        timings, overlap[n], sync[n] = got["collectives"], got["comm_overlap"], got["sync_s"]
        measurements.setdefault("sync_exit_spread_s", {})[str(n)] = got.get("sync_exit_spread_s")  # round 23: recorded
        cpu[n] = {kind: fit_collective_cpu(by_size) for kind, by_size in got["collective_cpu"].items() if by_size}
        measurements.setdefault("collective_cpu", {})[str(n)] = {
            k: {str(b): c for b, c in v.items()} for k, v in got["collective_cpu"].items()}
        measurements["collectives"][str(n)] = {k: {str(b): s for b, s in v.items()} for k, v in timings.items()}
        measurements.setdefault("collective_split_half", {})[str(n)] = {
            k: {str(b): h for b, h in v.items()} for k, v in got["split_half"].items()}
        measurements.setdefault("collective_pass_half", {})[str(n)] = {
            k: {str(b): h for b, h in v.items()} for k, v in got["pass_half"].items()}
        samples = [(kind, n, nbytes, s) for kind, by_size in timings.items() for nbytes, s in by_size.items()]
        links[n] = fit_link(samples, name=f"gloo_x{n}", per_kind=per_kind, size_fits=per_kind)
    if per_kind:  # say which fits are copies of another kind's rather than measured
        measurements["per_kind_reused"] = {k: m for k, m in REUSED_KIND_FITS.items() if k not in kinds and m in kinds}
    measurements["split_half_median"] = predicted_drift(measurements)
    measurements["collective_passes"] = collective_passes
    measurements["device_pass_half"] = pooled["device"]["pass_half"]
    measurements["pipeline_action_pass_half"] = pooled["pipeline"][1] if pooled["pipeline"] else {}
    # round 24: each pipeline sample kind's split-half over its pooled rounds (e.g. "split node"); recorded for the
    # reader, not in `predicted_drift` (its key does not end in "_split_half")
    measurements["split_half_pipeline_action"] = pooled["pipeline"][2] if pooled["pipeline"] else {}
    measurements["contention_pass_half"] = pooled["contention_pass_half"]
    measurements["pass_reference_flops_per_s"] = pooled["references"]
    measurements["pass_steal"] = pooled["steal"]
    measurements["passes_dropped"] = [i + 1 for i in pooled["dropped"]]
    measurements["pass_half_median"] = predicted_pass_drift(measurements) if collective_passes > 1 else None
    measurements["seconds"] = time.perf_counter() - started
    measurements["load_average"] = os.getloadavg()  # 1/5/15-minute load: how busy the machine was
    profile = Profile(device=device, links=links, contention=pooled["contention"], comm_overlap=overlap,
                      cpu_count=os.cpu_count(), collective_sync=sync, collective_cpu=cpu)
    if out_path is not None:
        with open(out_path, "w") as f:
            json.dump(_profile_to_json(profile, measurements), f, indent=2, sort_keys=True)
            f.write("\n")
    return profile


def predicted_pass_drift(measurements: Mapping) -> float | None:
    """The median pass-half difference (:func:`cost_model.rounds.pass_half_difference`) over every quantity measured
    in passes (``collective_pass_half``; since round 21 also ``device_pass_half``, ``pipeline_action_pass_half``,
    ``contention_pass_half``): what a second calibration is predicted to differ by, times sqrt(2), when the machine's
    state lasts about a pass. None when the profile records none."""
    values = [float(h) for by_kind in measurements.get("collective_pass_half", {}).values()
              for by_size in by_kind.values() for h in by_size.values()]
    for key in ("device_pass_half", "pipeline_action_pass_half", "contention_pass_half"):
        values += [float(h) for h in measurements.get(key, {}).values() if h is not None]  # None: one pass measured it
    return statistics.median(values) if values else None


def predicted_drift(measurements: Mapping) -> float | None:
    """The median over every quantity that records one of its :func:`cost_model.rounds.split_half_difference`
    (the device's ``*_split_half`` keys, ``collective_split_half``) in a profile's ``measurements``: the median
    |difference| a second calibration of the same machine state is predicted to show, times sqrt(2) (round 19;
    None in profiles written before it)."""
    values = [float(v) for k, v in measurements.items() if k.endswith("_split_half") and k != "collective_split_half"]
    values += [float(h) for by_kind in measurements.get("collective_split_half", {}).values()
               for by_size in by_kind.values() for h in by_size.values()]
    return statistics.median(values) if values else None


def refit(path: str | os.PathLike, out_path: str | os.PathLike | None = None) -> Profile:
    """The profile at ``path`` with its links fitted again from the collective medians it recorded (after a
    change of the fitting rules: no new measurement); written to ``out_path`` if given.

    Raises:
        ValueError: the profile records no collective measurements (re-run calibration).
    """
    profile = load_profile(path)
    with open(path) as f:
        data = json.load(f)
    measured = data.get("measurements", {}).get("collectives")
    if not measured:
        raise ValueError(f"{path}: records no collective measurements to refit; re-run `python -m cost_model.calibrate`")
    links = {}
    for n, by_kind in measured.items():
        samples = [(kind, int(n), int(b), t) for kind, by_size in by_kind.items() for b, t in by_size.items()]
        links[int(n)] = fit_link(samples, name=f"gloo_x{n}", per_kind=True, size_fits=True)
    profile = dataclasses.replace(profile, links=links)
    if out_path is not None:
        with open(out_path, "w") as f:
            json.dump(_profile_to_json(profile, data["measurements"]), f, indent=2, sort_keys=True)
            f.write("\n")
    return profile


def _own_runner_summary(cost: PipelineActionCost) -> str:
    own = cost.own_runner
    if own is None:
        return "; own runner (bitpipe) not measured: priced at torch's costs (`parallelizer calibrate` measures it)"
    return ("; own runner (bitpipe) F/B " + "/".join(f"{x * 1e6:.0f}" for x in (own.forward_s, own.backward_s))
            + f" us, send/recv {own.send_s * 1e6:.0f}/{own.recv_s * 1e6:.0f} us, step set-up {own.step_s * 1e3:.1f} ms")


def summary(profile: Profile, kinds: Sequence[str] | None = None) -> str:
    """One line per calibrated process count: compute, contention, overlap and each kind's fit (a kind of
    :data:`REUSED_KIND_FITS` outside the measured ``kinds``, default :data:`CALIBRATED_KINDS`, is named as
    borrowed, not printed as measured)."""
    kinds = CALIBRATED_KINDS if kinds is None else kinds
    dev = profile.device
    reused = {k: m for k, m in REUSED_KIND_FITS.items() if k not in kinds}
    lines = [f"cpu ({profile.cpu_count} cores): {dev.peak_flops_per_s[torch.float32] / 1e9:.1f} GFLOP/s fp32, "
             f"{dev.hbm_bytes_per_s / 1e9:.1f} GB/s, AdamW {(dev.optimizer_bytes_per_s or 0) / 1e9:.2f} GB/s + "
             f"{dev.optimizer_tensor_s * 1e6:.0f} us/tensor, step efficiency {dev.matmul_efficiency:.2f}, host "
             f"{dev.op_host_s * 1e6:.1f}/{dev.op_host_bwd_s * 1e6:.1f} us per node fwd/bwd, pipeline "
             "actions F/I/W/B " + "/".join(f"{x * 1e6:.0f}" for x in dev.pipeline_action.compute_s())
             + f" us, send/recv {dev.pipeline_action.send_s * 1e6:.0f}/{dev.pipeline_action.recv_s * 1e6:.0f} us, "
             f"step set-up {dev.pipeline_action.step_s * 1e3:.1f} ms, gloo threads "
             f"{dev.pipeline_action.comm_thread_s * 1e6:.0f} us per P2P op + "
             f"{dev.pipeline_action.comm_thread_per_byte_s * 1e9:.2f} ns per byte, split backward "
             f"{dev.pipeline_action.split_backward_per_node_s * 1e6:.0f} us per autograd node + "
             f"{dev.pipeline_action.split_backward_per_byte_s * 1e9:.2f} ns per weight-gradient byte"
             + _own_runner_summary(dev.pipeline_action)]

    def fit(kind: str, alpha_s: float, beta: float) -> str:
        if kind in reused:
            return f"; {kind} = {reused[kind]}'s fit (reused, not measured)"
        return f"; {kind} alpha={alpha_s * 1e6:.1f} us beta={beta / 1e9:.2f} GB/s"
    for n, link in profile.links.items():
        slow = profile.contention.get(n)
        lines.append(f"x{n}: alpha={link.latency_s * 1e6:.1f} us beta={link.bandwidth_bytes_per_s / 1e9:.2f} GB/s"
                     + (f", compute slowdown x{slow[0]:.2f} (memory x{slow[1]:.2f}"
                        + (f", AdamW x{slow[2]:.2f}" if len(slow) > 2 else "") + ")" if slow else "")
                     + (f", comm overlap {profile.comm_overlap[n]:.2f}" if n in profile.comm_overlap else "")
                     + (f", collective sync {profile.collective_sync[n] * 1e6:.0f} us" if n in profile.collective_sync
                        else "")
                     + "".join(fit(k, a, b) for k, (a, b) in link.per_kind.items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m cost_model.calibrate -o profile.json [--nprocs 2 4] [--quick] [--compare OLD.json]``."""
    parser = argparse.ArgumentParser(description="Calibrate the cost model on this machine.")
    parser.add_argument("-o", "--out", required=True, help="profile JSON to write")
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4], help="gloo process counts (default: 2 4)")
    parser.add_argument("--quick", action="store_true", help="messages up to 64 MiB instead of 256 MiB")
    parser.add_argument("--compare", help="an earlier profile JSON: print the relative differences to it")
    args = parser.parse_args(argv)
    sizes = QUICK_MESSAGE_SIZES_BYTES if args.quick else DEFAULT_MESSAGE_SIZES_BYTES
    profile = calibrate(nprocs=tuple(args.nprocs), out_path=args.out, message_sizes_bytes=sizes)
    print(f"wrote {args.out}\n" + summary(profile))
    if args.compare:
        diffs = compare_profiles(load_profile(args.compare), profile)
        top = worst(diffs)
        print(f"vs {args.compare}: median |difference| {statistics.median(abs(v) for v in diffs.values()):.1%} over "
              f"{len(diffs)} quantities, largest {top} {diffs[top]:+.1%}; " + ", ".join(f"{k} {v:+.1%}" for k, v in diffs.items()))


if __name__ == "__main__":
    main()
