"""Rank bodies for test_hierarchical (importable by name in spawned ranks): two-level collectives on a simulated
2-node x 2-device cluster (ranks {0, 1} and {2, 3} are nodes) against flat ones, and training steps whose plans
run them against the single-device model."""
from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

from parallelizer.rewriter import collectives, hierarchical
from parallelizer.rewriter.grad_sync import grad_all_reduce_bucketed
from parallelizer.runtime import create_groups
from step_workers import train

DEVICES_PER_NODE = 2
ALWAYS = hierarchical.hierarchy_arg(DEVICES_PER_NODE, {k: [[0, None]] for k in ("all_reduce", "all_gather",
                                                                               "reduce_scatter")})
NEVER_SMALL = hierarchical.hierarchy_arg(DEVICES_PER_NODE, {"all_reduce": [[4096, None]]})


def count_two_level() -> Counter:
    """Count the two-level collectives this process runs from now on (wraps the `hierarchical` entry points)."""
    calls: Counter = Counter()
    init = hierarchical.HierarchicalAllReduce.__init__

    def counted_init(self, *args, **kwargs):
        calls["all_reduce"] += 1
        init(self, *args, **kwargs)

    hierarchical.HierarchicalAllReduce.__init__ = counted_init
    for name in ("all_gather", "reduce_scatter"):
        fn = getattr(hierarchical, name)
        setattr(hierarchical, name, lambda *a, _fn=fn, _n=name, **k: (calls.update([_n]), _fn(*a, **k))[1])
    return calls


def collectives_match_flat(rank: int, world_size: int) -> dict:
    """Largest |two-level - flat| of all-reduce, all-gather and reduce-scatter (odd, uneven sizes), their
    gradients, and the bucketed gradient sync; and the two-level calls made."""
    ranks = list(range(world_size))
    create_groups(hierarchical.sub_groups([ranks], DEVICES_PER_NODE))
    calls = count_two_level()
    torch.manual_seed(rank)
    x = torch.randn(7, 5, dtype=torch.float32, requires_grad=True)
    out = {}
    flat, two = collectives.all_reduce(x, ranks), collectives.all_reduce(x, ranks, ALWAYS)
    out["all_reduce"] = (two - flat).abs().max().item()
    out["all_reduce_vs_exact"] = (two - _exact_sum(x.detach(), world_size)).abs().max().item()
    small = collectives.all_reduce(x, ranks, NEVER_SMALL)  # 140 bytes: outside the rule's sizes, runs flat
    out["small_flat_bitwise"] = torch.equal(small, flat)
    gathered_flat = collectives.all_gather(x[: [2, 2, 2, 1][rank]], 0, ranks, 7)  # uneven chunks of 7 rows
    gathered_two = collectives.all_gather(x[: [2, 2, 2, 1][rank]], 0, ranks, 7, ALWAYS)
    out["all_gather"] = (gathered_two - gathered_flat).abs().max().item()
    out["all_gather_shape"] = list(gathered_two.shape)
    scattered = [collectives.reduce_scatter(x, d, ranks, h) for d in (0, 1) for h in (None, ALWAYS)]
    out["reduce_scatter"] = max(_max_abs(scattered[1] - scattered[0]), _max_abs(scattered[3] - scattered[2]))
    out["reduce_scatter_shapes"] = [list(s.shape) for s in scattered[1::2]]
    grads = []
    for h in (None, ALWAYS):
        y = collectives.all_gather_rs(x[:, : [2, 2, 1, 0][rank]], 1, ranks, 5, h)  # backward: reduce-scatter
        (g,) = torch.autograd.grad((y * torch.arange(35.0).view(7, 5)).sum(), x)
        grads.append(g)
    out["all_gather_rs_grad"] = (grads[1] - grads[0]).abs().max().item()
    out["bucketed"] = _bucketed_diff(ranks, rank)
    out["calls"] = dict(calls)
    return out


def _max_abs(t: torch.Tensor) -> float:
    return t.abs().max().item() if t.numel() else 0.0


def _exact_sum(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """The sum of every rank's `x` (seeded by rank), in float64."""
    total = torch.zeros(x.shape, dtype=torch.float64)
    for r in range(world_size):
        torch.manual_seed(r)
        total += torch.randn(*x.shape, dtype=torch.float32).double()
    return total.float()


def _bucketed_diff(ranks: list[int], rank: int) -> float:
    """|two-level - flat| of the bucketed DDP gradient sync of three parameters in two buckets (first 1 MiB,
    then 64 B buckets: several two-level all-reduces in flight at once)."""
    results = []
    for h in (None, ALWAYS):
        torch.manual_seed(10)
        params = [torch.nn.Parameter(torch.randn(n)) for n in (300, 3, 17)]
        torch.manual_seed(20 + rank)
        data = torch.randn(300)
        loss = sum((grad_all_reduce_bucketed(p, ranks, 64, hierarchy=h) * data[: p.numel()]).sum() for p in params)
        loss.backward()
        results.append(torch.cat([p.grad for p in params]))
    dist.barrier()
    return (results[1] - results[0]).abs().max().item()


GPT2_2 = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=128, batch=8, seq_len=16)


def hierarchical_checks(rank: int, world_size: int, cases: dict) -> dict:
    """One launch for test_hierarchical: `collectives_match_flat`, then per training case (name -> (mesh, plan
    options)) `step_workers.train` on a 2-block GPT-2 (3 AdamW steps against the single-device model) with the
    two-level calls it made."""
    report = {"collectives": collectives_match_flat(rank, world_size)}
    for name, case in cases.items():
        calls = count_two_level()
        report[name] = train(rank, world_size, {name: case}, gpt2=GPT2_2)[name]
        report[name]["calls"] = dict(calls)
    return report
