"""Models whose forward asks whether a process group exists (round 24, r24e), for test_process_group_view.py.

Each computes one thing on one device and another when it finds a group: written for DDP, they sync what they
need themselves. A parallel program computes the one-device model on the global batch and does its own
communication, so the trace, the trace's eager checks and `rehearse`'s single-device references must all see no
group, however the model asks:
- `SyncedEntropy(how)`: a codebook-entropy term over the batch mean (vector-quantize-pytorch's LFQ), all-reduced
  and divided by the world size when a group is found by `how`: "plain" (`dist.is_initialized()`, also used by
  tests/unit/test_one_process_view.py), "imported" (`from torch.distributed import is_initialized`, bound at
  import), "c10d" (`distributed_c10d.is_initialized()`), "world_size" (`dist.get_world_size()` inside try /
  except, as code that runs with and without a launcher does).
- `FlavaHead`: transformers' `FlavaGlobalContrastiveHead` as written there: under a group it all-gathers both
  towers' embeddings and offsets the labels by `dist.get_rank()`, so each rank's logits are (B, world x B).
- `SyncBNBlocks`: residual Linear + BatchNorm1d blocks turned into nn.SyncBatchNorm by
  `convert_sync_batchnorm` (a DDP user's habit), which raises on a CPU tensor under a group of 2 ranks.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import distributed_c10d
from torch.distributed import is_initialized as imported_is_initialized

BATCH = 8


class SyncedEntropy(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.enc, self.dec = nn.Linear(6, 8), nn.Linear(8, 6)
        self.how = how

    def _group_found(self) -> bool:
        if self.how == "never":  # the one-device model itself, whatever the process holds
            return False
        if self.how == "plain":
            return dist.is_initialized()
        if self.how == "imported":
            return imported_is_initialized()
        if self.how == "c10d":
            return distributed_c10d.is_initialized()
        try:
            return dist.get_world_size() >= 1
        except (RuntimeError, ValueError):
            return False

    def forward(self, x):  # x (B, 6) -> 0-d loss
        probs = self.enc(x).softmax(-1)
        avg = probs.mean(0)
        if self._group_found():
            avg = torch.distributed.nn.functional.all_reduce(avg) / dist.get_world_size()
        entropy = -(avg * avg.clamp_min(1e-9).log()).sum()
        return F.mse_loss(self.dec(probs), x) - 0.1 * entropy


class FlavaHead(nn.Module):
    def __init__(self, ask: bool = True):
        super().__init__()
        self.ask = ask  # False: the one-device branch, whatever the process holds
        self.image, self.text = nn.Linear(10, 8), nn.Linear(7, 8)
        self.logit_scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, pixels, tokens):  # (B, 10), (B, 7) -> 0-d loss
        image, text = F.normalize(self.image(pixels), dim=-1), F.normalize(self.text(tokens), dim=-1)
        if not self.ask or not dist.is_available() or not dist.is_initialized():
            labels = torch.arange(image.size(0))
            image_all, text_all = [image], [text]
        else:
            image_all = torch.distributed.nn.functional.all_gather(image)
            text_all = torch.distributed.nn.functional.all_gather(text)
            labels = image.size(0) * dist.get_rank() + torch.arange(image.size(0))
        per_image = image @ torch.cat(text_all).T * self.logit_scale.exp()
        per_text = text @ torch.cat(image_all).T * self.logit_scale.exp()
        return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2


class SyncBNBlocks(nn.Module):
    def __init__(self, blocks: int = 2, width: int = 6, sync: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width, momentum=0.3))
                                    for _ in range(blocks))
        self.head = nn.Linear(width, 1)
        if sync:  # False: plain BatchNorm1d, what SyncBatchNorm computes on one device
            nn.SyncBatchNorm.convert_sync_batchnorm(self)

    def forward(self, x):  # x (B, width) -> 0-d loss
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(x).pow(2).mean()


def build(name: str, batch: int = BATCH, one_device: bool = False):
    """(model, example inputs) of case `name`, seeded: the same weights and inputs in every process;
    `one_device`: the same model written without asking for a group (the expected values)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "flava":
        return FlavaHead(ask=not one_device), (torch.randn(batch, 10, generator=g), torch.randn(batch, 7, generator=g))
    if name == "sync_bn":
        return SyncBNBlocks(sync=not one_device), (torch.randn(batch, 6, generator=g),)
    return SyncedEntropy("never" if one_device else name), (torch.randn(batch, 6, generator=g),)


def one_device(name: str, batch: int = BATCH) -> torch.Tensor:
    """The model's loss on one device (its variant that never asks for a group), in any process."""
    model, args = build(name, batch, one_device=True)
    return model(*args).detach()


def trace_on_rank(rank: int, world_size: int, names: list[str]) -> dict:
    """On a rank of a 2-rank group: trace each model; (its warnings' texts, the exported program's loss), or
    (the trace's error, None), so that each model's test reports its own result."""
    import warnings

    import parallelizer

    out = {}
    for name in names:
        model, args = build(name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                traced = parallelizer.trace(model, args)
            except parallelizer.TraceError as error:
                out[name] = ([f"TraceError: {error}"], None)
                continue
        out[name] = ([str(w.message) for w in caught], traced.exported.module()(*args).detach())
    return out
