"""Under the bf16 autocast recipe a pipeline prices the values crossing a stage boundary in their dtypes as run
(round 26, r26g; `planner.autocast_dtypes`, the rule `costs.Pricer` prices every other value by).

Members: the bytes a boundary sends forward and its gradient back (`segments.segment_graph` with
`segments.sent_nbytes`, what the pipeline search's p2p prices read), and a stage's activations, where its received
values are placeholders (`TracedGraph.cut_from`: `Pricer.node_dtypes` seeds them with the whole graph's dtypes as
run). Before, both took the traced fp32: a bias-free linear's (b, s, h) output, bf16 under autocast, was priced at
4 B per element sent (2x), and the next stage priced its square as saving an fp32 input (2x) and its linear a cast
copy the run never makes. A residual stream stays fp32 under autocast, and an fp32 plan as traced.
Held bytes: the stage graph run under CPU autocast on its received value in the dtype the runtime sends it
(`runtime.pipeline.boundary_dtypes`), saved tensors recorded as `benchmarks.saved_by_node` records them.
"""
from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch import nn

import parallelizer
from benchmarks.saved_by_node import _Recorder
from cost_model.topology import MeshTopology, get_cluster
from parallelizer.config import PlanConfig
from parallelizer.planner.api import resolve_cluster
from parallelizer.planner.costs import GraphTables, Pricer
from parallelizer.planner.local_storage import local_saved_bytes, plan_choice
from parallelizer.planner.segments import segment_graph, sent_nbytes
from parallelizer.planner.stage_layouts import stage_graphs
from parallelizer.runtime.pipeline import boundary_dtypes, cut_stages

B, S, H = 2, 3, 8  # (b, s, h) of the activation crossing each boundary


class Squared(nn.Module):
    """x -> fc(x * x), no bias: under bf16 autocast its output (what the next block receives) is bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, s, h) -> (b, s, h)
        return self.fc(x * x)


class Residual(Squared):
    """x -> x + fc(x * x): the fp32 x plus a bf16 branch is fp32 under autocast (type promotion)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + super().forward(x)


class Stack(nn.Module):
    def __init__(self, block: type[nn.Module]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([block() for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _traced(block):
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.trace(Stack(block), (torch.randn(B, S, H),))


@pytest.mark.parametrize("block, precision, itemsize", [(Squared, "bf16", 2), (Residual, "bf16", 4),
                                                        (Squared, "fp32", 4)])
def test_a_boundary_sends_a_b_s_h_activation_in_its_dtype_as_run(block, precision, itemsize):
    # before: 192 B (b s h x 4) for the bf16 linear output too (a GPU preset: autocast's CUDA policy)
    traced = _traced(block)
    seg = segment_graph(traced, sent_nbytes(traced, get_cluster("h100:1x1"), PlanConfig(precision=precision),
                                            GraphTables()))
    assert seg.cut_fwd_bytes[1:] == seg.cut_bwd_bytes[1:] == (B * S * H * itemsize,) * 4
    assert seg.cut_fwd_bytes[0] == 0  # nothing before the first block
    assert segment_graph(traced).cut_fwd_bytes[1:] == (B * S * H * 4,) * 4  # as traced without the rule


def _priced(traced, sg) -> dict[str, int]:
    """{node: bytes} the planner prices stage graph `sg` to save (one device, bf16 recipe, CPU autocast policy)."""
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(sg, {"dp": 1}, precision="bf16", recompute="none")
    mesh = plan.mesh
    pricer = Pricer(MeshTopology(resolve_cluster(None, 1)[0], mesh.shape, mesh.axis_names), mesh,
                    PlanConfig(precision="bf16"), sg, autocast_device="cpu")
    saved = local_saved_bytes(sg, *plan_choice(sg, plan.nodes, pricer.backward_nodes(sg)), pricer)
    return {n: b for n, b in saved.items() if b}


def _held(traced, model, sg, dtypes) -> dict[str, int]:
    """{node: bytes} the stage graph keeps for backward run under CPU bf16 autocast, its received values in the
    dtypes the runtime sends them (`boundary_dtypes`), its parameters the model's (fp32)."""
    fqn_of = {ph: fqn for fqn, p in sg.parameters.items() for ph in p.placeholders}
    args = []
    for node in sg.graph_module.graph.find_nodes(op="placeholder"):
        if node.name in fqn_of:
            args.append(model.get_parameter(fqn_of[node.name]))
        else:
            meta = traced.node(node.name).outputs[0]
            # a received activation carries a gradient; the model's own input (stage 0's) none, as the runtime
            # feeds it (round 27: priced so, `strategies.received_with_grad`; before, it was priced as one)
            args.append(torch.randn(meta.shape).to(dtypes[node.name]).requires_grad_(node.name not in traced.input_names))
    params = tuple(model.parameters())  # autocast's bf16 weight copies are set apart (priced with the parameters)
    recorder = _Recorder(sg.graph_module, {p.untyped_storage().data_ptr() for p in params}, params)
    with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t), \
            torch.autocast("cpu", torch.bfloat16):
        recorder.run(*args)
    return {n: b for n, b in recorder.held_bytes().items() if b}


def test_a_pp2_stage_prices_its_received_bf16_value_as_it_holds_it():
    # before: stage 1 priced 480 B where it holds 384 (its square's received input at 4 B per element)
    traced = _traced(Squared)
    model = Stack(Squared)
    cut = cut_stages(traced, 2)
    dtypes = boundary_dtypes(traced, cut, "autocast_bf16", "cpu")
    received = cut.inputs[1]
    assert [dtypes[n] for n in received] == [torch.bfloat16]
    for k, sg in enumerate(stage_graphs(traced, cut)):  # the graphs the planner solves and prices per stage
        assert sg.cut_from is traced
        priced, held = _priced(traced, sg), _held(traced, model, sg, dtypes)
        assert priced == held, (k, priced, held)
    # the closed form of stage 1: per block, the square saves its bf16 input twice over one storage (b s h x 2 B),
    # the linear its bf16 input (b s h x 2 B); the weights' bf16 copies are parameters' (priced with them)
    assert sum(held.values()) == 2 * 2 * B * S * H * 2
