"""Verification samples of the rule table: small global inputs at odd sizes, per op.

A `Sample` is one call of an ATen op: positional and keyword arguments in which `T(...)` stands for a random
global tensor (materialised with a seeded generator by `materialize`). The rule harness (tests/rules)
runs every strategy of the op's rule on simulated per-rank shards of these tensors on meshes of 2, 3, 4
and 2x2 devices, forward and backward, against the op on the global tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.utils import _pytree as pytree

from .base import OpView


@dataclass(frozen=True)
class T:
    """A random global tensor: `kind` "normal" (N(0, 1)), "pos" (in [0.5, 2)), "int" (in [0, high)),
    "bool", "sign" (-1.0 or 1.0: the targets of margin losses), "sorted" (sorted along the last dim), "per_row" (bool,
    exactly `high` True elements per index of dim 0), "prob" (rows of a probability simplex along dim 1), "spd" (symmetric positive definite
    matrices in the last two dims: A A^T + n I), "wellcond" (matrices A + n I with A ~ N(0, 1), I of shape (m, n): full rank,
    distinct singular values), "pivots" (LAPACK pivots of no row exchange, 1..n), "perm" (int64 permutations of
    0 .. n-1 along the last dim), "offsets" (int64 group ends along the last dim: non-decreasing in [0, high], the
    last one `high`, an empty group included); `grad` False for an input the op does not differentiate (e.g.
    cross-entropy's class weights)."""

    shape: tuple[int, ...]
    kind: str = "normal"
    dtype: torch.dtype = torch.float32
    high: int = 2
    grad: bool = True

    def make(self, gen: torch.Generator) -> torch.Tensor:
        if self.kind == "perm":  # a permutation of 0 .. n-1 along the last dim (searchsorted's sorter)
            return torch.rand(self.shape, generator=gen).argsort(-1)
        if self.kind == "int":
            return torch.randint(0, self.high, self.shape, generator=gen, dtype=torch.int64)
        if self.kind == "offsets":  # cumulative group sizes ending at `high`, the second group empty
            ends = torch.randint(0, self.high + 1, self.shape, generator=gen).sort(-1).values
            ends[..., -1] = self.high
            ends[..., 1] = ends[..., 0]
            return ends
        if self.kind == "pivots":  # LAPACK pivots of no row exchange: 1, 2, ..., n along the last dim
            return torch.arange(1, self.shape[-1] + 1, dtype=self.dtype).expand(self.shape).contiguous()
        if self.kind == "bool":
            return torch.rand(self.shape, generator=gen) > 0.5
        if self.kind == "per_row":  # bool, exactly `high` True elements in each index of dim 0
            keys = torch.rand(self.shape[0], math.prod(self.shape[1:]), generator=gen)
            chosen = keys.argsort(1)[:, :self.high]
            return torch.zeros_like(keys, dtype=torch.bool).scatter_(1, chosen, True).reshape(self.shape)
        if self.kind == "sorted":
            return torch.randn(self.shape, generator=gen).sort(-1).values.to(self.dtype)
        if self.kind == "sign":
            return (torch.rand(self.shape, generator=gen) > 0.5).to(self.dtype) * 2 - 1
        if self.kind == "pos":
            return (0.5 + 1.5 * torch.rand(self.shape, generator=gen)).to(self.dtype)
        x = torch.randn(self.shape, generator=gen, dtype=self.dtype if self.dtype.is_complex else torch.float32)
        if self.kind in ("spd", "wellcond"):
            eye = max(self.shape[-2:]) * torch.eye(*self.shape[-2:])
            x = (x @ x.transpose(-2, -1) if self.kind == "spd" else x) + eye
        if self.kind == "prob":
            x = x.softmax(1)
        return x.to(self.dtype)


def t(*shape: int, dtype: torch.dtype = torch.float32) -> T:
    return T(tuple(shape), dtype=dtype)


def pos(*shape: int, grad: bool = True) -> T:
    return T(tuple(shape), "pos", grad=grad)


def ints(high: int, *shape: int) -> T:
    return T(tuple(shape), "int", torch.int64, high)


def mask(*shape: int) -> T:
    return T(tuple(shape), "bool", torch.bool)


@dataclass(frozen=True)
class Sample:
    """One call `op(*args, **kwargs)`; `T` leaves become tensors."""

    op: object
    args: tuple
    kwargs: dict = field(default_factory=dict)

    def grad_flags(self) -> list[bool]:
        """Per tensor argument (in materialised order): may it require grad?"""
        return [x.grad for x in pytree.tree_leaves((self.args, self.kwargs), is_leaf=lambda x: isinstance(x, T))
                if isinstance(x, T)]

    def materialize(self, seed: int) -> tuple[tuple, dict]:
        gen = torch.Generator().manual_seed(seed)
        return pytree.tree_map(lambda x: x.make(gen) if isinstance(x, T) else x, (self.args, self.kwargs),
                               is_leaf=lambda x: isinstance(x, T))

    def view(self, seed: int = 0) -> tuple[OpView, list[torch.Tensor]]:
        """The `OpView` the planner builds for this call (`strategies.op_view`: tensor arguments stand as fx
        placeholders, shapes and dtypes are those of the materialised inputs and of the op's outputs), and the
        global input tensors in `OpView.in_shapes` order. The op runs on clones (in-place ops mutate)."""
        args, kwargs = self.materialize(seed)
        graph, tensors = torch.fx.Graph(), []

        def placeholder(x):
            if not isinstance(x, torch.Tensor):
                return x
            tensors.append(x)
            return graph.placeholder(f"x{len(tensors) - 1}")

        fx_args, fx_kwargs = pytree.tree_map(placeholder, (args, kwargs))
        c_args, c_kwargs = pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
        value = self.op(*c_args, **c_kwargs)
        outs = [o for o in pytree.tree_leaves(value) if isinstance(o, torch.Tensor)]
        view = OpView(self.op, tuple(fx_args), dict(fx_kwargs), tuple(tuple(x.shape) for x in tensors),
                      tuple(tuple(o.shape) for o in outs), tuple(x.dtype for x in tensors),
                      tuple(o.dtype for o in outs))
        return view, tensors


def calls(op, *arg_lists, **kwargs) -> list[Sample]:
    """One Sample of `op` per argument tuple, with the same keyword arguments."""
    return [Sample(op, tuple(a), dict(kwargs)) for a in arg_lists]


# shapes reused by many ops (odd sizes so that uneven shards occur on every mesh)
UNARY = [(t(3, 5),), (t(2, 7, 3),)]
POS_UNARY = [(pos(3, 5),), (pos(2, 7, 3),)]
BINARY = [(t(3, 5), t(3, 5)), (t(2, 3, 5), t(5)), (t(4, 1), t(1, 6))]


def optional_tensors_passed(op: object, args: tuple, kwargs: dict, kind: type) -> frozenset[str]:
    """Schema names of the optional tensor arguments (`Tensor?`) of `op` that a call passes a tensor for, a
    tensor being a leaf of type `kind` (a sample's `T`, a graph's `torch.fx.Node`)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return frozenset()
    given = dict(zip((a.name for a in schema.arguments), args)) | dict(kwargs)
    return frozenset(a.name for a in schema.arguments
                     if str(a.type).startswith("Optional") and "Tensor" in str(a.type)
                     and any(isinstance(x, kind) for x in pytree.tree_leaves(given.get(a.name),
                                                                            is_leaf=lambda x: isinstance(x, kind))))
