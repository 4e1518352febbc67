"""Memory a plan may not use: a reserve for what the planner does not count tensor by tensor.

On a GPU some device memory is never available to a plan's own tensors (parameters, gradients, optimizer
state, activations, buffers):

* allocator fragmentation: PyTorch's caching allocator keeps freed blocks cached and splits them, so memory
  "reserved but unallocated" grows with varied tensor sizes (PyTorch docs, "CUDA semantics: memory
  management", and the ``expandable_segments`` option introduced to reduce it). Measured in LLM training, it
  can waste up to 43% of device memory with virtual pipelines and recomputation (arXiv:2507.16274, abstract);
  plans without those fragment less;
* cuBLAS workspaces: 32 MiB per handle and stream on Hopper, 4 MiB before (cuBLAS API reference,
  ``cublasSetWorkspace``; PyTorch adopted these sizes in pytorch/pytorch#120925);
* NCCL communication buffers: ``NCCL_BUFFSIZE`` (default 4 MiB) per channel and peer, per protocol, for
  each communicator (NCCL docs, "Environment Variables"); a 2-D mesh opens at least one communicator per
  axis plus the world group, i.e. a few hundred MiB;
* transient buffers of the collectives the plan emits (all-gathered FSDP weights in flight, bucketed
  gradient all-reduces: DDP's default bucket is 25 MiB).

The CUDA context itself is not in the reserve: device presets state memory in decimal GB, below the
GiB-sized capacity, which leaves it room (``cost_model.hardware``).

Default (:func:`default_reserve_bytes`), an assumption to refine with measurements on a lent GPU:
``GPU_RESERVE_FRACTION`` (10%) of device memory for fragmentation plus ``GPU_RESERVE_FIXED_BYTES`` (1 GB) for
workspaces and communication buffers; 80 GB H100: 9 GB reserved, 71 GB for the plan. A calibrated CPU
(``DeviceSpec.kind == "cpu"``) has none of these CUDA components: 0 by default.
"""
from __future__ import annotations

from cost_model.hardware import DeviceSpec

__all__ = ["GPU_RESERVE_FRACTION", "GPU_RESERVE_FIXED_BYTES", "default_reserve_bytes"]

GPU_RESERVE_FRACTION = 0.10  # allocator fragmentation, fraction of device memory (module docstring)
GPU_RESERVE_FIXED_BYTES = 1_000_000_000  # cuBLAS workspaces + NCCL buffers + collective buffers, bytes


def default_reserve_bytes(device: DeviceSpec) -> int:
    """Bytes of ``device`` kept out of a plan by default (module docstring): on a GPU
    ``GPU_RESERVE_FRACTION * hbm_bytes + GPU_RESERVE_FIXED_BYTES``; on a calibrated CPU 0."""
    if device.kind == "cpu":
        return 0
    return int(GPU_RESERVE_FRACTION * device.hbm_bytes) + GPU_RESERVE_FIXED_BYTES
