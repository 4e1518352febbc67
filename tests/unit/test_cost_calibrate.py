"""cost_model.calibrate: a short real calibration round-trips through JSON."""

import json

import pytest
import torch

from cost_model import MeshTopology, collective_time_s, load_profile
from cost_model.calibrate import calibrate, fit_link
from cost_model.communication import flat_collective_time_s
from cost_model.topology import Link


def test_fit_link_recovers_alpha_beta():
    truth = Link("t", latency_s=50e-6, bandwidth_bytes_per_s=2e9)
    samples = [(kind, 4, nbytes, flat_collective_time_s(kind, nbytes, 4, truth))
               for kind in ("all_reduce", "all_gather") for nbytes in (1 << 12, 1 << 16, 1 << 20, 1 << 24)]
    fitted = fit_link(samples)
    assert fitted.latency_s == pytest.approx(50e-6, rel=1e-6)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_calibration_smoke_round_trip(tmp_path):
    path = tmp_path / "cpu.profile.json"
    profile = calibrate(nprocs=(2,), out_path=path, progress=False, message_sizes_bytes=(1 << 12, 1 << 16, 1 << 20),
                        matmul_sizes=(128, 256), memory_numel=1 << 20, repeats=3)
    text = path.read_text()
    assert list(json.loads(text)) == sorted(json.loads(text))  # stable key order
    loaded = load_profile(path)
    assert loaded == profile
    assert loaded.device.name == "cpu" and loaded.device.peak_flops_per_s[torch.float32] > 1e8
    cluster = loaded.cluster(2)
    assert (cluster.num_nodes, cluster.devices_per_node) == (1, 2)
    topo = MeshTopology(cluster, (2,), ("dp",))
    assert collective_time_s("all_reduce", 1 << 20, topo, "dp") > 0
    with pytest.raises(ValueError, match="calibrated: \\[2\\]"):
        loaded.cluster(4)
