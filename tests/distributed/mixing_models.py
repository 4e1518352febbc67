"""Models whose loss mixes the samples of a batch, for the pipeline rehearsal's report (test_rehearse_pairs.py).

`InBatchContrastive`: per-token blocks (Linear + tanh, `blocks.*`: a pipeline cuts between them), then an in-batch
contrastive loss in the model's own code, as CLIP's: z = normalize(mean over tokens), logits = z z^T / 0.2 over
the batch, cross-entropy against the diagonal. Each sample's term has every other sample of the batch as its
negatives, so a pipeline's microbatch sees only its own samples: the pipeline trains gradient accumulation over
the microbatches (each microbatch's own contrastive loss), not the model on the whole batch, and the rehearsal's
whole-batch loss is not a comparison of the plan (one device's own whole batch differs from its own gradient
accumulation by the same amount).
"""
import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 8
TOKENS = 3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):  # (B, T, W) -> (B, T, W)
        return torch.tanh(self.lin(x)) + x


class InBatchContrastive(nn.Module):
    def __init__(self, blocks: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):  # x (B, T, W) -> 0-d loss
        for block in self.blocks:
            x = block(x)
        z = F.normalize(self.head(x).mean(1), dim=-1)  # (B, W)
        logits = z @ z.t() / 0.2  # (B, B): every other sample of the batch is a negative
        return (-torch.diagonal(F.log_softmax(logits, dim=-1))).mean()  # a mean over the batch: weighted 1 / m


def contrastive(batch: int = 4, blocks: int = 2):
    """(model, (x,)): seeded weights, x (batch, TOKENS, WIDTH) random (its own generator)."""
    torch.manual_seed(0)
    model = InBatchContrastive(blocks)
    return model, (torch.randn(batch, TOKENS, WIDTH, generator=torch.Generator().manual_seed(1)),)


def pipeline_rehearsed(rank: int, world_size: int, model_fn, model_kwargs: dict, spec, pipe: dict, steps: int) -> dict:
    """This rank's result of `rehearse_pipeline(model_fn, model_kwargs, spec, pipeline, steps=steps)`
    (`pipeline_rehearsal._rank_judged`; `pipe`: `plan.pipeline.to_dict()`)."""
    from parallelizer.runtime import pipeline_rehearsal

    return pipeline_rehearsal._rank_judged(rank, world_size, model_fn, model_kwargs, spec, pipe, steps, 1e-3, 1e-3,
                                           False)


def pipeline_rehearsed_without_the_gradient_all_reduce(rank: int, world_size: int, model_fn, model_kwargs: dict, spec,
                                                       pipe: dict, steps: int) -> dict:
    """`pipeline_rehearsed` with the data-parallel gradient all-reduce of every replicated parameter emitted as the
    identity (`grad_sync.grad_all_reduce_bucketed`, and `collectives.grad_all_reduce` unbucketed): each dp rank
    keeps its own half's gradient, a wrong program."""
    from unittest import mock

    from parallelizer.rewriter import collectives, grad_sync

    def grad_all_reduce_bucketed(param, ranks, bucket_bytes, compression=""):  # named as the rewriter names it
        return param * 1.0

    def grad_all_reduce(x, ranks, hierarchy=None):
        return x * 1.0

    with mock.patch.object(grad_sync, "grad_all_reduce_bucketed", grad_all_reduce_bucketed), \
            mock.patch.object(collectives, "grad_all_reduce", grad_all_reduce):
        return pipeline_rehearsed(rank, world_size, model_fn, model_kwargs, spec, pipe, steps)


def pipeline_rehearsed_without_the_microbatch_check(rank: int, world_size: int, model_fn, model_kwargs: dict, spec,
                                                    pipe: dict, steps: int) -> dict:
    """`pipeline_rehearsed` with the microbatch check finding nothing (`tracer.microbatch_check` skips a model over
    `eager_check.MAX_ELEMENTS` parameter elements): the whole-batch pair must still be left out of the verdict, on
    one device's own evidence (`runtime.whole_batch.own_difference`)."""
    from unittest import mock

    from parallelizer.runtime import whole_batch

    with mock.patch.object(whole_batch, "microbatch_mixing", lambda *args, **kwargs: None):
        return pipeline_rehearsed(rank, world_size, model_fn, model_kwargs, spec, pipe, steps)
