"""Calibration of the host seconds per ATen node of a training step on a CPU (round 21, issue 13/14).

What it measures: the program the rewriter emits runs each ATen node as a Python call of an ``OpOverload`` in a
torch.fx GraphModule, under autograd; backward runs one autograd node per differentiable ATen node. On one
CPU thread that host work (the call, the dispatcher, the autograd record in forward; the engine's walk and
the node's bookkeeping in backward) comes on top of the kernel: measured in round 20 (benchmarks/RESULTS.md,
r20e) at ~24 us per node of a width-64 GPT-2 against ~2 us priced (``launch_overhead_s``, a bare
``torch.add`` on 1-element tensors from Python).

How: :func:`cost_model.step_efficiency.reference_model` at a tiny shape (:data:`TINY_SHAPE`: width 8,
sequence 4, so every kernel is ~0) with ``TINY_LAYERS`` = (1, 5) blocks, each exported with torch.export and
run through its GraphModule (``ExportedProgram.module()``), forward and ``backward()``, one thread, thread CPU
time (``time.thread_time``: other processes on the cores do not count). The per-node figure is the slope
between the two layer counts (fixed per-call costs cancel) of the measured seconds LESS the seconds already
priced (the roofline and ``launch_overhead_s`` of each node on ``device``, :func:`cost_model.compute.op_cost`
with no host term), per forward node (every ATen node of the graph, views included) and per backward node
(those with a floating-point input and output: :func:`cost_model.compute.op_host_seconds`' rule), medians over
``rounds`` interleaved rounds::

    op_host_s     = (fwd(5) - priced_fwd(5) - fwd(1) + priced_fwd(1)) / (nodes(5) - nodes(1))
    op_host_bwd_s = the same over backward seconds and backward nodes

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

__all__ = ["TINY_SHAPE", "TINY_LAYERS", "program_nodes", "measure_op_host_s", "reference_host_s", "with_op_host"]

TINY_SHAPE = (8, 2, 16, 1, 4)  # (hidden, heads, vocab, batch, seq) of the reference LM: kernels of ~0 seconds
TINY_LAYERS = (1, 5)  # block counts whose difference the per-node figure is the slope over


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


def measure_op_host_s(device: DeviceSpec, rounds: int = 7, repeats: int = 5) -> tuple[float, float]:
    """(op_host_s, op_host_bwd_s): seconds per forward / backward node (module docstring), each >= 0.
    Each round times every program `repeats` times (after one warm-up) and keeps the fastest (noise from other
    processes only slows a run down); the result is the median over `rounds` rounds. Call with one intra-op
    thread (`cost_model.calibrate.calibration_threads`).

    Raises:
        ValueError: rounds or repeats < 1.
    """
    if rounds < 1 or repeats < 1:
        raise ValueError(f"measure_op_host_s(rounds={rounds}, repeats={repeats}): need both >= 1")
    progs = [_program(n) for n in TINY_LAYERS]
    nodes = [program_nodes(gm) for _, _, gm in progs]
    priced = [_priced_s(gm, device) for _, _, gm in progs]
    for module, inputs, _ in progs:  # warm-up (lazy initialisation, first allocations)
        _time_once(module, inputs)
    fwd_rates, bwd_rates = [], []
    for _ in range(rounds):
        got = [min((_time_once(m, x) for _ in range(repeats)), key=sum) for m, x, _ in progs]
        (f0, b0), (f1, b1) = got
        (pf0, pb0), (pf1, pb1) = priced
        (nf0, nb0), (nf1, nb1) = nodes
        fwd_rates.append(((f1 - pf1) - (f0 - pf0)) / max(1, nf1 - nf0))
        bwd_rates.append(((b1 - pb1) - (b0 - pb0)) / max(1, nb1 - nb0))
    return max(0.0, statistics.median(fwd_rates)), max(0.0, statistics.median(bwd_rates))


def reference_host_s(device: DeviceSpec, shape: tuple[int, ...] = REFERENCE_SHAPE) -> float:
    """Host seconds (forward + backward, `op_host_seconds` per node on `device`) of the reference step at
    `shape` (`cost_model.step_efficiency.reference_model`)."""
    model, inputs = reference_model(shape)
    total = 0.0
    for node in op_nodes(torch.export.export(model, inputs).graph_module):
        total += sum(op_host_seconds(*node_values(node), device))
    return total


def with_op_host(device: DeviceSpec, measurements: dict) -> DeviceSpec:
    """The calibration's hook (`cost_model.calibrate.calibrate`): `device` with its measured `op_host_s` /
    `op_host_bwd_s` (:func:`measure_op_host_s`); records them and the reference step's host seconds
    (:func:`reference_host_s`, which calibration takes out of the measured reference step before the step
    efficiency) in `measurements` under the same names and "reference_host_s"."""
    fwd, bwd = measure_op_host_s(device)
    device = dataclasses.replace(device, op_host_s=fwd, op_host_bwd_s=bwd)
    measurements.update(op_host_s=fwd, op_host_bwd_s=bwd, reference_host_s=reference_host_s(device))
    return device
