"""A model built to put a pre-ReLU value within rounding of the kink (`runtime.kinks`), for the rehearsal's
kink verdict (test_kink_verdict.py).

`BatchGate`: h = x W^T (W the identity, so h = x exactly), m = h.sum(0) over the batch, out = h + relu(m). The
input's column 0 over a batch of 4 is (-1, -1, 1, 1 + 2^-23): its exact sum (and float64's) is 2^-23 > 0; one
device sums the rows in order, ((-1 - 1) + 1) + (1 + 2^-23) = 2^-23 > 0 in float32 too; a plan with the batch
split over dp = 2 sums the halves first, (-1 - 1) + (1 + (1 + 2^-23)), and 1 + (1 + 2^-23) = 2 + 2^-23 rounds to 2
(a tie, to even): 0. So ReLU's gradient at m[0] is 1 on one device and in float64, 0 in the plan: every gradient
that flows through m[0] (to W's column 0 and beyond) is dropped by the plan, by rounding alone. With `blocks`
the gate repeats (a pipeline needs blocks to cut between); each block's W is the identity too.
"""
import torch
from torch import nn

FEATURES = 4
ODD = 1 + 2 ** -23


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(FEATURES, FEATURES, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.eye(FEATURES))

    def forward(self, x):  # (B, F) -> (B, F)
        h = self.lin(x)
        return h + torch.relu(h.sum(0))


class BatchGate(nn.Module):
    def __init__(self, blocks: int = 1):
        super().__init__()
        self.blocks = nn.ModuleList(Gate() for _ in range(blocks))
        self.head = nn.Linear(FEATURES, FEATURES)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch_gate(blocks: int = 1, repeat: int = 1):
    """(model, (x,)): x of shape (4 * repeat, FEATURES), column 0 (-1, -1, 1, 1 + 2^-23) per group of 4 rows
    (`repeat` groups: a batch for microbatches of 4), the other columns random."""
    torch.manual_seed(0)
    model = BatchGate(blocks)
    x = torch.randn(4 * repeat, FEATURES)
    x[:, 0] = torch.tensor([-1.0, -1.0, 1.0, ODD]).repeat(repeat)
    return model, (x,)


def rehearsed(rank: int, world_size: int, model_fn, spec, steps: int) -> dict:
    """This rank's result of `rehearse(model_fn, {}, spec, steps=steps)` (`rehearsal._rank_cases`)."""
    from parallelizer.runtime import rehearsal

    return rehearsal._rank_cases(rank, world_size, [(model_fn, {}, spec)], steps, 1e-3, 1e-3)[0]


def pipeline_rehearsed(rank: int, world_size: int, model_kwargs: dict, spec, pipe: dict, steps: int) -> dict:
    """This rank's result of `rehearse_pipeline(batch_gate, model_kwargs, spec, pipeline, steps=steps)`
    (`pipeline_rehearsal._rank_judged`; `pipe`: `plan.pipeline.to_dict()`)."""
    from parallelizer.runtime import pipeline_rehearsal

    return pipeline_rehearsal._rank_judged(rank, world_size, batch_gate, model_kwargs, spec, pipe, steps, 1e-3, 1e-3,
                                           False)


def with_a_wrong_all_reduce(body):
    """`body` (a rank body above) with the forward all-reduce (Partial -> Replicate: the batch sum before the
    ReLU) emitted as the identity, each rank keeping its own half's sum: a wrong program whose error enters AT the
    kink op, in every program the rehearsal builds (float32, its float64 replay, the kink check)."""
    import functools

    @functools.wraps(body)
    def wrong(*args):
        from unittest import mock

        from parallelizer.rewriter import collectives

        def all_reduce(x, ranks, hierarchy=None):  # the name the rewriter gives the node (`fn.__name__`)
            return x * 1.0

        with mock.patch.object(collectives, "all_reduce", all_reduce):
            return body(*args)
    return wrong


def rehearsed_with_a_wrong_all_reduce(rank: int, world_size: int, model_fn, spec, steps: int) -> dict:
    """`rehearsed` under `with_a_wrong_all_reduce`."""
    return with_a_wrong_all_reduce(rehearsed)(rank, world_size, model_fn, spec, steps)


def pipeline_rehearsed_with_a_wrong_all_reduce(rank: int, world_size: int, model_kwargs: dict, spec, pipe: dict,
                                               steps: int) -> dict:
    """`pipeline_rehearsed` under `with_a_wrong_all_reduce`."""
    return with_a_wrong_all_reduce(pipeline_rehearsed)(rank, world_size, model_kwargs, spec, pipe, steps)
