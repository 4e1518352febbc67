"""Pipeline-boundary compression codecs (issue 15, Build 3) against their closed forms: int8 per-block error
bound and wire bytes; low-rank projection exact on its subspace; activation gradients compressed by autograd.
The planner's choice and the plan's record of it: tests/unit/test_plan_pipeline.py; the runtime on 4 gloo
ranks: tests/distributed/test_boundary_compression_run.py."""
import pytest
import torch

from parallelizer.core.boundary_codec import BoundaryCodec, int8_pack, lowrank_basis, wire_bytes

SHAPE = (3, 5, 48)  # 720 values: 11.25 blocks of 64 (the last one padded)


def _varied(seed=0):
    """Values whose magnitude differs by block (so one global scale would be wrong), one all-zero block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=g) * torch.logspace(-3, 2, SHAPE[-1])
    flat = x.view(-1)
    flat[64:128] = 0.0
    return x


def test_int8_round_trip_within_the_per_block_bound():
    x = _varied()
    codec = BoundaryCodec("int8", SHAPE, torch.float32)
    wire = codec.encode(x)
    assert wire.shape == codec.wire_shape == (768 // 4 + 768 // 64,) and wire.dtype == torch.float32
    assert wire.numel() * 4 == wire_bytes(SHAPE, torch.float32, "int8", 8) == 768 + 4 * 12  # (1 + 4/64) B/value
    back = codec.decode(wire)
    assert back.shape == SHAPE
    err = (back - x).abs().view(-1)
    padded = torch.nn.functional.pad(x.view(-1), (0, 768 - 720)).view(-1, 64)
    bound = (padded.abs().amax(dim=1, keepdim=True) / 254).expand(-1, 64).reshape(-1)[:720]  # max_b |x| / 254
    assert torch.all(err <= bound * (1 + 1e-5) + 1e-30)
    assert torch.all(back.view(-1)[64:128] == 0)  # an all-zero block stays exactly zero
    assert err.max() > 0.25 * bound.max() / 254  # it really quantises (not a copy)
    assert torch.equal(int8_pack(x, 64).view(torch.int32), wire.view(torch.int32))  # deterministic (bit patterns)


def test_int8_gradient_is_compressed_on_the_way_back():
    x = _varied(1).requires_grad_()
    codec = BoundaryCodec("int8", SHAPE, torch.float32)
    y = codec.decode(codec.encode(x))  # sender's encode, receiver's decode (one process)
    g = _varied(2)
    y.backward(g)
    assert torch.equal(x.grad, codec.round_trip(g))  # the gradient took the same int8 round trip
    assert not torch.equal(x.grad, g)


def test_lowrank_exact_in_its_subspace_and_projects_outside():
    codec = BoundaryCodec("lowrank", SHAPE, torch.float32, rank=6, seed=3)
    u = lowrank_basis(48, 6, 3)
    assert torch.allclose(u.T @ u, torch.eye(6), atol=1e-6)
    inside = torch.randn(3, 5, 6) @ u.T
    assert codec.encode(inside).shape == codec.wire_shape == (3, 5, 6)
    torch.testing.assert_close(codec.round_trip(inside), inside, rtol=0, atol=1e-5)
    x = torch.randn(SHAPE, requires_grad=True)
    y = codec.decode(codec.encode(x))
    torch.testing.assert_close((x - y).detach() @ u, torch.zeros(3, 5, 6), rtol=0, atol=1e-5)  # residual _|_ U
    g = torch.randn(SHAPE)
    y.backward(g)
    torch.testing.assert_close(x.grad, g @ u @ u.T)  # the activation gradient is projected too
    assert wire_bytes(SHAPE, torch.float32, "lowrank", 6) == 3 * 5 * 6 * 4


def test_codec_rejects_what_it_cannot_compress():
    with pytest.raises(ValueError, match="last dim exceeds the rank 64"):
        BoundaryCodec("lowrank", (4, 64), torch.float32, rank=64)
    with pytest.raises(ValueError, match="floating-point"):
        BoundaryCodec("int8", (4, 64), torch.int64)
    with pytest.raises(ValueError, match="use one of"):
        BoundaryCodec("fp4", (4, 64), torch.float32)
