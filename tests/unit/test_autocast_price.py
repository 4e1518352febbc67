"""The bf16 recipe priced in autocast's dtypes (round 25, r25b; `planner.autocast_dtypes`): closed forms on one op.

Under torch.autocast("cuda", bf16) (the GPU presets' policy) softmax is on the fp32 list: the bf16 output of the
linear before it is copied to fp32 (read 2 B, write 4 B per element; no launch of its own: the GPU presets price
pointwise work fused), softmax reads and writes 4 B per element (one kernel launch) and
keeps its fp32 output for backward. Before round 25 the whole graph was priced in bf16: 2 B per element saved.
"""
from __future__ import annotations

import math

import torch

import parallelizer
from cost_model.hardware import H100_SXM
from cost_model.topology import MeshTopology
from parallelizer.config import PlanConfig
from parallelizer.core.mesh import MeshSpec
from parallelizer.planner.api import resolve_cluster
from parallelizer.planner.autocast_dtypes import autocast_dtypes
from parallelizer.planner.costs import Pricer
from parallelizer.planner.strategies import build_spaces

B, S, H = 8, 128, 256


class LinearSoftmax(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(H, H, bias=False), torch.nn.Linear(H, H, bias=False)

    def forward(self, x):
        return self.b(torch.softmax(self.a(x), dim=-1)).sum()


def _pricer_and_graph(precision: str):
    traced = parallelizer.trace(LinearSoftmax(), (torch.randn(B, S, H),))
    mesh = MeshSpec(("dp",), (1,))
    pricer = Pricer(MeshTopology(resolve_cluster("h100:1x1", 1)[0], mesh.shape, mesh.axis_names), mesh,
                    PlanConfig(precision=precision), traced)
    return traced, pricer, build_spaces(traced, mesh, PlanConfig(precision=precision))


def _softmax(traced):
    return next(n for n, i in traced.nodes.items() if i.op == "call_function" and "softmax" in str(i.target))


def test_softmax_under_the_bf16_recipe_is_priced_in_fp32_as_cuda_autocast_runs_it():
    traced, pricer, spaces = _pricer_and_graph("bf16")
    name = _softmax(traced)
    op = autocast_dtypes(traced.graph_module, "cuda")[name]
    assert op.inputs == (torch.float32,) and op.casts == {0} and op.outputs == (torch.float32,)
    cost = pricer.node_costs(traced, traced.nodes[name], spaces[name])[0]
    n = B * S * H
    assert cost.saved_bytes == 4 * n  # fp32 output kept (was 2 * n)
    dev = H100_SXM
    cast_s = (2 + 4) * n / dev.achievable_bytes_per_s  # fused into a neighbour's kernel on a GPU preset
    softmax_s = (4 + 4) * n / dev.achievable_bytes_per_s + dev.launch_overhead_s
    assert math.isclose(cost.fwd_s, cast_s + softmax_s, rel_tol=1e-9), (cost.fwd_s, cast_s + softmax_s)
    # the value leaving softmax is fp32: the next linear's input moves 4 B per element on any edge
    consumer = next(n for n in traced.nodes if n != name and name in [t.producer for t in spaces[n].inputs])
    ti = next(t for t in spaces[consumer].inputs if t.producer == name)
    assert pricer.input_itemsize(traced, ti) == 4
    # the linear's output is bf16 (2 B per element), and a parameter stays fp32 until autocast casts it at its use
    first = next(t for t in spaces[name].inputs)
    assert pricer.input_itemsize(traced, first) == 2
    weight = next(p.placeholders[0] for p in traced.parameters.values())
    assert pricer.value_dtype(traced, weight, torch.float32) == torch.float32


def test_the_cpu_policy_keeps_softmax_in_bf16():
    traced, _, _ = _pricer_and_graph("bf16")
    op = autocast_dtypes(traced.graph_module, "cpu")[_softmax(traced)]
    assert op.inputs == (torch.bfloat16,) and not op.casts and op.outputs == (torch.bfloat16,)


def test_fp32_plans_price_the_traced_dtypes():
    traced, pricer, spaces = _pricer_and_graph("fp32")
    name = _softmax(traced)
    assert pricer.node_dtypes(traced, name) is None
    assert pricer.node_costs(traced, traced.nodes[name], spaces[name])[0].saved_bytes == 4 * B * S * H
