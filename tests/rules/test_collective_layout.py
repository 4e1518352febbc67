"""Collectives hand back contiguous tensors, as the single-device tensors they stand for are (trial4b): an
all-gather of uneven shards along a dim > 0 pads the short shard for the collective and trims the padding,
which left a strided view. `view` then raised ("view size is not compatible with input tensor's size and
stride") and `as_strided`, which reads memory by the strides it is given, silently read the padding: a
column-parallel linear of width 16 on tp=3 followed by `as_strided` gave outputs off by 1.7, `view(B, T * H)`
crashed (`trial/finding1_uneven_gather_strides.py`). Simulated ranks (threaded process group)."""
import torch

from parallelizer.rewriter import collectives
from sim import agreed, world

B, T, H = 2, 3, 16  # 16 over 3 ranks: chunks 6, 6, 4


def _full():
    return torch.arange(B * T * H, dtype=torch.float32).reshape(B, T, H)


def test_uneven_all_gather_and_reduce_scatter_along_a_late_dim_are_contiguous():
    def body(rank):
        if rank >= 3:
            return None
        with agreed(3):
            full = _full()
            mine = full.chunk(3, dim=2)[rank].contiguous()
            gathered = collectives.all_gather(mine, 2, [0, 1, 2], H)
            scattered = collectives.reduce_scatter(full.clone(), 2, [0, 1, 2])
            return (gathered.is_contiguous(), torch.equal(gathered.view(B, T * H), full.view(B, T * H)),
                    torch.equal(gathered.as_strided((B, T, H // 2), (T * H, H, 2)), full[..., ::2]),
                    scattered.is_contiguous(), torch.equal(scattered, 3 * full.chunk(3, dim=2)[rank]))
    for rank, result in enumerate(world().run(body)[:3]):
        assert result == (True,) * 5, (rank, result)
