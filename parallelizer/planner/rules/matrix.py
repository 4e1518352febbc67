"""Rules of batched matrix functions (torch.linalg: det, slogdet, inv, solve, cholesky, qr, svd, eigh,
lu_factor, matrix_exp, ...): each matrix of a batch is transformed on its own.

Every entry of a determinant, an inverse, a factor or an eigen-decomposition reads the whole matrix, so the
matrix dims (the trailing `core` dims of each input) are never sharded; the leading dims are the batch,
broadcast across the inputs like a pointwise op's and leading every output, and any of them may be sharded
(a rank factors its own matrices: a shard computes exactly what one device computes for those matrices).
Before these rows the ops ran replicated: under ddp / fsdp the batch was gathered onto every rank for them.
"""
from __future__ import annotations

from collections.abc import Callable

from torch.distributed.tensor.placement_types import Shard

from .base import P, R, AxisOption, OpView, replicate, same_dims

Cores = Callable[[OpView], tuple[int, ...]]


def batched(cores: Cores, linear: int | None = None) -> Callable[[OpView], list[AxisOption]]:
    """Rule of a function applied to each matrix of a batch: `cores(v)` gives, per tensor input, how many of
    its trailing dims are the matrix (2) or vector (1) it reads whole. Shard a batch dim on every input that
    has it at the batch's size (Replicate where it is broadcast, e.g. one A shared by a batch of right-hand
    sides); every output must lead with the batch dims (else replicated only). `linear`: the input in which
    the op is linear (solve's right-hand side: X = A^-1 B), through which Partial passes with the other
    inputs Replicate (DESIGN.md rule 9); only for single-output ops (an `info` or pivots output is not linear)."""
    def rule(v: OpView) -> list[AxisOption]:
        core = cores(v)
        prefixes = tuple(s[:len(s) - c] for s, c in zip(v.in_shapes, core))
        nb = max((len(p) for p in prefixes), default=0)
        batch = next((p for p in prefixes if len(p) == nb), ())
        if nb == 0 or any(len(o) < nb or tuple(o[:nb]) != tuple(batch) for o in v.out_shapes):
            return [replicate(v)]
        opts = [replicate(v)] + [AxisOption(same_dims(v, d, prefixes, batch), Shard(d)) for d in range(nb) if batch[d] > 1]
        if linear is not None and len(v.out_shapes) == 1 and v.out_is_float:
            opts.append(AxisOption(tuple(P if k == linear else R for k in range(v.n_in)), P))
        return opts
    rule.__name__ = f"batched({cores.__name__}{', linear in input %d' % linear if linear is not None else ''})"
    rule.__doc__ = batched.__doc__
    return rule


def matrices(v: OpView) -> tuple[int, ...]:
    """Every tensor input is a batch of matrices (det, inv, cholesky, qr, svd, eigh, lu_factor, matrix_exp,
    solve_triangular, cholesky_solve, ...)."""
    return (2,) * v.n_in


def solve_rhs(v: OpView) -> tuple[int, ...]:
    """linalg_solve(A (*, n, n), B, left): B is a batch of vectors (*, n) when it is 1-D or has A's shape
    without its last dim (torch's `linalg_solve_is_vector_rhs`), else of matrices."""
    a, b = v.in_shapes[0], v.in_shapes[1]
    vector = len(b) == 1 or (len(b) == len(a) - 1 and tuple(b) == tuple(a[:-1]))
    return (2, 1 if vector else 2)


def lu_solve(v: OpView) -> tuple[int, ...]:
    """linalg_lu_solve(LU (*, n, n), pivots (*, n), B (*, n, k))."""
    return (2, 1, 2)


def householder(v: OpView) -> tuple[int, ...]:
    """linalg_householder_product(A (*, m, n), tau (*, k))."""
    return (2, 1)


def matrix_dims_last(v: OpView) -> tuple[int, ...]:
    """A batch of matrices followed by optional tensor arguments that are per-batch scalars broadcast to
    the batch (pinv / matrix_rank's atol, rtol: shape (*,) or ())."""
    return (2,) + (0,) * (v.n_in - 1)
