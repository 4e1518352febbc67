"""Codecs for the values a pipeline stage sends to the next one (activations forward, their gradients
backward): what goes on the wire, how many bytes that is, and the autograd-aware encode / decode pair.

A codec wraps one value crossing one stage boundary. The sending stage calls `encode(x)` at the end of its
forward and hands the WIRE tensor to torch.distributed.pipelining's send; the receiving stage calls
`decode(wire)` at the start of its forward. Autograd carries the gradient back through the same pair, so the
activation gradient is compressed on the way back too: the receiver's `decode` backward encodes the
gradient (it travels in the wire tensor's shape), the sender's `encode` backward decodes it. torch's stage
pre-allocates its receive buffers (activations and gradients) from example tensors, so every codec has a
fixed `wire_shape` / `wire_dtype` for a given value shape (`runtime.pipeline` builds the examples from them).

Codecs (`KINDS`):

- "int8": absmax quantisation to int8 with one float32 scale per block of `block` consecutive elements
  (the flattened value, zero-padded to a multiple of `block`): scale_b = max|x_i| / 127 over block b,
  q_i = round(x_i / scale_b) in [-127, 127] (round half to even), x^_i = q_i * scale_b, so
  |x_i - x^_i| <= scale_b / 2 = max_b |x| / 254 (exact in real arithmetic; float32 rounding of the
  division and product adds at most a few ulp of max_b |x|). The int8 codes are bit-packed into float32 words
  (4 codes per word) followed by the scales, so the wire is ONE float32 tensor whose gradient torch's stage
  can carry: (n_pad / 4 + n_pad / block) words for n elements (n_pad = n rounded up to `block`), i.e.
  (1 + 4 / block) bytes per element instead of 4 (fp32): 0.266 of the bytes for block 64. The wire words are
  bit patterns, not numbers (some are NaN patterns): only send/recv may touch them. Block-wise absmax
  scaling as in Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (ICLR 2022), Sec. 2.
- "lowrank": projection onto a fixed r-dimensional subspace of the LAST dim (size d) shared by both stages:
  U (d, r) with orthonormal columns, drawn from a seeded Gaussian (QR of a d x r normal matrix;
  `lowrank_basis`), the same on sender and receiver without communication. Wire = x U, shape (..., r);
  x^ = (x U) U^T = the orthogonal projection of x onto span(U) (exact when x lies in the subspace).
  Backward: the receiver's gradient g becomes g U (r per row) and the sender's gradient (g U) U^T, i.e. the
  activation gradient is projected onto the same subspace. Bytes: r / d of the uncompressed value.

How "lowrank" relates to Protocol Models (Ramasinghe et al., "Protocol Models: Scaling Decentralized
Training with Communication-Efficient Model Parallelism", arXiv 2506.01260): the paper also sends
activations and activation gradients as coefficients in a predefined low-dimensional subspace shared by the
stages, reaching up to 99% compression (its abstract: "we predefine a low-dimensional subspace to confine the
activations and gradients, allowing full reconstruction in subsequent layers"). What it adds and we do NOT
implement: it makes the projection (nearly) lossless by constraining the model, using the transformer's
recursive residual structure - in our reading, the weights whose outputs enter the residual stream are kept
in that subspace and the high-rank token embeddings are handled apart from it (rebuilt on each stage from
the token ids rather than sent). We did not reproduce its experiments or its subspace choice beyond that
reading. We project an UNCONSTRAINED model's boundary
values onto a fixed random subspace, so the projection drops everything outside it: the deviation is
measured (benchmarks/bench_convergence.py) rather than zero, and the planner's "auto" never picks lowrank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

KINDS = ("int8", "lowrank")
INT8_BLOCK = 64  # elements per scale: 4 / 64 = 6% scale overhead; Dettmers et al. 2022 use blocks of 2048
_QMAX = 127.0


def compressible(shape: tuple[int, ...], dtype: torch.dtype, kind: str, rank: int) -> bool:
    """Whether `kind` applies to a boundary value of this (local) shape and dtype: floating point, at least
    1-D, and for "lowrank" a last dim larger than the rank (else nothing is saved). The planner prices and the
    runtime compresses exactly the values this accepts."""
    if not dtype.is_floating_point or not shape or math.prod(shape) == 0:
        return False
    return kind == "int8" or shape[-1] > rank


def wire_bytes(shape: tuple[int, ...], dtype: torch.dtype, kind: str | None, rank: int,
               block: int = INT8_BLOCK) -> int:
    """Bytes the wire tensor of a value of `shape` / `dtype` occupies under codec `kind` (None or a value
    `compressible` rejects: the value itself). Closed forms of the module docstring."""
    n = math.prod(shape)
    size = torch.empty((), dtype=dtype).element_size() * n
    if kind is None or not compressible(shape, dtype, kind, rank):
        return size
    if kind == "int8":
        padded = -(-n // block) * block
        return padded + 4 * (padded // block)
    return size // shape[-1] * rank


@dataclass(frozen=True, slots=True)
class BoundaryCodec:
    """The codec of one value crossing one stage boundary (module docstring).

    Attributes:
        kind: "int8" or "lowrank".
        shape / dtype: the value's LOCAL shape and dtype on this rank (what the stage program produces).
        rank: subspace dimension r ("lowrank").
        seed: seeds the lowrank basis; sender and receiver must use the same (`runtime.pipeline` derives it
            from the boundary and value index).
        block: elements per int8 scale.
    Raises:
        ValueError: an unknown kind, or a value `compressible` rejects (names shape, dtype, kind, rank).
    """

    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    rank: int = 8
    seed: int = 0
    block: int = INT8_BLOCK

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"boundary codec {self.kind!r}: use one of {KINDS}")
        if self.block % 4 or self.block < 4 or self.rank < 1:
            raise ValueError(f"BoundaryCodec(block={self.block}, rank={self.rank}): block must be a positive "
                             "multiple of 4 (int8 codes are packed 4 per float32 word) and rank >= 1")
        if not compressible(self.shape, self.dtype, self.kind, self.rank):
            raise ValueError(f"boundary codec {self.kind} (rank {self.rank}) cannot compress a value of shape "
                             f"{self.shape} and dtype {self.dtype}: it needs a floating-point value of >= 1 dim"
                             + (f" whose last dim exceeds the rank {self.rank}" if self.kind == "lowrank" else ""))

    @property
    def wire_shape(self) -> tuple[int, ...]:
        if self.kind == "lowrank":
            return (*self.shape[:-1], self.rank)
        padded = -(-math.prod(self.shape) // self.block) * self.block
        return (padded // 4 + padded // self.block,)

    @property
    def wire_dtype(self) -> torch.dtype:
        return torch.float32 if self.kind == "int8" else self.dtype

    @property
    def fidelity(self) -> str:
        """"8-bit codes, 1 fp32 scale per 64 elements" / "rank 8 of 64": what the codec keeps."""
        if self.kind == "int8":
            return f"8-bit codes, 1 fp32 scale per {self.block} elements"
        return f"rank {self.rank} of {self.shape[-1]}"

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x (`shape`, `dtype`) -> wire (`wire_shape`, `wire_dtype`); differentiable (backward decodes)."""
        if self.kind == "lowrank":
            return x @ lowrank_basis(self.shape[-1], self.rank, self.seed, x.dtype)
        return _Int8Encode.apply(x, self)

    def decode(self, wire: torch.Tensor) -> torch.Tensor:
        """wire -> x^ (`shape`, `dtype`); differentiable (backward encodes the gradient)."""
        if self.kind == "lowrank":
            return wire @ lowrank_basis(self.shape[-1], self.rank, self.seed, wire.dtype).T
        return _Int8Decode.apply(wire, self)

    def round_trip(self, x: torch.Tensor) -> torch.Tensor:
        """decode(encode(x)) without autograd: what the receiver sees."""
        with torch.no_grad():
            return self.decode(self.encode(x))


def lowrank_basis(d: int, r: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U (d, r) with orthonormal columns: Q of the reduced QR of a seeded standard normal (d, r) matrix drawn
    in float64 (a random point of the Grassmannian, deterministic per (d, r, seed)), cast to `dtype`."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, r, generator=g, dtype=torch.float64))
    return q.to(dtype)


def int8_pack(x: torch.Tensor, block: int) -> torch.Tensor:
    """Any-shape floating tensor -> 1-D float32 wire words: bit-packed int8 codes, then the per-block scales
    (module docstring). An all-zero block has scale 0 and codes 0."""
    flat = x.detach().reshape(-1).to(torch.float32)
    padded = -(-flat.numel() // block) * block
    blocks = torch.nn.functional.pad(flat, (0, padded - flat.numel())).view(-1, block)
    scale = blocks.abs().amax(dim=1, keepdim=True) / _QMAX  # (n_blocks, 1)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(blocks / safe).clamp_(-_QMAX, _QMAX).to(torch.int8)
    return torch.cat([codes.reshape(-1).view(torch.float32), scale.reshape(-1)])


def int8_unpack(wire: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, block: int) -> torch.Tensor:
    """Inverse of `int8_pack` up to the quantisation error: 1-D wire words -> tensor of `shape` / `dtype`."""
    n = math.prod(shape)
    padded = -(-n // block) * block
    words = wire.detach().reshape(-1)
    codes = words[:padded // 4].contiguous().view(torch.int8).view(-1, block)
    scale = words[padded // 4:].view(-1, 1)
    return (codes.to(torch.float32) * scale).reshape(-1)[:n].reshape(shape).to(dtype)


class _Int8Encode(torch.autograd.Function):
    """Sender side: forward packs the activation, backward unpacks the gradient the receiver packed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, codec: BoundaryCodec) -> torch.Tensor:
        ctx.codec = codec
        return int8_pack(x, codec.block)

    @staticmethod
    def backward(ctx, wire_grad: torch.Tensor):
        c = ctx.codec
        return int8_unpack(wire_grad, c.shape, c.dtype, c.block), None


class _Int8Decode(torch.autograd.Function):
    """Receiver side: forward unpacks the activation, backward packs its gradient for the way back."""

    @staticmethod
    def forward(ctx, wire: torch.Tensor, codec: BoundaryCodec) -> torch.Tensor:
        ctx.codec = codec
        return int8_unpack(wire, codec.shape, codec.dtype, codec.block)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return int8_pack(grad, ctx.codec.block), None
