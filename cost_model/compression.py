"""Price of a compressed data-parallel gradient all-reduce: bytes on the wire and the codec's compute.

Two codecs, both applied per gradient bucket by ``parallelizer.rewriter.grad_sync`` (which runs torch's own
DDP communication hooks on our buckets):

* ``"bf16"`` -- ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook``: the bucket
  is cast to bfloat16, all-reduced, and cast back. Bytes on the wire: 2 per element instead of the gradient's
  element size (half of fp32). Fidelity: bf16's 8-bit significand, relative rounding error <= 2**-8 per
  element per cast (IEEE-style round-to-nearest).
* ``"powersgd"`` -- ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook`` (Vogels,
  Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
  NeurIPS 2019, Algorithm 1, with error feedback and warm start). Each gradient viewed as a matrix
  ``(shape[0], prod(shape[1:]))`` = (n, m) is approximated as ``P Q^T`` with rank ``r' = min(n, m, r)``; it
  is compressed when ``(n + m) r' * min_compression_rate < n m`` (torch's ``_should_compress``, default rate
  2); the others (1-D tensors: biases, norm weights) are all-reduced uncompressed. The hook runs three
  all-reduces one after the other: the uncompressed tensors, all P (``sum n r'`` elements), all Q
  (``sum m r'`` elements). Its warm-up steps (torch's ``start_powerSGD_iter``, `POWERSGD_DEFAULT_WARMUP`) are
  one plain all-reduce each: priced as ``"none"``; the prices here are the steady state after them.

Codec compute (roofline, ``cost_model.compute``'s convention: ``max(FLOPs / achievable FLOP/s, bytes /
achievable bytes/s) + kernels * launch overhead``), per compressed (n, m) matrix of rank r':

* FLOPs: three matmuls ``P = M Q``, ``Q = M^T P``, ``M' = P Q^T`` at ``2 n m r'`` each (Algorithm 1, lines
  3, 6, 8), plus the orthogonalisation of P and Q (Householder QR of an n x r' matrix, ``2 n r'^2`` FLOPs,
  Golub & Van Loan, Matrix Computations, 4th ed., Sec. 5.2.2): ``6 n m r' + 2 (n + m) r'^2``.
* memory traffic: the three matmuls read or write M (3 passes), error feedback adds the stored error
  (2 reads + 1 write), copies the input (1 read + 1 write) and stores the new error (2 reads + 1 write):
  11 passes over the gradient's bytes (torch's hook, ``powerSGD_hook``, steps I-III).
* kernels: 3 matmuls + 2 orthogonalisations per matrix, plus 8 per bucket (error add/copy/subtract,
  concatenation of the uncompressed tensors, their copy back, the divisions by the world size).

bf16 codec: casts to bf16 (read 4, write 2 bytes per fp32 element), the division by the world size (read
2, write 2), the cast back (read 2, write 4) and our multiplication back to a sum (read 4, write 4): 24 bytes
per fp32 element, 4 kernels.

Both hooks average over the group; our bucketed sync sums, so the runtime multiplies by the group size
(priced above). The FLOP/s used are those of the gradient's dtype (fp32 main gradients: CUDA-core FP32).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cost_model.communication import collective_time_s
from cost_model.hardware import DeviceSpec
from cost_model.topology import MeshTopology

__all__ = ["COMPRESSIONS", "POWERSGD_MIN_COMPRESSION_RATE", "POWERSGD_DEFAULT_WARMUP", "powersgd_matrix",
           "CompressedSync", "compressed_sync", "compressed_sync_time_s"]

COMPRESSIONS = ("none", "bf16", "powersgd")
"""Gradient codecs the cost model prices and the runtime applies."""
POWERSGD_MIN_COMPRESSION_RATE = 2
"""torch's ``PowerSGDState(min_compression_rate=2)`` default: compress a matrix only if it shrinks > 2x."""
POWERSGD_DEFAULT_WARMUP = 1000
"""Optimizer steps all-reduced exactly before PowerSGD starts: torch's ``PowerSGDState(start_powerSGD_iter=1_000)``
default. torch's docs advise starting from 10% of the run's total steps (early training is sensitive to inexact
gradients); the planner does not know the run's length, so a user who does sets ``PlanConfig.powersgd_warmup``."""

_POWERSGD_PASSES = 11  # memory passes over a compressed gradient (module docstring)
_POWERSGD_KERNELS_PER_MATRIX = 5
_POWERSGD_KERNELS_PER_BUCKET = 8
_BF16_BYTES_PER_FP32_ELEMENT = 24
_BF16_KERNELS = 4


def powersgd_matrix(shape: tuple[int, ...], rank: int,
                    min_compression_rate: float = POWERSGD_MIN_COMPRESSION_RATE) -> tuple[int, int, int] | None:
    """``(n, m, r')`` when PowerSGD compresses a gradient of ``shape`` at ``rank``, else None (module docstring:
    the matrix view ``(shape[0], prod(shape[1:]))``, ``r' = min(n, m, rank)``, torch's ``_should_compress``).
    A 0-d tensor is a (1, 1) matrix: never compressed.

    Raises:
        ValueError: rank < 1.
    """
    if not (isinstance(rank, int) and rank >= 1):
        raise ValueError(f"PowerSGD rank={rank!r}: must be an int >= 1")
    n = int(shape[0]) if len(shape) else 1
    m = math.prod(shape[1:]) if len(shape) > 1 else 1
    r = min(n, m, rank)
    return (n, m, r) if (n + m) * r * min_compression_rate < n * m else None


@dataclass(frozen=True, slots=True)
class CompressedSync:
    """One bucket's compressed all-reduce: the sizes of its sequential all-reduces and its codec work.

    Attributes:
        allreduce_bytes: bytes of each all-reduce, in the order the codec runs them (bf16: one; PowerSGD:
            uncompressed tensors, P, Q; none: one of the full bucket).
        flops: codec FLOPs. memory_bytes: codec memory traffic, bytes. kernels: codec kernel launches.
        dtype: the dtype the codec computes in (the gradients').
    """

    allreduce_bytes: tuple[int, ...]
    flops: int
    memory_bytes: int
    kernels: int
    dtype: torch.dtype

    @property
    def wire_bytes(self) -> int:
        """Bytes all-reduced in total (nccl-tests convention: the message size, not the bytes per link)."""
        return sum(self.allreduce_bytes)


def compressed_sync(kind: str, shapes: list[tuple[int, ...]] | tuple[tuple[int, ...], ...], itemsize: int,
                    rank: int = 4, dtype: torch.dtype = torch.float32) -> CompressedSync:
    """Wire bytes and codec work of all-reducing one bucket holding gradients of ``shapes`` (module docstring).

    Args:
        kind: one of :data:`COMPRESSIONS`.
        shapes: the bucket's gradient shapes (local shards).
        itemsize: bytes per gradient element (4 for fp32 main gradients).
        rank: PowerSGD rank r (ignored otherwise).
        dtype: gradient dtype (prices the codec's FLOPs).

    Raises:
        ValueError: unknown kind, itemsize < 1, rank < 1.
    """
    if kind not in COMPRESSIONS:
        raise ValueError(f"compression {kind!r}: use one of {COMPRESSIONS}")
    if not (isinstance(itemsize, int) and itemsize >= 1):
        raise ValueError(f"itemsize={itemsize!r}: must be bytes per element >= 1")
    numel = sum(math.prod(s) for s in shapes)
    if kind == "none" or numel == 0:
        return CompressedSync((numel * itemsize,), 0, 0, 0, dtype)
    if kind == "bf16":
        return CompressedSync((numel * 2,), 0, numel * _BF16_BYTES_PER_FP32_ELEMENT * itemsize // 4, _BF16_KERNELS,
                              dtype)
    plain = ps = qs = flops = compressed = matrices = 0
    for shape in shapes:
        split = powersgd_matrix(tuple(shape), rank)
        if split is None:
            plain += math.prod(shape)
            continue
        n, m, r = split
        ps, qs, matrices = ps + n * r, qs + m * r, matrices + 1
        compressed += n * m
        flops += 6 * n * m * r + 2 * (n + m) * r * r
    sizes = tuple(x * itemsize for x in (plain, ps, qs))
    return CompressedSync(sizes, flops, _POWERSGD_PASSES * compressed * itemsize,
                          _POWERSGD_KERNELS_PER_MATRIX * matrices + _POWERSGD_KERNELS_PER_BUCKET, dtype)


def compressed_sync_time_s(sync: CompressedSync, topo: MeshTopology, axes: tuple[str, ...] | str,
                           device: DeviceSpec) -> tuple[float, float]:
    """``(communication seconds, codec seconds)`` of one bucket's sync over mesh ``axes``: the sum of its
    all-reduces (``collective_time_s``, one after the other) and the codec's roofline time (module docstring).

    Raises:
        ValueError: unknown axis (from ``collective_time_s``).
    """
    comm_s = sum(collective_time_s("all_reduce", b, topo, axes) for b in sync.allreduce_bytes if b)
    if not (sync.flops or sync.memory_bytes):
        return comm_s, 0.0
    compute_s = sync.flops / device.achievable_flops_per_s(sync.dtype) if sync.flops else 0.0
    codec_s = max(compute_s, sync.memory_bytes / device.achievable_bytes_per_s) + sync.kernels * device.launch_overhead_s
    return comm_s, codec_s
