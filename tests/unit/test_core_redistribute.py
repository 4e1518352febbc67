"""redistribute_steps: simulated on per-rank numpy arrays (the steps really produce the target layout),
cost relations in DTensor's style, and the gradient semantics of edge_steps."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallelizer.core import (ImpossibleRedistributionError, Layout, MeshSpec, Partial, Replicate, Shard,
                               edge_steps, redistribute_steps)
from parallelizer.core.layout import chunk_range

MESHES = [MeshSpec(("a",), (4,)), MeshSpec(("a", "b"), (2, 3)), MeshSpec(("a", "b", "c"), (2, 2, 2))]
SHAPES = [(12, 6, 4), (7, 5, 3)]  # even and uneven (torch.chunk's split, some chunks empty)


def _chunk(x: np.ndarray, dim: int, n: int, i: int) -> np.ndarray:
    start, length = chunk_range(x.shape[dim], n, i)
    return np.take(x, range(start, start + length), axis=dim)


def _local(global_: np.ndarray, layout: Layout, mesh: MeshSpec, coord: tuple[int, ...], partial_parts) -> np.ndarray:
    x = partial_parts[coord] if partial_parts is not None else global_
    for axis, p in enumerate(layout):
        if isinstance(p, Shard):
            x = _chunk(x, p.dim, mesh.shape[axis], coord[axis])
    return x


def _group(coord, axis, mesh):
    return [coord[:axis] + (k,) + coord[axis + 1:] for k in range(mesh.shape[axis])]


def _apply(step, locals_: dict, mesh: MeshSpec) -> dict:
    axis = mesh.index(step.mesh_axis)
    n = mesh.shape[axis]
    out = {}
    for coord in locals_:
        peers = [locals_[c] for c in _group(coord, axis, mesh)]
        me = coord[axis]
        if step.kind == "all_gather":
            out[coord] = np.concatenate(peers, axis=step.tensor_dim)
        elif step.kind == "all_reduce":
            out[coord] = sum(peers)
        elif step.kind == "reduce_scatter":
            out[coord] = _chunk(sum(peers), step.tensor_dim, n, me)
        elif step.kind == "all_to_all":
            out[coord] = np.concatenate([_chunk(p, step.dst_dim, n, me) for p in peers], axis=step.tensor_dim)
        elif step.kind == "local_slice":
            out[coord] = _chunk(locals_[coord], step.tensor_dim, n, me)
        else:
            out[coord] = locals_[coord]
    return out


class _AllReduce:
    kind, tensor_dim, dst_dim = "all_reduce", None, None

    def __init__(self, axis: str) -> None:
        self.mesh_axis = axis


placement = st.sampled_from([Replicate(), Shard(0), Shard(1), Shard(2), Partial("sum")])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from(MESHES), st.sampled_from(SHAPES), st.data())
def test_steps_really_redistribute(mesh, SHAPE, data):
    src = Layout(tuple(data.draw(placement) for _ in mesh.shape))
    dst = Layout(tuple(data.draw(placement) if not isinstance(s, Partial) else data.draw(
        st.sampled_from([s, Replicate(), Shard(0), Shard(1)])) for s in src))
    dst = Layout(tuple(Replicate() if isinstance(d, Partial) and not isinstance(s, Partial) else d
                       for s, d in zip(src, dst)))
    from parallelizer.core.layout import fits
    if not (fits(SHAPE, src, mesh) and fits(SHAPE, dst, mesh)):
        return
    rng = np.random.default_rng(0)
    g = rng.standard_normal(SHAPE)
    coords = list(itertools.product(*[range(s) for s in mesh.shape]))
    parts = None
    if any(isinstance(p, Partial) for p in src):  # random summands along the Partial axes
        p_axes = [a for a, p in enumerate(src) if isinstance(p, Partial)]
        parts = {}
        for c in coords:
            key = tuple(c[a] for a in p_axes)
            parts[c] = rng.standard_normal(SHAPE) if any(key) else None
        for c in coords:
            if parts[c] is None:
                others = [parts[d] for d in coords if all(d[i] == c[i] for i in range(len(c)) if i not in p_axes)
                          and parts[d] is not None]
                parts[c] = g - sum(others)
    locals_ = {c: _local(g, src, mesh, c, parts) for c in coords}
    steps = redistribute_steps(src, dst, SHAPE, mesh, itemsize=8)
    for s in steps:
        locals_ = _apply(s, locals_, mesh)
    for a, d in enumerate(dst):  # a Partial target: its summands must add up to the tensor
        if isinstance(d, Partial):
            locals_ = _apply(_AllReduce(mesh.axis_names[a]), locals_, mesh)
    reduced = Layout(tuple(Replicate() if isinstance(d, Partial) else d for d in dst))
    for c in coords:
        np.testing.assert_allclose(locals_[c], _local(g, reduced, mesh, c, None), atol=1e-9)
    if steps:
        assert steps[0].before == str(src.normalized(3)) and steps[-1].after == str(dst.normalized(3))


def test_cost_relations():
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    L = Layout.parse
    assert redistribute_steps(L("S(0)R"), L("S(0)R"), (8, 8), mesh) == ()
    (rs,) = redistribute_steps(L("RP"), L("RS(1)"), (8, 8), mesh)  # never a detour via all_reduce
    assert rs.kind == "reduce_scatter" and rs.nbytes == 8 * 8 * 4 and rs.bwd_kind == "all_gather"
    (ar,) = redistribute_steps(L("RP"), L("RR"), (8, 8), mesh)
    assert ar.kind == "all_reduce" and ar.bwd_kind == "identity"
    (ag,) = redistribute_steps(L("RS(0)"), L("RR"), (8, 8), mesh)
    assert ag.kind == "all_gather" and ag.nbytes == 8 * 8 * 4  # output bytes (nccl-tests convention)
    for bad in ("S(0)P", "RP"):
        with pytest.raises(ImpossibleRedistributionError, match="impossible"):
            redistribute_steps(L("S(0)S(1)" if bad == "S(0)P" else "RR"), L(bad), (8, 8), mesh)


def test_multi_axis_decomposition_is_deterministic():
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    L = Layout.parse
    a = redistribute_steps(L("S(0)S(1)"), L("S(1)S(0)"), (8, 8), mesh)
    assert a == redistribute_steps(L("S(0)S(1)"), L("S(1)S(0)"), (8, 8), mesh)
    assert [s.kind for s in a] == ["all_gather", "all_to_all", "local_slice"]


def test_gradient_semantics():
    mesh = MeshSpec(("dp", "tp"), (2, 4))
    L = Layout.parse
    # DDP: a replicated weight used by a batch-sharded op -> identity forward, all-reduce backward.
    (s,) = edge_steps(L("RR"), L("RR"), (8, 8), mesh, grad_partial_axes=("dp",))
    assert (s.kind, s.mesh_axis, s.bwd_kind, s.nbytes, s.bwd_nbytes) == ("grad_all_reduce", "dp", "all_reduce", 0, 256)
    # FSDP: the all_gather's reduce_scatter backward absorbs the partial gradient; no extra all-reduce.
    steps = edge_steps(L("S(0)R"), L("RR"), (8, 8), mesh, grad_partial_axes=("dp",), is_parameter=True)
    assert [(x.kind, x.bwd_kind, x.regather) for x in steps] == [("all_gather", "reduce_scatter", True)]
    # A gather into a replicated computation gets full gradients: its backward is a free local slice.
    (g,) = edge_steps(L("S(0)R"), L("RR"), (8, 8), mesh)
    assert g.bwd_kind == "local_slice" and g.bwd_nbytes == 0
    # No gradients -> identity backwards.
    assert all(x.bwd_kind == "identity" for x in edge_steps(L("S(0)R"), L("RR"), (8, 8), mesh, requires_grad=False))
    assert math.prod((8, 8)) * 4 == 256
