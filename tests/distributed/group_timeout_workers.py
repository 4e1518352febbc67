"""Workers of test_group_timeouts.py (module-level, so spawn's processes can import them)."""
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from parallelizer.runtime.launch import create_groups

TIMEOUT_S = 3.0  # the user's collective timeout
ASLEEP_S = 12.0  # how long the stuck rank stays away at most: far beyond TIMEOUT_S, far below torch's 30-minute default
_POLL_S = 0.05  # how often the stuck rank looks whether rank 0 is done, seconds


def stuck_peer_in_a_sub_group(rank: int, world_size: int, store_path: str):
    """Re-initialise the world with a TIMEOUT_S collective timeout (as a user's own init_process_group, or
    init_from_env(timeout_s=)), make the sub-group [0, 1] with create_groups, and let rank 1 stay away instead of
    joining rank 0's all-reduce on it: until rank 0's all-reduce has failed (a file rank 0 writes then, so that the
    launch ends with it), at most ASLEEP_S (round 25: a fixed 12 s sleep held every run that long). A sub-group
    without the world's timeout keeps rank 0 waiting until rank 1 leaves after ASLEEP_S, as before. Returns rank 0's
    (seconds until its all-reduce failed, error text)."""
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=TIMEOUT_S))
    create_groups([[0, 1]])
    group = dist.distributed_c10d._world.pg_group_ranks  # {group: {global: group rank}}
    sub = next(g for g, ranks in group.items() if sorted(ranks) == [0, 1])
    done = Path(f"{store_path}.rank0_done")
    if rank == 1:
        end = time.monotonic() + ASLEEP_S
        while time.monotonic() < end and not done.exists():
            time.sleep(_POLL_S)
        return None
    if rank != 0:
        return None
    start = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(4), group=sub)
        out = time.perf_counter() - start, "no error"
    except RuntimeError as exc:
        out = time.perf_counter() - start, str(exc)[:300]
    done.touch()
    return out
