"""Rank bodies of trial/r17c_abort_loops/stress.py (round 17, r17c): collectives on a 2x2 mesh's sub-groups."""
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from parallelizer.runtime.launch import create_groups

def body(rank, world_size):
    groups = [[0, 1], [2, 3], [0, 2], [1, 3]]
    create_groups(groups)
    mine = [g for g in groups if rank in g]
    out = []
    for i in range(20):
        x = torch.randn(64, 33) + rank
        for g in mine:
            y = funcol.all_gather_tensor(x, 0, g).wait()
            z = funcol.reduce_scatter_tensor(y.contiguous(), "sum", 0, g).wait()
            w = dist.all_reduce(x.clone(), async_op=True)
            w.wait()
            out.append(float(z.sum()))
    dist.barrier()
    return sum(out)


def uneven_exit(rank, world_size, slow_rank, slow_s, big):
    """Collectives on the world and sub-groups, a final barrier, then `slow_rank` stays `slow_s` longer (a slow
    report) while the others destroy their process groups and exit."""
    import time
    groups = [[0, 1], [2, 3], [0, 2], [1, 3]]
    create_groups(groups)
    mine = [g for g in groups if rank in g]
    x = torch.randn(64, 33) + rank
    for g in mine:
        y = funcol.all_gather_tensor(x, 0, g).wait()
        dist.all_reduce(y, async_op=True).wait()
    dist.barrier()
    if rank == slow_rank:
        t0 = time.monotonic()
        while time.monotonic() - t0 < slow_s:  # busy, allocating, as pickling a big report would
            _ = [torch.randn(256) for _ in range(50)]
        return torch.randn(big)
    return rank
