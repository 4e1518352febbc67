"""FSDP / ZeRO-3 steps priced as the emitted program runs them (issue 13, round 20 r20c). Closed forms and counts,
no timing.

1. A parameter's all-gather is priced with its backward re-gather only where the program gathers it again
   (`rewriter.reshard.regathered`, the one rule of the pass and of the price): a bias only added, an embedding
   table only looked up is freed after forward and never re-gathered. Before, every parameter gather was priced
   twice: the bench's MLP on 4 ranks ran 31 collectives a step and was priced 37.
2. The wait of a blocking collective for the slowest rank scales with the compute the rank ran since its previous
   collective (`cost_model.communication.sync_wait_s`): the calibrated wait follows a chunk of 8 matmuls; the FSDP
   programs' collectives follow 0.7-2.2 ms of compute each on 4 ranks of this machine, and the full 4.8 ms wait on
   each priced them +50..+86% over their measured step (run 16).
"""
import contextlib
import dataclasses
import io

import pytest
import torch

import parallelizer
from cost_model import Cluster, MeshTopology
from cost_model.communication import collective_time_s, step_collective_s
from cost_model.compute import op_cost
from cost_model.hardware import DeviceSpec
from cost_model.topology import Link
from parallelizer import zoo
from parallelizer.planner.steptime import estimate_step_time
from parallelizer.rewriter.apply import rewrite
from parallelizer.rewriter.spec import spec_from_plan

CPU = DeviceSpec("cpu", {torch.float32: 1e11}, 10**10, 1e10, 1.0, 1.0, 2e-6, kind="cpu",
                 optimizer_bytes_per_s=4e9, optimizer_tensor_s=40e-6, comm_overlap=0.0)
LINK = Link("gloo_x4", 1e-4, 1e9)


def _cluster(sync_s: float) -> Cluster:
    return Cluster(dataclasses.replace(CPU, collective_sync_s=sync_s), 1, 4, LINK, LINK)


def _mlp():
    return parallelizer.trace(*zoo.mlp(in_features=16, dim=32, hidden=64, depth=2, batch=8))


def _plan(traced, cluster, mesh=None, roles=None):
    with contextlib.redirect_stdout(io.StringIO()):  # the solver's banner
        return parallelizer.plan(traced, mesh or {"dp": 4}, cluster=cluster, axis_roles=roles or {"dp": "fsdp"})


def _emitted(traced, plan):
    """(forward collective steps, the steps whose gathered value the program releases and re-gathers) of rank 0's
    program, read off the rewritten graph. A released value is re-gathered when one of its refills runs: one whose
    consumer keeps it whatever requires grad (partners None) or has a partner computed from a parameter (round 27:
    the first layer's matmul keeps its weight only for its input's gradient, and the batch needs none)."""
    gm = rewrite(traced, spec_from_plan(plan), rank=0).graph_module
    steps = [n for n in gm.graph.nodes if n.op == "call_function" and n.meta.get("step") is not None]
    released = [n.args[0] for n in gm.graph.nodes
                if n.op == "call_function" and getattr(n.target, "__name__", "") == "release"]
    refills = [n for n in gm.graph.nodes if n.op == "call_function" and getattr(n.target, "__name__", "") == "refill"]

    def from_parameter(node) -> bool:
        todo, seen = [node], set()
        while todo:
            n = todo.pop()
            if n.op == "placeholder" and n.name.startswith("p_"):
                return True
            seen.add(n)
            todo += [a for a in n.all_input_nodes if a not in seen]
        return False

    again = [g for g in released if any(r.args[1] is g and (r.args[3] is None or any(map(from_parameter, r.args[3])))
                                        for r in refills)]
    return [n.meta["step"] for n in steps], [n.meta["step"] for n in again]


def test_a_parameter_gather_is_priced_re_gathered_only_where_the_program_gathers_it_again():
    cluster = _cluster(0.0)  # no sync wait: the price is the collectives' alpha-beta times alone
    traced = _mlp()
    plan = _plan(traced, cluster)
    steps, regathered = _emitted(traced, plan)
    gathers = [s for s in steps if s.kind == "all_gather" and s.regather]
    # the MLP's weights (2-D) are saved by their matmuls and re-gathered, but the first's (its input, the batch,
    # needs no gradient: round 27); its biases (1-D) are only added: not
    weights = [p for p in traced.parameters.values() if len(p.shape) == 2]
    assert len(gathers) == len(traced.parameters) == 2 * len(weights)
    assert len(regathered) == len(weights) - 1 and all(s.regather for s in regathered)
    topo = MeshTopology(cluster, (4,), ("dp",))
    t = lambda kind, n: collective_time_s(kind, n, topo, ("dp",))  # noqa: E731
    closed = (sum(t(s.fwd_collective, s.nbytes) for s in steps if s.fwd_collective)  # forward
              # conjugates: the parameters' reduce-scatters (the input's slice needs no gradient: no all-gather back)
              + sum(t(s.bwd_collective, s.bwd_nbytes) for s in steps if s.bwd_collective and s.kind != "local_slice")
              + sum(t("all_gather", s.nbytes) for s in regathered))  # re-gathers, as emitted
    est = estimate_step_time(traced, plan, cluster=cluster)
    assert est.blocking_comm_s == pytest.approx(closed, rel=1e-9)
    # the ILP's breakdown prices the same re-gathers (`Pricer.regathers`, the rewriter's rule; a re-gather is
    # booked with its step's backward, the reduce-scatter)
    assert plan.cost.comm_s["all_gather"] + plan.cost.comm_s["reduce_scatter"] == pytest.approx(closed, rel=1e-9)


def test_the_sync_wait_scales_with_the_compute_before_the_collective_closed_form():
    from cost_model.communication import sync_chunk_s, sync_wait_s
    device = dataclasses.replace(CPU, collective_sync_s=4e-3)
    a = torch.empty(256, 256, device="meta")
    chunk = 8 * op_cost(torch.ops.aten.mm.default, (a, a), {}, a, device).fwd_s  # the calibration's compute chunk
    assert sync_chunk_s(device) == pytest.approx(chunk)
    assert sync_wait_s(device) == 4e-3  # unknown order (the ILP): the full calibrated wait
    assert sync_wait_s(device, 0.0) == 0.0  # right after another collective: no drift to wait for
    assert sync_wait_s(device, chunk / 4) == pytest.approx(1e-3)
    assert sync_wait_s(device, 10 * chunk) == pytest.approx(4e-3)  # capped at the calibrated wait
    assert sync_wait_s(CPU, 1e-3) == 0.0  # no calibrated wait (GPU presets): none
    with pytest.raises(ValueError, match="compute_before_s"):
        sync_wait_s(device, -1.0)
    topo = MeshTopology(_cluster(4e-3), (4,), ("dp",))
    assert step_collective_s("all_reduce", 1 << 20, topo, ("dp",), chunk / 2) == pytest.approx(
        collective_time_s("all_reduce", 1 << 20, topo, ("dp",)) + 2e-3)


def test_an_fsdp_step_pays_the_wait_by_the_compute_between_its_collectives_and_the_ilp_the_full_wait():
    sync = 4e-3
    traced = _mlp()
    plan = _plan(traced, _cluster(sync))
    with_sync = estimate_step_time(traced, plan, cluster=_cluster(sync))
    without = estimate_step_time(traced, plan, cluster=_cluster(0.0))
    steps, regathered = _emitted(traced, plan)
    n = (sum(1 for s in steps if s.fwd_collective) + len(regathered)
         + sum(1 for s in steps if s.bwd_collective and s.kind != "local_slice"))
    waited = with_sync.blocking_comm_s - without.blocking_comm_s
    compute = with_sync.forward_compute_s + with_sync.backward_compute_s
    a = torch.empty(256, 256, device="meta")  # the calibration's compute chunk: 8 matmuls of 256 x 256
    chunk = 8 * op_cost(torch.ops.aten.mm.default, (a, a), {}, a, _cluster(sync).device).fwd_s
    # each collective waits sync x min(1, compute before it / chunk): in all at most sync x (compute / chunk) and
    # at most n x sync; on main every collective paid the full wait (n x sync)
    assert 0 < waited <= min(n * sync, sync * compute / chunk) + 1e-12
    assert waited < 0.5 * n * sync
