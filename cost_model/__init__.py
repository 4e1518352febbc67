"""cost_model: prices for the planner, never decisions.

Answers "how long (seconds) / how many bytes" for a :class:`DeviceSpec`, a :class:`MeshTopology`
(mesh axis -> link) and a calibration :class:`Profile`. A leaf package: it never imports ``parallelizer``.

Modules: ``hardware`` (device presets with datasheet sources), ``topology`` (links, clusters, mesh layout),
``communication`` (alpha-beta collective times), ``compute`` (per-ATen-op roofline cost), ``memory``
(ZeRO training state, saved activations), ``measure`` + ``calibrate`` (measure this machine, fit a profile),
``pipeline_actions`` (the pipeline runtime's fixed cost per action, measured).
"""

from cost_model.calibrate import Profile, calibrate, load_profile
from cost_model.communication import (ALGORITHMS, COLLECTIVE_KINDS, HIERARCHICAL_KINDS, alpha_beta_coefficients,
                                      collective_algorithm, collective_time_s, flat_collective_time_s,
                                      hierarchical_byte_ranges)
from cost_model.compute import MetaExecutionError, OpCost, graph_flops, is_free_op, op_bytes, op_cost, op_flops
from cost_model.hardware import (A100_40GB, A100_80GB, DEVICE_PRESETS, H100_SXM, H200_SXM, DeviceSpec, PipelineActionCost,
                                 get_device)
from cost_model.memory import (BYTES_PER_PARAM, MemoryBreakdown, SavedShare, activation_memory_bytes,
                               graph_saved_activation_bytes, inflight_microbatches, saved_activation_bytes,
                               saved_tensor_owners, training_state_bytes)
from cost_model.topology import (CLUSTER_PRESETS, Cluster, CoreSharing, GroupInfo, Link, MeshTopology, dgx_a100,
                                 dgx_h100, dgx_h200, get_cluster)

__all__ = [
    "DeviceSpec", "PipelineActionCost", "A100_40GB", "A100_80GB", "H100_SXM", "H200_SXM", "DEVICE_PRESETS", "get_device",
    "Link", "Cluster", "CoreSharing", "GroupInfo", "MeshTopology", "dgx_a100", "dgx_h100", "dgx_h200",
    "CLUSTER_PRESETS", "get_cluster",
    "COLLECTIVE_KINDS", "ALGORITHMS", "alpha_beta_coefficients", "flat_collective_time_s", "collective_time_s",
    "HIERARCHICAL_KINDS", "collective_algorithm", "hierarchical_byte_ranges",
    "OpCost", "MetaExecutionError", "op_cost", "op_flops", "op_bytes", "is_free_op", "graph_flops",
    "MemoryBreakdown", "BYTES_PER_PARAM", "training_state_bytes", "saved_activation_bytes",
    "graph_saved_activation_bytes", "activation_memory_bytes", "inflight_microbatches", "SavedShare",
    "saved_tensor_owners",
    "Profile", "calibrate", "load_profile",
]
