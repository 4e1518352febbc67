"""Rank bodies for tests/distributed: every collective checked against plain single-process torch.

Each check builds the GLOBAL tensors identically on every rank (fixed seeds), computes the reference
values and gradients with plain torch autograd on those full tensors, runs the collective on this rank's
local piece, and compares the local value and gradient with the matching piece of the reference.

Loss convention (see parallelizer.rewriter.collectives): ranks holding different data add their local
losses; ranks holding the same replicated data compute the same loss once.

Functions here run in spawned processes, so they are module-level and return plain picklable values.
"""
from __future__ import annotations

import os
import time
import traceback
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.fx

from parallelizer.core.layout import chunk_range
from parallelizer.rewriter import collectives as C
from parallelizer.rewriter import grad_sync
from parallelizer.runtime import DistributedError, create_groups

Check = Callable[[list[int]], None]


def _full(shape: Sequence[int], seed: int) -> torch.Tensor:
    """A global tensor, identical on every rank: float64 normal noise from `seed`."""
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _piece(t: torch.Tensor, dim: int, index: int, n: int) -> torch.Tensor:
    """Chunk `index` of `n` of `t` along `dim` (the reference's view of one rank's shard; torch.chunk's
    split, uneven and empty chunks included)."""
    return t.narrow(dim, *chunk_range(t.shape[dim], n, index))


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10, msg=lambda m: f"{what}: {m}")


def _where(g: list[int]) -> tuple[int, int]:
    """(n, i): group size and this rank's index in `g`."""
    return len(g), C.group_index(g)


# ------------------------------------------------------------------------------- one check each


def check_all_gather(g: list[int]) -> None:
    n, i = _where(g)
    for dim in (0, -1):
        X, W = _full((2 * n, 3, 2 * n), 1), _full((2 * n, 3, 2 * n), 2)
        ref = _leaf(X)
        (ref.sin() * W).sum().backward()
        x = _leaf(_piece(X, dim, i, n))                     # (.., S/n, ..)
        y = C.all_gather(x, dim, g)                         # (.., S, ..), replicated
        (y.sin() * W).sum().backward()                      # same replicated loss on every rank
        _close(y, X, f"all_gather dim={dim} value")
        _close(x.grad, _piece(ref.grad, dim, i, n), f"all_gather dim={dim} grad")


def check_all_gather_rs(g: list[int]) -> None:
    n, i = _where(g)
    X = _full((2 * n, 2 * n, 3), 3)
    Ws = [_full((2 * n, 2 * n, 3), 100 + r) for r in range(n)]  # each rank's own data
    ref = _leaf(X)
    sum((ref.sin() * W).sum() for W in Ws).backward()
    x = _leaf(_piece(X, 1, i, n))
    y = C.all_gather_rs(x, 1, g)
    (y.sin() * Ws[i]).sum().backward()                      # partial loss of this rank
    _close(y, X, "all_gather_rs value")
    _close(x.grad, _piece(ref.grad, 1, i, n), "all_gather_rs grad")


def check_reduce_scatter(g: list[int]) -> None:
    n, i = _where(g)
    for dim in (0, 2):
        Xs = [_full((2 * n, 3, 2 * n), 200 + r) for r in range(n)]   # Partial: the value is their sum
        W = _full((2 * n, 3, 2 * n), 4)
        refs = [_leaf(t) for t in Xs]
        (sum(refs).sin() * W).sum().backward()
        x = _leaf(Xs[i])
        y = C.reduce_scatter(x, dim, g)                      # (.., S/n, ..)
        (y.sin() * _piece(W, dim, i, n)).sum().backward()    # shard of the loss
        _close(y, _piece(sum(Xs), dim, i, n), f"reduce_scatter dim={dim} value")
        _close(x.grad, refs[i].grad, f"reduce_scatter dim={dim} grad")


def check_all_reduce(g: list[int]) -> None:
    n, i = _where(g)
    by_name = C.find_group(g).group_name
    for group in (g, by_name):                              # ranks list and group-name forms
        Xs = [_full((4, 3), 300 + r) for r in range(n)]
        W = _full((4, 3), 5)
        refs = [_leaf(t) for t in Xs]
        (sum(refs).sin() * W).sum().backward()
        x = _leaf(Xs[i])
        y = C.all_reduce(x, group)
        (y.sin() * W).sum().backward()                       # replicated loss, counted once
        _close(y, sum(Xs), f"all_reduce({type(group).__name__}) value")
        _close(x.grad, refs[i].grad, f"all_reduce({type(group).__name__}) grad")


def check_grad_all_reduce(g: list[int]) -> None:
    n, i = _where(g)
    P = _full((3, 4), 6)                                     # replicated parameter
    Ds = [_full((2, 3), 400 + r) for r in range(n)]          # batch shards
    ref = _leaf(P)
    sum((D @ ref).tanh().sum() for D in Ds).backward()
    p = _leaf(P)
    y = C.grad_all_reduce(p, g)
    (Ds[i] @ y).tanh().sum().backward()
    _close(y, P, "grad_all_reduce value")
    _close(p.grad, ref.grad, "grad_all_reduce grad")


def check_grad_all_reduce_bucketed(g: list[int]) -> None:
    """DDP-style bucketed async sync: equal to the reference for tied uses, a parameter that also has an
    unsynced (replicated) use, several bucket sizes, two accumulated backward passes, and autograd.grad."""
    n, i = _where(g)
    Ps = [_full(shape, 60 + k) for k, shape in enumerate([(3, 4), (4, 4), (4, 2)])]
    Ds = [_full((2, 3), 400 + r) for r in range(n)]          # batch shards

    def loss(ps, sync, d):
        a, b, c = (sync(p) for p in ps)
        h = (d @ a).tanh() @ sync(ps[1])                       # b used twice on the batch shard (tied)
        return (h @ b @ c).sum() + (ps[0] ** 2).sum()          # + a replicated term on a (counted once)

    refs = [_leaf(P) for P in Ps]
    (sum(loss(refs, lambda p: p, D) - (refs[0] ** 2).sum() for D in Ds) + (refs[0] ** 2).sum()).backward()
    for bucket_bytes in (1, 100, 2**20):
        ps = [_leaf(P) for P in Ps]
        for _ in range(2):                                     # gradients accumulate over two passes
            loss(ps, lambda p: grad_sync.grad_all_reduce_bucketed(p, g, bucket_bytes), Ds[i]).backward()
        for p, ref, name in zip(ps, refs, "abc"):
            _close(p.grad, 2 * ref.grad, f"bucketed({bucket_bytes} B) grad of {name} after two passes")
        broken = [_leaf(P) for P in Ps]                        # a backward that raises half-way ...
        data = _raise_in_backward(Ds[i])                        # ... at the first op of forward: last in backward
        try:
            loss(broken, lambda p: grad_sync.grad_all_reduce_bucketed(p, g, bucket_bytes), data).backward()
        except RuntimeError:
            pass
        if not grad_sync._PASSES:
            raise AssertionError("the raising backward left no pending pass: the check does not test the cleanup")
        held = [p.grad for p in ps]                            # a caller keeps the gradients, then zeroes
        for p in ps:
            p.grad = None
        loss(ps, lambda p: grad_sync.grad_all_reduce_bucketed(p, g, bucket_bytes), Ds[i]).backward()
        if grad_sync._PASSES:
            raise AssertionError(f"stale backward passes left behind: {list(grad_sync._PASSES)}")
        for p, kept, ref, name in zip(ps, held, refs, "abc"):
            _close(kept, 2 * ref.grad, f"bucketed({bucket_bytes} B): a kept gradient of {name} was overwritten")
            _close(p.grad, ref.grad, f"bucketed({bucket_bytes} B) grad of {name} after zero_grad")
            p.grad = 2 * ref.grad                              # as after the two passes, for the checks below
        hooked = [_leaf(P) for P in Ps]                        # hooks see the summed gradient (synchronous path)
        seen = {}
        hooked[1].register_hook(lambda grad: seen.update(b=grad.clone()))
        hooked[2].register_post_accumulate_grad_hook(lambda p: seen.update(c=p.grad.detach().clone()))
        loss(hooked, lambda p: grad_sync.grad_all_reduce_bucketed(p, g, bucket_bytes), Ds[i]).backward()
        for p, ref, name in zip(hooked, refs, "abc"):
            _close(p.grad, ref.grad, f"bucketed({bucket_bytes} B) grad of {name} with hooks")
        graphed = [_leaf(P) for P in Ps]
        with warnings.catch_warnings():  # torch warns that create_graph=True makes .grad reference the graph
            warnings.simplefilter("ignore", UserWarning)
            loss(graphed, lambda p: grad_sync.grad_all_reduce_bucketed(p, g, bucket_bytes), Ds[i]).backward(
                create_graph=True)                             # double-backward-ready gradients: synchronous
        for p, ref, name in zip(graphed, refs, "abc"):
            _close(p.grad.detach(), ref.grad, f"bucketed({bucket_bytes} B) grad of {name} with create_graph")
        _close(seen["b"], refs[1].grad, f"bucketed({bucket_bytes} B): gradient seen by a tensor hook")
        _close(seen["c"], refs[2].grad, f"bucketed({bucket_bytes} B): gradient seen by a post-accumulate hook")
        grads = torch.autograd.grad(loss(ps, lambda p: grad_sync.grad_all_reduce_bucketed(p, g, bucket_bytes),
                                         Ds[i]), ps)
        for p, grad, ref, name in zip(ps, grads, refs, "abc"):
            _close(grad, ref.grad, f"bucketed({bucket_bytes} B) autograd.grad of {name}")
            _close(p.grad, 2 * ref.grad, f"bucketed({bucket_bytes} B): autograd.grad left .grad of {name} alone")


def _raise_in_backward(x: torch.Tensor) -> torch.Tensor:
    """A leaf copy of `x` whose gradient hook raises RuntimeError (when backward reaches it)."""
    leaf = _leaf(x)

    def fail(grad):
        raise RuntimeError("deliberate failure in backward")

    leaf.register_hook(fail)
    return leaf


def check_all_to_all(g: list[int]) -> None:
    n, i = _where(g)
    for src, dst in ((0, 2), (2, 0), (-1, 1)):
        shape = (2 * n, 2 * n, 2 * n)
        X, W = _full(shape, 7), _full(shape, 8)
        ref = _leaf(X)
        (ref.sin() * W).sum().backward()
        x = _leaf(_piece(X, src, i, n))                      # Shard(src)
        y = C.all_to_all(x, src, dst, g)                     # Shard(dst)
        (y.sin() * _piece(W, dst, i, n)).sum().backward()
        _close(y, _piece(X, dst, i, n), f"all_to_all {src}->{dst} value")
        _close(x.grad, _piece(ref.grad, src, i, n), f"all_to_all {src}->{dst} grad")


def check_local_slice(g: list[int]) -> None:
    n, i = _where(g)
    for dim in (1, -1):
        X, W = _full((3, 2 * n, 2 * n), 9), _full((3, 2 * n, 2 * n), 10)
        ref = _leaf(X)
        (ref.sin() * W).sum().backward()
        x = _leaf(X)                                         # replicated
        y = C.local_slice(x, dim, g)
        (y.sin() * _piece(W, dim, i, n)).sum().backward()
        _close(y, _piece(X, dim, i, n), f"local_slice dim={dim} value")
        _close(x.grad, ref.grad, f"local_slice dim={dim} grad")


def check_uneven(g: list[int]) -> None:
    """Every reshaping collective on dims that do not divide (2n + 1 elements: chunks of 3, ... shorter last)
    and on dims smaller than the group (n - 1 elements: one rank holds an empty chunk), forward and
    backward, against the single-process reference."""
    n, i = _where(g)
    for size in (2 * n + 1, max(n - 1, 1)):
        X, W = _full((size, 3, size), 14), _full((size, 3, size), 15)
        ref = _leaf(X)
        (ref.sin() * W).sum().backward()
        x = _leaf(_piece(X, 0, i, n))
        y = C.all_gather(x, 0, g, size)                                  # Shard(0) -> R
        (y.sin() * W).sum().backward()
        _close(y, X, f"uneven all_gather {size} value")
        _close(x.grad, _piece(ref.grad, 0, i, n), f"uneven all_gather {size} grad")
        x = _leaf(X)
        y = C.local_slice(x, 2, g)                                       # R -> Shard(2)
        (y.sin() * _piece(W, 2, i, n)).sum().backward()
        _close(y, _piece(X, 2, i, n), f"uneven local_slice {size} value")
        _close(x.grad, ref.grad, f"uneven local_slice {size} grad")
        x = _leaf(_piece(X, 0, i, n))
        y = C.all_to_all(x, 0, 2, g, size)                               # Shard(0) -> Shard(2)
        (y.sin() * _piece(W, 2, i, n)).sum().backward()
        _close(y, _piece(X, 2, i, n), f"uneven all_to_all {size} value")
        _close(x.grad, _piece(ref.grad, 0, i, n), f"uneven all_to_all {size} grad")
        Xs = [_full((size, 3), 500 + r) for r in range(n)]              # Partial -> Shard(0)
        refs = [_leaf(t) for t in Xs]
        (sum(refs).sin() * W[:, :, 0]).sum().backward()
        x = _leaf(Xs[i])
        y = C.reduce_scatter(x, 0, g)
        (y.sin() * _piece(W[:, :, 0], 0, i, n)).sum().backward()
        _close(y, _piece(sum(Xs), 0, i, n), f"uneven reduce_scatter {size} value")
        _close(x.grad, refs[i].grad, f"uneven reduce_scatter {size} grad")
        src = [chunk_range(size, n, j)[1] * 3 for j in range(n)]          # rows (size/n) x 3 -> chunks of 3 size
        dst = [chunk_range(3 * size, n, j)[1] for j in range(n)]
        flat = X[:, :, 0].reshape(-1)                                     # (3 size,) = rows of X[:, :, 0]
        ref = _leaf(flat)
        (ref.sin() * W[:, :, -1].reshape(-1)).sum().backward()
        x = _leaf(_piece(X[:, :, 0], 0, i, n).reshape(-1))
        y = C.rechunk(x, 0, g, src, dst)
        (y.sin() * _piece(W[:, :, -1].reshape(-1), 0, i, n)).sum().backward()
        _close(y, _piece(flat, 0, i, n), f"rechunk {size} value")
        _close(x.grad, ref.grad.narrow(0, sum(src[:i]), src[i]), f"rechunk {size} grad")
        Ws = [_full((size, 3, size), 600 + r) for r in range(n)]         # ZeRO-3 gather: partial grads
        ref = _leaf(X)
        sum((ref.sin() * w).sum() for w in Ws).backward()
        x = _leaf(_piece(X, 2, i, n))
        y = C.all_gather_rs(x, 2, g, size)
        (y.sin() * Ws[i]).sum().backward()
        _close(x.grad, _piece(ref.grad, 2, i, n), f"uneven all_gather_rs {size} grad")



def _cfull(shape: Sequence[int], seed: int) -> torch.Tensor:
    """A global complex128 tensor, identical on every rank (real and imaginary parts from two seeds)."""
    return torch.complex(_full(shape, seed), _full(shape, seed + 1000))


def check_complex(g: list[int]) -> None:
    """Every step on complex tensors (an FFT convolution's spectrum, a complex rotary's queries: round 12,
    S4D on tp=2 with random plan costs), even and uneven, forward and backward, against the single-process
    reference. gloo's kernels take no complex dtype: every rank raised "Invalid scalar type" before."""
    n, i = _where(g)
    for size in (2 * n, 2 * n + 1):
        X, W = _cfull((size, 3, size), 16), _cfull((size, 3, size), 17)
        ref = _leaf(X)
        (ref.sin() * W).real.sum().backward()
        for name, src, dst, call in (
                ("all_gather", 0, None, lambda x: C.all_gather(x, 0, g, size)),
                ("all_to_all", 0, 2, lambda x: C.all_to_all(x, 0, 2, g, size)),
                ("local_slice", None, 2, lambda x: C.local_slice(x, 2, g))):
            x = _leaf(X if src is None else _piece(X, src, i, n))
            y = call(x)
            w = W if dst is None else _piece(W, dst, i, n)
            (y.sin() * w).real.sum().backward()
            _close(y, X if dst is None else _piece(X, dst, i, n), f"complex {name} {size} value")
            _close(x.grad, ref.grad if src is None else _piece(ref.grad, src, i, n), f"complex {name} {size} grad")
        Ws = [_cfull((size, 3, size), 700 + r) for r in range(n)]          # ZeRO-3 gather: partial grads
        ref_rs = _leaf(X)
        sum((ref_rs.sin() * w).real.sum() for w in Ws).backward()
        x = _leaf(_piece(X, 2, i, n))
        (C.all_gather_rs(x, 2, g, size).sin() * Ws[i]).real.sum().backward()
        _close(x.grad, _piece(ref_rs.grad, 2, i, n), f"complex all_gather_rs {size} grad")
        Xs = [_cfull((size, 3), 800 + r) for r in range(n)]                 # Partial -> Shard(0) / R
        for name, call, piece in (("reduce_scatter", lambda x: C.reduce_scatter(x, 0, g), lambda t: _piece(t, 0, i, n)),
                                  ("all_reduce", lambda x: C.all_reduce(x, g), lambda t: t)):
            refs = [_leaf(t) for t in Xs]
            (sum(refs).sin() * W[:, :, 0]).real.sum().backward()
            x = _leaf(Xs[i])
            y = call(x)
            (y.sin() * piece(W[:, :, 0])).real.sum().backward()
            _close(y, piece(sum(Xs)), f"complex {name} {size} value")
            _close(x.grad, refs[i].grad, f"complex {name} {size} grad")
        Ds = [_cfull((2, size), 900 + r) for r in range(n)]                  # R used on batch shards
        P = X[:, 0, :]
        ref = _leaf(P)
        sum((D @ ref).tanh().real.sum() for D in Ds).backward()
        p = _leaf(P)
        (Ds[i] @ C.grad_all_reduce(p, g)).tanh().real.sum().backward()
        _close(p.grad, ref.grad, f"complex grad_all_reduce {size} grad")


def check_dtypes_gloo_lacks(g: list[int]) -> None:
    """Moves and sums of dtypes gloo's kernels lack (int16, uint16/32/64, float8): bitwise moves, sums as
    one device adds in that dtype (integers wrap; float8 rounded once). Every rank raised "Invalid scalar
    type" before."""
    n, i = _where(g)
    for dtype in (torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn):
        for size in (2 * n, 2 * n + 1):
            base = _full((size, 3, size), 18) * 40
            X = base.to(dtype) if dtype.is_floating_point else base.round().to(torch.int64).to(dtype)
            bits = (lambda t: t.view(torch.uint8)) if dtype.itemsize == 1 else (lambda t: t.to(torch.int64))
            same = lambda a, b, what: torch.equal(bits(a), bits(b)) or _fail(what)  # noqa: E731
            same(C.all_gather(_piece(X, 0, i, n), 0, g, size), X, f"{dtype} all_gather {size}")
            same(C.all_to_all(_piece(X, 0, i, n), 0, 2, g, size), _piece(X, 2, i, n), f"{dtype} all_to_all {size}")
            parts = [(_full((size, 3), 1000 + r) * 40) for r in range(n)]
            if dtype.is_floating_point:
                Xs = [p.to(dtype) for p in parts]
                total = sum(t.to(torch.float32) for t in Xs).to(dtype)
            else:
                Xs = [p.round().to(torch.int64).to(dtype) for p in parts]
                total = sum(t.to(torch.int64) for t in Xs).to(dtype)
            same(C.all_reduce(Xs[i], g), total, f"{dtype} all_reduce {size}")
            same(C.reduce_scatter(Xs[i], 0, g), _piece(total, 0, i, n), f"{dtype} reduce_scatter {size}")


def _fail(what: str) -> bool:
    raise AssertionError(f"{what}: not bitwise equal to the single-process reference")

class MegatronMLP(torch.nn.Module):
    """Tensor-parallel MLP on local shards: f -> x @ W1[:, shard] -> relu -> @ W2[shard, :] -> g."""

    def __init__(self, ranks: list[int]) -> None:
        super().__init__()
        self.ranks = ranks

    def forward(self, x, w1, w2):                          # x (B, C), w1 (C, H/n), w2 (H/n, C)
        h = torch.relu(C.grad_all_reduce(x, self.ranks) @ w1)   # (B, H/n)
        return C.all_reduce(h @ w2, self.ranks)                 # (B, C), replicated


def check_megatron_fx(g: list[int]) -> None:
    """f/g composition, run eagerly and as a symbolically traced GraphModule: both match the reference."""
    n, i = _where(g)
    X, W1, W2 = _full((4, 3), 11), _full((3, 2 * n), 12), _full((2 * n, 3), 13)
    refs = [_leaf(t) for t in (X, W1, W2)]
    (torch.relu(refs[0] @ refs[1]) @ refs[2]).sin().sum().backward()
    model = MegatronMLP(g)
    gm = torch.fx.symbolic_trace(model)
    for name, run in (("eager", model), ("fx", gm)):
        x, w1, w2 = _leaf(X), _leaf(_piece(W1, 1, i, n)), _leaf(_piece(W2, 0, i, n))
        y = run(x, w1, w2)
        y.sin().sum().backward()
        _close(y, torch.relu(X @ W1) @ W2, f"megatron {name} value")
        _close(x.grad, refs[0].grad, f"megatron {name} grad x")
        _close(w1.grad, _piece(refs[1].grad, 1, i, n), f"megatron {name} grad w1")
        _close(w2.grad, _piece(refs[2].grad, 0, i, n), f"megatron {name} grad w2")
    code = gm.code
    for op in ("collectives_grad_all_reduce", "collectives_all_reduce"):
        if op not in code:
            raise AssertionError(f"{op} missing from gm.code:\n{code}")


def check_hand_built_graph(g: list[int]) -> None:
    """A GraphModule built node by node (as the rewriter does): local_slice -> all_gather round trip."""
    n, i = _where(g)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    s = graph.call_function(C.local_slice, (x, 0, g))
    s2 = graph.call_function(torch.mul, (s, 2.0))
    graph.output(graph.call_function(C.all_gather, (s2, 0, g)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    gm.recompile()
    X = _full((2 * n, 3), 14)
    x = _leaf(X)
    y = gm(x)
    y.sum().backward()
    _close(y, 2 * X, "hand-built graph value")
    _close(x.grad, torch.full_like(X, 2.0), "hand-built graph grad")


CHECKS: list[Check] = [
    check_all_gather, check_all_gather_rs, check_reduce_scatter, check_all_reduce, check_grad_all_reduce,
    check_grad_all_reduce_bucketed, check_all_to_all, check_local_slice, check_megatron_fx, check_hand_built_graph,
    check_uneven, check_complex, check_dtypes_gloo_lacks,
]


def check_errors(world: list[int]) -> None:
    """Typed errors on bad input, raised before any communication (so every rank can run them)."""
    me, n = dist.get_rank(), len(world)
    expectations = [
        (lambda: C.all_gather(torch.zeros(7, 2), 0, world, 4 * n + 1), ValueError,  # chunks of 5 at most
         ["chunk", f"of {4 * n + 1} over group {world}"]),
        (lambda: C.local_slice(torch.zeros(2, 3), 2, world), ValueError, ["dim 2", "(2, 3)"]),
        (lambda: C.all_to_all(torch.zeros(2, 2), 0, 0, world), ValueError, ["src_dim and dst_dim"]),
        (lambda: C.all_gather(torch.zeros(2), 3, world), ValueError, ["dim 3", "(2,)"]),
        (lambda: C.all_gather(torch.zeros(2), 0, [r for r in world if r != me]), ValueError,
         [f"rank {me} is not in group"]),
        (lambda: C.all_reduce(torch.zeros(2), list(reversed(world))), ValueError, ["sorted ascending"]),
        (lambda: grad_sync.grad_all_reduce_bucketed(torch.zeros(2, requires_grad=True), world, 0), ValueError,
         ["bucket_bytes must be a positive int", "0"]),
    ]
    if n == 4:  # [0, 3] and [1, 2] are the pairs no check creates
        pair = sorted([me, 3 - me])
        expectations.append((lambda: C.all_reduce(torch.zeros(2), pair), DistributedError,
                             ["no process group", str(pair)]))
    one = torch.arange(3.0)  # a group of one rank (a size-1 mesh axis) needs no process group: identity
    if not (torch.equal(C.all_reduce(one, [me]), one) and torch.equal(C.all_gather(one, 0, [me]), one)):
        raise AssertionError("collectives over a group of one rank must be the identity")
    for call, kind, fragments in expectations:
        try:
            call()
        except kind as err:
            missing = [f for f in fragments if f not in str(err)]
            if missing:
                raise AssertionError(f"{kind.__name__} message lacks {missing}: {err}") from None
        else:
            raise AssertionError(f"expected {kind.__name__} with {fragments}")


# ---------------------------------------------------------------------------------- rank bodies


def run_all_checks(rank: int, world_size: int, layouts: list[list[list[int]]]) -> dict:
    """Run every check over this rank's group of each layout (a layout = the groups of one mesh axis).

    Returns {"rank": rank, "passed": [names], "failures": [name + traceback], "seconds": wall time of the checks}.
    """
    start = time.perf_counter()
    create_groups([group for layout in layouts for group in layout])
    passed: list[str] = []
    failures: list[str] = []
    world = list(range(world_size))
    jobs = [(f"errors@{world}", lambda: check_errors(world))]
    for layout in layouts:
        group = next(gr for gr in layout if rank in gr)
        jobs += [(f"{check.__name__}@{group}", lambda check=check, group=group: check(group)) for check in CHECKS]
    for name, job in jobs:
        try:
            job()
            passed.append(name)
        except Exception:  # noqa: BLE001 - report every failing check, not only the first
            failures.append(f"{name} on rank {rank}:\n{traceback.format_exc()}")
    return {"rank": rank, "passed": passed, "failures": failures, "seconds": time.perf_counter() - start}


def raise_on_rank_one(rank: int, world_size: int) -> None:
    """Rank 1 raises; the others wait in a collective that can never complete."""
    if rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    dist.barrier()


def sleep_on_rank_zero(rank: int, world_size: int, seconds: float) -> int:
    """Rank 0 never finishes in time; the others return their rank."""
    if rank == 0:
        time.sleep(seconds)
    return rank


def abort_on_rank_one(rank: int, world_size: int) -> None:
    """Rank 1 dies by SIGABRT without a Python exception (as a crashing C++ extension would)."""
    if rank == 1:
        os.abort()
    dist.barrier()


def abort_on_first_launch(rank: int, world_size: int, marker: str) -> int:
    """Rank 1 dies by SIGABRT (no Python exception, no report) the first time `marker` is absent, after a first
    collective, while the other ranks wait in the next one; a re-run finds the marker and every rank returns its
    rank. Each rank appends one line per launch to `marker + ".launches"`."""
    with open(marker + ".launches", "a") as f:
        f.write(f"{rank}\n")
    dist.barrier()
    if rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.abort()
    dist.barrier()
    return rank


def raise_on_rank_one_counted(rank: int, world_size: int, marker: str) -> None:
    """`raise_on_rank_one`, each rank first appending one line per launch to `marker + ".launches"`."""
    with open(marker + ".launches", "a") as f:
        f.write(f"{rank}\n")
    raise_on_rank_one(rank, world_size)


def run_fx_interpreter(rank: int, world_size: int) -> int:
    """Run a tiny GraphModule through torch.fx.Interpreter (as the verifier does), which creates a tqdm bar."""
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    torch.fx.Interpreter(gm).run(torch.ones(1, 2))
    return rank


def read_environ(rank: int, world_size: int, name: str) -> str | None:
    """The rank's value of environment variable `name` (None when unset)."""
    return os.environ.get(name)
