"""Rank-side code of test_vocab_parallel_loss.py: the vocab-parallel cross-entropy of one rank's class shard
(`rewriter.localize.sharded_cross_entropy`) against torch's cross_entropy on the whole logits, and the bytes
autograd keeps for its backward (saved-tensor hooks, unique storages)."""
import torch
import torch.distributed as dist

from parallelizer.rewriter.localize import sharded_cross_entropy
from parallelizer.runtime.launch import create_groups


def logits_and_target(rows: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (rows, classes) float32 with one -inf class (a banned token), and class-id targets with every
    fifth row `-100` (ignored)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, classes, generator=gen) * 3
    logits[:, classes // 3] = float("-inf")
    target = torch.randint(0, classes, (rows,), generator=gen)
    target[target == classes // 3] = 0
    target[::5] = -100
    return logits, target


def class_shard(rank: int, world_size: int, rows: int, classes: int, reduction: int) -> dict:
    """This rank's vocab-parallel loss, its logits-shard gradient and the storages saved for backward (bytes),
    for the class slice torch.chunk gives this rank (uneven when `classes` does not divide)."""
    group = list(range(world_size))
    create_groups([group])
    logits, target = logits_and_target(rows, classes)
    bounds = [0]
    for c in torch.arange(classes).chunk(world_size):
        bounds.append(bounds[-1] + len(c))
    local = logits[:, bounds[rank]:bounds[rank + 1]].clone().requires_grad_(True)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        if s.data_ptr() != local.untyped_storage().data_ptr():  # the input itself is the caller's, not saved
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = sharded_cross_entropy(local, target, None, reduction, -100, 0.0, [], [group], bounds[rank], classes)
    out = loss.sum() if reduction == 0 else loss
    (out * 1.5).backward()  # a non-unit gradient into the loss
    dist.barrier()
    return {"loss": loss.detach(), "grad": local.grad, "saved_bytes": sum(saved.values()), "local_shape": tuple(local.shape)}
