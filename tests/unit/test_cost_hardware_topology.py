"""cost_model.hardware and cost_model.topology: presets, validation, mesh layout."""

import dataclasses

import pytest
import torch

from cost_model import (A100_40GB, H100_SXM, H200_SXM, DeviceSpec, Link, MeshTopology, dgx_a100, dgx_h100,
                        get_cluster, get_device)


def test_presets_carry_datasheet_values():
    assert H100_SXM.peak_flops_per_s[torch.bfloat16] == pytest.approx(989.5e12)
    assert H100_SXM.peak_flops_per_s[torch.float32] == pytest.approx(67e12)  # non-tensor-core FP32
    assert A100_40GB.hbm_bytes_per_s == pytest.approx(1555e9)
    assert H200_SXM.hbm_bytes == 141 * 10**9
    assert get_device("H100-SXM") is H100_SXM


def test_gpu_matmul_efficiency_follows_published_best_shape_rates():
    """Round 18: each GPU preset's matmul efficiency is 0.7 of the A100's peak scaled by the device's published
    maximum achievable matmul FLOPS (Bekman, ml-engineering MAMF table: A100 SXM 267.9 / 312, H100 SXM 792.1 / 989
    TFLOP/s); one 0.7 for every preset priced an H100 GEMM 7% faster than the A100's figures imply."""
    from cost_model import A100_80GB
    a100, h100 = 267.9 / 312, 792.1 / 989
    assert A100_40GB.matmul_efficiency == A100_80GB.matmul_efficiency == pytest.approx(0.7, rel=1e-12)
    assert H100_SXM.matmul_efficiency == pytest.approx(0.7 * h100 / a100, rel=1e-9)  # 0.653
    assert H200_SXM.matmul_efficiency == H100_SXM.matmul_efficiency  # same die and clocks (H200 datasheet)
    # an H100 GEMM's priced rate: 0.653 x 989.5 = 646 TFLOP/s, 0.815 of its published best-shape 792.1
    rate = H100_SXM.achievable_flops_per_s(torch.bfloat16)
    assert rate / 792.1e12 == pytest.approx(0.7 / a100 * 989.5 / 989, rel=1e-9)


def test_get_device_unknown_lists_valid_names():
    with pytest.raises(ValueError, match="a100_40gb.*h200_sxm"):
        get_device("tpu")


@pytest.mark.parametrize("field,value", [("matmul_efficiency", 1.5), ("hbm_bytes_per_s", 0.0),
                                         ("launch_overhead_s", -1.0), ("peak_flops_per_s", {})])
def test_device_spec_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(H100_SXM, **{field: value})


def test_device_spec_is_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100_SXM.name = "x"  # type: ignore[misc]
    assert hash(H100_SXM) == hash(dataclasses.replace(H100_SXM))


def test_dgx_links_are_per_direction_per_gpu():
    a100, h100 = dgx_a100(2), dgx_h100(1)
    assert a100.intra_node_link.bandwidth_bytes_per_s == pytest.approx(300e9)  # 600 GB/s bidirectional
    assert a100.inter_node_link.bandwidth_bytes_per_s == pytest.approx(25e9)  # 200 Gb/s per GPU
    assert h100.intra_node_link.bandwidth_bytes_per_s == pytest.approx(450e9)
    assert h100.inter_node_link.bandwidth_bytes_per_s == pytest.approx(50e9)
    assert a100.world_size == 16


def test_get_cluster_parses_and_rejects():
    cluster = get_cluster("h100:2x8")
    assert (cluster.num_nodes, cluster.devices_per_node, cluster.device) == (2, 8, H100_SXM)
    assert get_cluster("dgx_h200:1x4").device is H200_SXM
    for bad in ("h100", "h100:2x9", "v100:1x8", "h100:2*8"):
        with pytest.raises(ValueError, match="PRESET:NODESxDEVICES"):
            get_cluster(bad)


def test_mesh_last_axis_is_innermost():
    topo = MeshTopology(dgx_h100(2), (2, 8), ("dp", "tp"))
    tp, dp = topo.axis_info("tp"), topo.axis_info("dp")
    assert (tp.size, tp.ranks_per_node, tp.num_nodes) == (8, 8, 1)
    assert (dp.size, dp.ranks_per_node, dp.num_nodes) == (2, 1, 2)
    both = topo.group_info(("dp", "tp"))
    assert (both.size, both.ranks_per_node, both.num_nodes) == (16, 8, 2)


def test_mesh_axis_partly_inside_a_node():
    topo = MeshTopology(dgx_h100(4), (8, 4), ("dp", "tp"))  # dp stride 4: 2 dp ranks per node
    dp = topo.axis_info("dp")
    assert (dp.ranks_per_node, dp.num_nodes) == (2, 4)


def test_mesh_uneven_spread_is_priced_as_all_inter_node():
    cluster = get_cluster("h100:3x8")
    topo = MeshTopology(cluster, (2, 3, 4), ("a", "b", "c"))  # axis b: ranks 0,4,8 -> nodes 0,0,1
    info = topo.axis_info("b")
    assert (info.ranks_per_node, info.num_nodes) == (1, 3)


def test_mesh_validation():
    with pytest.raises(ValueError, match="has 8 devices but the cluster has 2 nodes x 8 = 16"):
        MeshTopology(dgx_h100(2), (8,), ("dp",))
    topo = MeshTopology(dgx_h100(1), (2, 4), ("dp", "tp"))
    with pytest.raises(ValueError, match="unknown mesh axis 'pp' for mesh {'dp': 2, 'tp': 4}"):
        topo.axis_info("pp")
    with pytest.raises(ValueError, match="one name per axis"):
        MeshTopology(dgx_h100(1), (8,), ("dp", "tp"))
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        Link("x", 1e-6, 0.0)


def test_device_spec_rejects_unknown_dtype_with_remedy():
    spec = DeviceSpec("t", {torch.float32: 1e12}, 10**9, 1e11, 0.5, 0.5, 0.0)
    with pytest.raises(ValueError, match="no peak FLOP/s for dtype torch.bfloat16"):
        spec.achievable_flops_per_s(torch.bfloat16)
