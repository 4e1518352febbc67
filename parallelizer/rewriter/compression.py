"""Data-parallel gradient compression inside our bucketed gradient sync (`rewriter.grad_sync`).

A bucket of replicated (DDP) parameters' gradients, flattened into one buffer, is all-reduced by torch's own
DDP communication hooks instead of a plain `dist.all_reduce`:

* ``"bf16"``: `torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook` (cast to bf16,
  all-reduce, cast back).
* ``"powersgd"``: `torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook` with a
  `PowerSGDState` (rank r, error feedback, warm start; Vogels et al., NeurIPS 2019, Algorithm 1). Matrices
  that do not shrink by torch's `min_compression_rate` (2), e.g. 1-D biases and norm weights, are
  all-reduced exactly, as torch's hook does.

Adapting torch's hooks to our buckets:

* The hooks take a `dist.GradBucket`, which has no Python constructor (checked on torch 2.13.0); they only
  call its `buffer()`, `gradients()`, `index()`, `is_last()` and `parameters()`, so `_BucketView` provides
  those over our flat buffer (`gradients()` are views of it: the hooks write the result through them).
* Each bucket gets its own `PowerSGDState`, kept from step to step (error feedback and warm start need the
  same bucket again) and keyed by the bucket's first parameter, its place in the pass and its gradient sizes,
  as `grad_sync` keys its kept buffers; so the bucket is always index 0, and the last of its state.
* torch refuses `start_powerSGD_iter <= 1` with error feedback, because DDP rebuilds its buckets after the
  first iteration; our buckets are never rebuilt (a different bucket gets a different state), so we set it
  to 0 after construction and compress from the first step, as the paper's Algorithm 1 does.
* Both hooks AVERAGE over the group (DDP's convention); our sync SUMS, so the result is multiplied by the
  group size after the wait (`finish_compressed`).

Determinism: PowerSGD's random initial Q comes from `PowerSGDState.rng`, a numpy RandomState seeded with
`GradCompression.seed` on every rank, so all ranks (and two runs) draw the same Q. The FSDP/ZeRO-3
reduce-scatters of sharded parameters, activation collectives, and the synchronous fallbacks of
`grad_sync` (hooks on a parameter, double backward, `torch.autograd.grad`, pipeline schedules' split
weight backward) are not compressed: they stay exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.utils.weak import WeakIdKeyDictionary

from cost_model.compression import COMPRESSIONS, POWERSGD_MIN_COMPRESSION_RATE

__all__ = ["GradCompression", "NO_COMPRESSION", "start_compressed", "finish_compressed"]


@dataclass(frozen=True, slots=True, order=True)
class GradCompression:
    """The codec of the data-parallel gradient buckets.

    Attributes:
        kind: "none", "bf16" or "powersgd" (`cost_model.compression.COMPRESSIONS`).
        rank: PowerSGD's approximation rank r (>= 1).
        seed: seed of PowerSGD's random initial Q, the same on every rank.
    Raises:
        ValueError: unknown kind, rank < 1, or a seed that is not an int.
    """

    kind: str = "none"
    rank: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in COMPRESSIONS:
            raise ValueError(f"GradCompression.kind={self.kind!r}: use one of {COMPRESSIONS}")
        if not (isinstance(self.rank, int) and self.rank >= 1) or not isinstance(self.seed, int):
            raise ValueError(f"GradCompression(rank={self.rank!r}, seed={self.seed!r}): rank must be an int >= 1 "
                             "and seed an int")

    @property
    def lossy(self) -> bool:
        """Whether the codec changes the summed gradients (every kind but "none")."""
        return self.kind != "none"

    @property
    def spec(self) -> str:
        """The string form passed to the emitted program ("" for none; "bf16"; "powersgd:RANK:SEED")."""
        return "" if self.kind == "none" else "bf16" if self.kind == "bf16" else f"powersgd:{self.rank}:{self.seed}"

    @classmethod
    def parse(cls, spec: str) -> "GradCompression":
        """Inverse of `spec`. Raises ValueError for a malformed string."""
        if not isinstance(spec, str):
            raise ValueError(f"gradient compression must be a string ('', 'bf16' or 'powersgd:RANK:SEED'), got "
                             f"{type(spec).__name__} {spec!r}; pass a hierarchical rule as hierarchy=...")
        if not spec:
            return NO_COMPRESSION
        kind, *rest = spec.split(":")
        try:
            return cls(kind, *(int(x) for x in rest))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"gradient compression {spec!r}: use '', 'bf16' or 'powersgd:RANK:SEED' ({exc})") from None

    @classmethod
    def from_record(cls, record: dict) -> "GradCompression":
        """The codec a plan chose (`Plan.compression`, `planner.compression`); none for an empty record."""
        chosen = record.get("chosen", "none") if record else "none"
        return cls(chosen, int(record.get("rank", 4))) if chosen != "none" else NO_COMPRESSION


NO_COMPRESSION = GradCompression()


class _BucketView:
    """What torch's DDP communication hooks read of a `dist.GradBucket` (module docstring), over our buffer."""

    def __init__(self, flat: torch.Tensor, params: list[torch.Tensor]) -> None:
        self._flat, self._params = flat, params

    def buffer(self) -> torch.Tensor:
        return self._flat

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._flat = tensor

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        """Views of the buffer shaped as the parameters (a 0-d parameter as (1,): the hook views dim 0)."""
        pieces = self._flat.split([p.numel() for p in self._params])
        return [piece.view(p.shape if p.dim() else (1,)) for piece, p in zip(pieces, self._params)]


def start_compressed(flat: torch.Tensor, params: list[torch.Tensor], group: dist.ProcessGroup,
                     compression: GradCompression, key: tuple) -> torch.futures.Future:
    """Start the compressed all-reduce of one bucket: `flat` (1-D, the gradients of `params` concatenated)
    is replaced in place by the codec's approximation of the AVERAGE over `group` when the returned future
    completes (`finish_compressed` turns it into the sum). `key` identifies the bucket within its pass
    (kept PowerSGD state, module docstring).

    Raises:
        ValueError: compression "none" (use a plain all-reduce).
    """
    bucket = _BucketView(flat, params)
    if compression.kind == "bf16":
        return default_hooks.bf16_compress_hook(group, bucket)
    if compression.kind != "powersgd":
        raise ValueError(f"start_compressed: no codec for {compression}; all-reduce uncompressed buckets directly")
    states = _STATES.setdefault(params[0], {})
    state_key = (key, tuple(p.numel() for p in params), compression)
    if state_key not in states:
        state = PowerSGDState(process_group=group, matrix_approximation_rank=compression.rank,
                              start_powerSGD_iter=2, min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
                              use_error_feedback=True, warm_start=True, random_seed=compression.seed,
                              compression_stats_logging_frequency=2**62)
        state.start_powerSGD_iter = 0  # our buckets are never rebuilt (module docstring)
        states[state_key] = state
    return powerSGD_hook(states[state_key], bucket)


def finish_compressed(future: torch.futures.Future, flat: torch.Tensor, group_size: int) -> None:
    """Wait for `start_compressed`'s future and scale its average back to a sum over the group (in `flat`).

    Raises:
        RuntimeError: the hook's collectives failed or timed out (the process group's timeout).
    """
    out = future.wait()
    out = out[0] if isinstance(out, (list, tuple)) else out
    if out.data_ptr() != flat.data_ptr():
        flat.copy_(out)
    flat.mul_(group_size)


_STATES: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""First parameter of a bucket -> {(bucket key, gradient sizes, codec): PowerSGDState}; freed with the parameter."""
