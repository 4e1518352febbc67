"""Rewriter: turn a Plan into one sharded torch.fx GraphModule per rank.

`collectives` holds the autograd-aware collectives that the emitted program calls (all_gather,
all_gather_rs, reduce_scatter, all_reduce, grad_all_reduce, all_to_all, local_slice).
"""
from . import collectives

__all__ = ["collectives"]
