"""Rewriter: turn a Plan into one sharded torch.fx GraphModule per rank.

    rewrite(traced, plan_or_spec, rank) -> RankProgram   (print(program.graph_module.code) shows every
                                                          collective, named <kind>_<mesh axis>)
    verify(program, traced, spec)                        (raises VerificationError)

`collectives` holds the autograd-aware collectives that the emitted program calls (all_gather,
all_gather_rs, reduce_scatter, all_reduce, grad_all_reduce, all_to_all, local_slice); `grad_sync` the
bucketed asynchronous gradient all-reduce of replicated parameters (DDP-style); `spec` the
`ShardingSpec` a Plan converts to; `state` local shards (cut, gathered, or initialised on `meta`);
`recompute` the activation recomputation of `Plan.recompute` (regions under torch.utils.checkpoint).
"""
from . import collectives, grad_sync
from .apply import RankProgram
from .apply import rewrite as _rewrite_spec
from .spec import NodeSharding, ShardingSpec, spec_from_plan
from .verify import VerificationError, verify


def rewrite(traced, plan, rank: int) -> RankProgram:
    """The sharded GraphModule of `rank` for `plan` (a `Plan` or a `ShardingSpec`), verified.

    Raises:
        UnsupportedOpError, VerificationError, IndivisibleShardError: see `apply.rewrite` and `verify`.
    """
    spec = plan if isinstance(plan, ShardingSpec) else spec_from_plan(plan)
    program = _rewrite_spec(traced, spec, rank)
    verify(program, traced, spec)
    return program


__all__ = ["collectives", "grad_sync", "rewrite", "verify", "RankProgram", "ShardingSpec", "NodeSharding", "spec_from_plan",
           "VerificationError"]
