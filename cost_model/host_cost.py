"""Calibration of the host seconds per ATen node of a training step on a CPU (round 21, issue 13/14).

What it measures: the program the rewriter emits runs each ATen node as a Python call of an ``OpOverload`` in a
torch.fx GraphModule, under autograd; backward runs one autograd node per differentiable ATen node. On one
CPU thread that host work (the call, the dispatcher, the autograd record in forward; the engine's walk and
the node's bookkeeping in backward) comes on top of the kernel: measured in round 20 (benchmarks/RESULTS.md,
r20e) at ~24 us per node of a width-64 GPT-2 against ~2 us priced (``launch_overhead_s``, a bare
``torch.add`` on 1-element tensors from Python).

How: :func:`cost_model.step_efficiency.reference_model` at a tiny shape (:data:`TINY_SHAPE`: width 8,
sequence 4, so every kernel is ~0) with ``TINY_LAYERS`` = (1, 9) blocks, each exported with torch.export and
run through its GraphModule (``ExportedProgram.module()``), forward and ``backward()``, one thread, thread CPU
time (``time.thread_time``: other processes on the cores do not count). The per-node figure is the slope
between the two layer counts (fixed per-call costs cancel) of the measured seconds LESS the seconds already
priced (the roofline and ``launch_overhead_s`` of each node on ``device``, :func:`cost_model.compute.op_cost`
with no host term), per forward node (every ATen node of the graph, views included) and per backward node
(those with a floating-point input and output: :func:`cost_model.compute.op_host_seconds`' rule)::

    op_host_s     = (median fwd(9) - median fwd(1)) / (nodes(9) - nodes(1)) - (priced_fwd(9) - priced_fwd(1)) / (same)
    op_host_bwd_s = the same over backward seconds and backward nodes

Round 22 (r22g): the measured slope (:func:`measure_host_slope_s`: per round the MEDIAN of ``HOST_RUNS``
interleaved runs of each program, not the fastest of 5) is a device round quantity
(:func:`cost_model.device_rounds.measure_device_rounds`), so the calibration's passes spread its rounds over the
whole calibration and pool them by their median, leaving out a pass run in another machine state, like the other
device quantities (:mod:`cost_model.passes`); the priced slope is taken off after pooling (:func:`op_host_from_slopes`;
a median commutes with subtracting a constant). Until round 21 it was measured in one block of 7 rounds at the end of
the calibration, each round the difference of two fastest-of-5 runs of 1 and 5 blocks (108 forward nodes apart,
about 1 ms of CPU): the lead's idle pair read 7.3 and 15.6 us forward (2.1x); on this machine under load 17
(2026-12-04 11:45 UTC, one process) that estimator's rounds spread 5.8-17.3 us and five of its 7-round blocks
8.5-13.2 us, against 9.1-11.6 us for the medians of 35 runs of 1 and 9 blocks (216 nodes apart) and a third less
round-to-round spread in backward.

:func:`reference_host_s` is the host part of the reference step at its calibration shape, which
``cost_model.calibrate`` takes out of the measured step before it computes the step efficiency (that factor
scales kernel rates; the host is priced apart).
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from cost_model._fx import node_values, op_nodes
from cost_model.compute import _has_backward, op_cost, op_host_seconds
from cost_model.hardware import DeviceSpec
from cost_model.step_efficiency import REFERENCE_SHAPE, reference_model

__all__ = ["TINY_SHAPE", "TINY_LAYERS", "HOST_RUNS", "HostPrograms", "program_nodes", "measure_host_slope_s",
           "op_host_from_slopes", "measure_op_host_s", "reference_host_s", "with_op_host"]

TINY_SHAPE = (8, 2, 16, 1, 4)  # (hidden, heads, vocab, batch, seq) of the reference LM: kernels of ~0 seconds
TINY_LAYERS = (1, 9)  # block counts whose difference the per-node figure is the slope over (216 forward nodes apart)
HOST_RUNS = 15  # runs of each program per round whose median the round's slope takes (~0.4 s a round here)


def program_nodes(graph_module: torch.fx.GraphModule) -> tuple[int, int]:
    """(forward nodes, backward nodes) of an exported graph: its ATen call_function nodes, and those with a
    floating-point input and output (an autograd node each)."""
    fwd = bwd = 0
    for node in op_nodes(graph_module):
        args, kwargs, out = node_values(node)
        fwd += 1
        bwd += _has_backward(args, kwargs, out)
    return fwd, bwd


def _priced_s(graph_module: torch.fx.GraphModule, device: DeviceSpec) -> tuple[float, float]:
    """(forward, backward) seconds `op_cost` prices the graph's nodes on `device` without its host term."""
    bare = device if not (device.op_host_s or device.op_host_bwd_s) else _without_host(device)
    fwd = bwd = 0.0
    for node in op_nodes(graph_module):
        args, kwargs, out = node_values(node)
        c = op_cost(node.target, args, kwargs, out, bare)
        fwd, bwd = fwd + c.fwd_s, bwd + c.bwd_s
    return fwd, bwd


def _without_host(device: DeviceSpec) -> DeviceSpec:
    return dataclasses.replace(device, op_host_s=0.0, op_host_bwd_s=0.0)


def _program(layers: int):
    hidden, heads, vocab, batch, seq = TINY_SHAPE
    model, inputs = reference_model((layers, hidden, heads, vocab, batch, seq))
    exported = torch.export.export(model, inputs)
    return exported.module(), inputs, exported.graph_module


def _time_once(module, inputs) -> tuple[float, float]:
    for p in module.parameters():
        p.grad = None
    t0 = time.thread_time()
    loss = module(*inputs)
    t1 = time.thread_time()
    loss.backward()
    return t1 - t0, time.thread_time() - t1


@dataclasses.dataclass(frozen=True)
class HostPrograms:
    """The ``TINY_LAYERS`` programs the host slope is measured on: per program (GraphModule's module, its inputs, the
    exported graph, (forward, backward) nodes). Built once per calibration (:meth:`build`: torch.export, ~2-8 s)."""

    programs: tuple

    @staticmethod
    def build() -> "HostPrograms":
        progs = []
        for layers in TINY_LAYERS:
            module, inputs, gm = _program(layers)
            _time_once(module, inputs)  # warm-up (lazy initialisation, first allocations)
            progs.append((module, inputs, gm, program_nodes(gm)))
        return HostPrograms(tuple(progs))


def measure_host_slope_s(programs: HostPrograms, runs: int = HOST_RUNS) -> tuple[float, float]:
    """One round of the host measurement: (forward, backward) measured thread-CPU seconds per node between the
    smallest and the largest program (module docstring), each program's the median of ``runs`` runs, the programs
    interleaved run by run (a slow moment hits both). Nothing priced is taken off (:func:`op_host_from_slopes`).

    Raises:
        ValueError: ``runs`` < 1.
    """
    if runs < 1:
        raise ValueError(f"measure_host_slope_s(runs={runs}): need >= 1 run")
    (m0, x0, _, n0), (m1, x1, _, n1) = programs.programs[0], programs.programs[-1]
    times: list[list[tuple[float, float]]] = [[], []]
    for _ in range(runs):
        times[0].append(_time_once(m0, x0))
        times[1].append(_time_once(m1, x1))
    med = [(statistics.median(f for f, _ in t), statistics.median(b for _, b in t)) for t in times]
    return tuple((med[1][i] - med[0][i]) / max(1, n1[i] - n0[i]) for i in (0, 1))


def op_host_from_slopes(device: DeviceSpec, programs: HostPrograms | None, fwd_slope_s: float,
                        bwd_slope_s: float) -> tuple[float, float]:
    """(op_host_s, op_host_bwd_s) >= 0: the measured slopes per node less the slope ``device`` already prices
    (roofline and launch of each node, no host term) between the same programs (module docstring);
    ``programs=None`` builds them."""
    programs = programs or HostPrograms.build()
    (_, _, gm0, n0), (_, _, gm1, n1) = programs.programs[0], programs.programs[-1]
    p0, p1 = _priced_s(gm0, device), _priced_s(gm1, device)
    return tuple(max(0.0, slope - (p1[i] - p0[i]) / max(1, n1[i] - n0[i]))
                 for i, slope in enumerate((fwd_slope_s, bwd_slope_s)))


def measure_op_host_s(device: DeviceSpec, rounds: int = 7, runs: int = HOST_RUNS) -> tuple[float, float]:
    """(op_host_s, op_host_bwd_s): seconds per forward / backward node (module docstring), each >= 0: the median
    over ``rounds`` rounds of :func:`measure_host_slope_s`, less the priced slope. Calibration measures the rounds
    inside its passes instead (:func:`cost_model.device_rounds.measure_device_rounds`). Call with one intra-op
    thread (`cost_model.calibrate.calibration_threads`).

    Raises:
        ValueError: rounds or runs < 1.
    """
    if rounds < 1 or runs < 1:
        raise ValueError(f"measure_op_host_s(rounds={rounds}, runs={runs}): need both >= 1")
    programs = HostPrograms.build()
    slopes = [measure_host_slope_s(programs, runs) for _ in range(rounds)]
    return op_host_from_slopes(device, programs, statistics.median(f for f, _ in slopes),
                               statistics.median(b for _, b in slopes))


def reference_host_s(device: DeviceSpec, shape: tuple[int, ...] = REFERENCE_SHAPE) -> float:
    """Host seconds (forward + backward, `op_host_seconds` per node on `device`) of the reference step at
    `shape` (`cost_model.step_efficiency.reference_model`)."""
    model, inputs = reference_model(shape)
    total = 0.0
    for node in op_nodes(torch.export.export(model, inputs).graph_module):
        total += sum(op_host_seconds(*node_values(node), device))
    return total


def with_op_host(device: DeviceSpec, measurements: dict) -> DeviceSpec:
    """The calibration's hook (`cost_model.calibrate.calibrate`): `device` with its `op_host_s` / `op_host_bwd_s`
    from the pooled slopes the device rounds measured (``measurements["op_host_slope_s"]`` and
    ``["op_host_bwd_slope_s"]``, :func:`op_host_from_slopes`; measured here by :func:`measure_op_host_s` when absent);
    records them and the reference step's host seconds (:func:`reference_host_s`, which calibration takes out of the
    measured reference step before the step efficiency) in `measurements` under the same names and
    "reference_host_s"."""
    if "op_host_slope_s" in measurements and "op_host_bwd_slope_s" in measurements:
        fwd, bwd = op_host_from_slopes(device, None, measurements["op_host_slope_s"],
                                       measurements["op_host_bwd_slope_s"])
    else:
        fwd, bwd = measure_op_host_s(device)
    device = dataclasses.replace(device, op_host_s=fwd, op_host_bwd_s=bwd)
    measurements.update(op_host_s=fwd, op_host_bwd_s=bwd, reference_host_s=reference_host_s(device))
    return device
