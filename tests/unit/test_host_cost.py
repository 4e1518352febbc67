"""Round 21 (issue 13/14): host seconds per ATen node on a CPU, priced by `op_cost` on top of the kernel and
measured by calibration (`cost_model.host_cost`). Closed forms only: no timing is asserted."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from cost_model import H100_SXM, op_cost
from cost_model import host_cost
from cost_model.calibrate import Profile, _profile_to_json, load_profile
from cost_model.hardware import DeviceSpec

aten = torch.ops.aten
CPU = DeviceSpec(name="cpu", peak_flops_per_s={torch.float32: 50e9}, hbm_bytes=1 << 34, hbm_bytes_per_s=10e9,
                 matmul_efficiency=0.8, memory_efficiency=0.8, launch_overhead_s=1e-6, kind="cpu")
HOST = dataclasses.replace(CPU, op_host_s=12e-6, op_host_bwd_s=9e-6)


def _meta(*shape):
    return torch.empty(*shape, device="meta")


def test_a_node_costs_its_kernel_plus_the_host_seconds_views_and_all():
    """fwd_s = roofline + launch + op_host_s for every node; bwd_s = its backward + op_host_bwd_s for a node with
    a floating-point input and output (a view records an autograd node too); integer nodes: no backward host."""
    a, b, out = _meta(64, 32), _meta(32, 16), _meta(64, 16)
    bare, host = op_cost(aten.mm.default, (a, b), {}, out, CPU), op_cost(aten.mm.default, (a, b), {}, out, HOST)
    flops = 2 * 64 * 32 * 16
    nbytes = 4 * (64 * 32 + 32 * 16 + 64 * 16)
    roof = max(flops / (50e9 * 0.8), nbytes / (10e9 * 0.8))
    torch.testing.assert_close(bare.fwd_s, roof + 1e-6)
    torch.testing.assert_close(host.fwd_s, roof + 1e-6 + 12e-6)
    torch.testing.assert_close(host.bwd_s, bare.bwd_s + 9e-6)
    view = op_cost(aten.view.default, (a, [32, 64]), {}, _meta(32, 64), HOST)
    assert (view.fwd_s, view.bwd_s) == (12e-6, 9e-6)  # free of bytes and kernels, not of host seconds
    ids = torch.empty(4, 8, dtype=torch.int64, device="meta")
    integer = op_cost(aten.add.Tensor, (ids, ids), {}, ids, HOST)
    assert integer.bwd_s == 0.0 and integer.fwd_s > 12e-6


def test_gpu_presets_and_older_profiles_price_no_host_seconds(tmp_path):
    """The presets keep their prices (the host overlaps the GPU's kernels); a profile written before round 21 reads
    as 0 and one written now round-trips its two figures."""
    assert (H100_SXM.op_host_s, H100_SXM.op_host_bwd_s) == (0.0, 0.0)
    a, b, out = _meta(64, 32), _meta(32, 16), _meta(64, 16)
    assert op_cost(aten.mm.default, (a, b), {}, out, H100_SXM) == op_cost(
        aten.mm.default, (a, b), {}, out, dataclasses.replace(H100_SXM))
    profile = Profile(device=HOST, links={}, cpu_count=2)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_to_json(profile, {})))
    loaded = load_profile(path)
    assert (loaded.device.op_host_s, loaded.device.op_host_bwd_s) == (12e-6, 9e-6)
    data = json.loads(path.read_text())
    del data["device"]["op_host_s"], data["device"]["op_host_bwd_s"]
    path.write_text(json.dumps(data))
    assert (load_profile(path).device.op_host_s, load_profile(path).device.op_host_bwd_s) == (0.0, 0.0)
    # the host seconds slow down with the compute factor under sharing, like the launch
    slowed = HOST.scaled(2.0, 3.0)
    torch.testing.assert_close((slowed.op_host_s, slowed.op_host_bwd_s), (24e-6, 18e-6))


def test_measure_op_host_s_recovers_the_per_node_seconds_of_a_closed_form_program(monkeypatch):
    """The calibration's slope: programs of 1 and 9 blocks that run (priced seconds + nodes x h + a fixed c) give
    h per node, forward and backward, whatever c is (the call's fixed cost cancels)."""
    h_f, h_b, c_f, c_b = 11e-6, 7e-6, 3e-4, 5e-4
    progs = {n: host_cost._program(n) for n in host_cost.TINY_LAYERS}
    by_module = {id(m): (host_cost.program_nodes(gm), host_cost._priced_s(gm, CPU)) for m, _, gm in progs.values()}

    def fake_time(module, inputs):
        (nf, nb), (pf, pb) = by_module[id(module)]
        return pf + nf * h_f + c_f, pb + nb * h_b + c_b
    monkeypatch.setattr(host_cost, "_program", lambda n: progs[n])
    monkeypatch.setattr(host_cost, "_time_once", fake_time)
    fwd, bwd = host_cost.measure_op_host_s(CPU, rounds=3, runs=2)
    torch.testing.assert_close((fwd, bwd), (h_f, h_b))
    nodes = [host_cost.program_nodes(gm) for _, _, gm in progs.values()]
    assert nodes[1][0] > nodes[0][0] and nodes[1][1] > nodes[0][1]  # the blocks add nodes both ways


def test_the_host_slope_is_a_device_round_quantity_pooled_by_its_median_then_less_the_priced_slope(monkeypatch):
    """Round 22 (r22g): calibration measures the host slope in every device round (so in every pass, pooled like the
    other device quantities) as the median of each program's runs, and takes the priced slope off after pooling.
    Closed form: programs that run (priced + nodes x h + c) but every third run 3x slower (a noisy moment) give h
    per node (the median of 3 runs ignores one outlier; the fastest-of or a mean would not be h for the slow runs
    alone), and with_op_host turns pooled slopes s into s - priced slope."""
    from cost_model import device_rounds
    h_f, h_b, c = 11e-6, 7e-6, 3e-4
    progs = {n: host_cost._program(n) for n in host_cost.TINY_LAYERS}
    info = {id(m): (host_cost.program_nodes(gm), host_cost._priced_s(gm, CPU)) for m, _, gm in progs.values()}
    calls = {}

    def fake_time(module, inputs):
        (nf, nb), (pf, pb) = info[id(module)]
        k = calls[id(module)] = calls.get(id(module), 0) + 1
        slow = 3.0 if k % 3 == 0 else 1.0
        return slow * (pf + nf * h_f + c), slow * (pb + nb * h_b + c)
    monkeypatch.setattr(host_cost, "_program", lambda n: progs[n])
    monkeypatch.setattr(host_cost, "_time_once", fake_time)
    monkeypatch.setattr(device_rounds, "measure_optimizer", lambda: (1e9, 1e-5))  # no AdamW process here
    host = host_cost.HostPrograms.build()
    calls.clear()
    rounds = device_rounds.measure_device_rounds((64,), 1 << 10, rounds=2, host=host)
    (nf0, nb0), (pf0, pb0) = info[id(host.programs[0][0])]
    (nf1, nb1), (pf1, pb1) = info[id(host.programs[-1][0])]
    want_f = ((pf1 - pf0) + (nf1 - nf0) * h_f) / (nf1 - nf0)  # measured slope: priced + host, per node
    want_b = ((pb1 - pb0) + (nb1 - nb0) * h_b) / (nb1 - nb0)
    assert len(rounds["op_host_slope_s"]) == len(rounds["op_host_bwd_slope_s"]) == 2
    torch.testing.assert_close(rounds["op_host_slope_s"], [want_f] * 2)
    torch.testing.assert_close(rounds["op_host_bwd_slope_s"], [want_b] * 2)
    measurements = {"op_host_slope_s": want_f, "op_host_bwd_slope_s": want_b}
    device = host_cost.with_op_host(CPU, measurements)
    torch.testing.assert_close((device.op_host_s, device.op_host_bwd_s), (h_f, h_b))
    assert (measurements["op_host_s"], measurements["op_host_bwd_s"]) == (device.op_host_s, device.op_host_bwd_s)
    with pytest.raises(ValueError, match="runs"):
        host_cost.measure_host_slope_s(host, runs=0)


def test_reference_host_s_is_the_per_node_rule_summed_over_the_reference_graph():
    shape = (1, 8, 2, 16, 1, 4)
    from cost_model.step_efficiency import reference_model
    model, inputs = reference_model(shape)
    nf, nb = host_cost.program_nodes(torch.export.export(model, inputs).graph_module)
    torch.testing.assert_close(host_cost.reference_host_s(HOST, shape), nf * 12e-6 + nb * 9e-6)
    with pytest.raises(ValueError, match="rounds"):
        host_cost.measure_op_host_s(CPU, rounds=0)
