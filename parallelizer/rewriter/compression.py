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
* Warm-up (`GradCompression.warmup`, torch's `start_powerSGD_iter`): the first `warmup` optimizer steps of a
  bucket are all-reduced exactly by the hook itself, compression starts at step `warmup` (0-based), with a
  zero error and a freshly drawn Q. torch's docs (`PowerSGDState`) recommend starting "with 10% of total
  training steps" because early training is sensitive to inexact gradients; torch's default is 1000 steps.
  torch refuses `start_powerSGD_iter <= 1` with error feedback, because DDP rebuilds its buckets after the
  first iteration; our buckets are never rebuilt (a different bucket gets a different state), so we set it
  after construction and allow 0 and 1 (0: compress from the first step, as the paper's Algorithm 1 does).
  A state counts steps by its own calls (torch's `maybe_increase_iter`, our bucket is always the last): one
  call per optimizer step, since a pipeline stage syncs once per step (`grad_sync.deferred_sync`).
* Both hooks AVERAGE over the group (DDP's convention); our sync SUMS, so the result is multiplied by the
  group size after the wait (`finish_compressed`).
* A compressing PowerSGD bucket is completed before `start_compressed` returns (backward waits for it). The
  hook issues its P and Q all-reduces from its futures' callbacks, i.e. from a gloo/nccl thread, while the
  main thread goes on issuing collectives on the same process group (the next bucket's all-reduce, a
  blocking activation all-reduce in backward): the ranks would then issue that group's collectives in
  different orders, and a collective matches its peers by order alone (a hang, or a sum of the wrong
  tensors when the sizes agree). Measured: two PowerSGD buckets in flight hung on 2 gloo ranks (torch
  2.13.0). Warm-up steps (one plain all-reduce, issued here on the main thread) stay asynchronous.

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
        warmup: PowerSGD only: optimizer steps all-reduced exactly before compression starts (>= 0; torch's
            `start_powerSGD_iter`, module docstring).
    Raises:
        ValueError: unknown kind, rank < 1, a seed that is not an int, or warmup < 0.
    """

    kind: str = "none"
    rank: int = 4
    seed: int = 0
    warmup: int = 0

    def __post_init__(self) -> None:
        if self.kind not in COMPRESSIONS:
            raise ValueError(f"GradCompression.kind={self.kind!r}: use one of {COMPRESSIONS}")
        if not (isinstance(self.rank, int) and self.rank >= 1) or not isinstance(self.seed, int):
            raise ValueError(f"GradCompression(rank={self.rank!r}, seed={self.seed!r}): rank must be an int >= 1 "
                             "and seed an int")
        if not (isinstance(self.warmup, int) and self.warmup >= 0):
            raise ValueError(f"GradCompression(warmup={self.warmup!r}): the exact steps before PowerSGD starts must "
                             "be an int >= 0")

    @property
    def lossy(self) -> bool:
        """Whether the codec changes the summed gradients (every kind but "none")."""
        return self.kind != "none"

    def deviates_within(self, steps: int) -> bool:
        """Whether `steps` gradient syncs of a bucket under this codec change the sum: a lossy kind, except
        PowerSGD whose warm-up (`warmup` syncs all-reduced exactly by the hook) covers them (a plan's default
        warm-up is 1000 steps: a rehearsal of a few steps is exact, and judged as such)."""
        return self.lossy and not (self.kind == "powersgd" and self.warmup >= steps)

    @property
    def spec(self) -> str:
        """The string form passed to the emitted program ("" for none; "bf16"; "powersgd:RANK:SEED", with
        ":WARMUP" appended when warmup > 0)."""
        if self.kind != "powersgd":
            return "" if self.kind == "none" else self.kind
        return f"powersgd:{self.rank}:{self.seed}" + (f":{self.warmup}" if self.warmup else "")

    @classmethod
    def parse(cls, spec: str) -> "GradCompression":
        """Inverse of `spec`. Raises ValueError for a malformed string."""
        if not isinstance(spec, str):
            raise ValueError("gradient compression must be a string ('', 'bf16' or 'powersgd:RANK:SEED[:WARMUP]'), got "
                             f"{type(spec).__name__} {spec!r}; pass a hierarchical rule as hierarchy=...")
        if not spec:
            return NO_COMPRESSION
        kind, *rest = spec.split(":")
        try:
            if len(rest) > 3 or (rest and kind != "powersgd"):
                raise ValueError("too many fields")
            return cls(kind, *(int(x) for x in rest))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"gradient compression {spec!r}: use '', 'bf16' or 'powersgd:RANK:SEED[:WARMUP]' "
                             f"({exc})") from None

    @classmethod
    def from_record(cls, record: dict) -> "GradCompression":
        """The codec a plan chose (`Plan.compression`, `planner.compression`); none for an empty record. A record
        without "warmup_steps" (plans of before the option) compresses from the first step."""
        chosen = record.get("chosen", "none") if record else "none"
        if chosen == "none":
            return NO_COMPRESSION
        return cls(chosen, int(record.get("rank", 4)), warmup=int(record.get("warmup_steps", 0)))


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
        """Views of the buffer shaped as the parameters (a 0-d parameter as (1,): the hook views dim 0); of a
        complex bucket's real view (`_codec_view`), each shaped as its parameter's `torch.view_as_real`."""
        pair = 2 if self._params and self._params[0].is_complex() else 1
        pieces = self._flat.split([p.numel() * pair for p in self._params])
        return [piece.view((*p.shape, 2) if pair == 2 else p.shape if p.dim() else (1,))
                for piece, p in zip(pieces, self._params)]


def _codec_view(flat: torch.Tensor) -> torch.Tensor:
    """The real tensor a codec compresses: `flat` itself, or the real and imaginary parts of a complex bucket
    interleaved (`torch.view_as_real`, a view: the hooks write through it). torch's hooks treat any buffer as
    real: bf16's cast dropped the imaginary parts (gradients 7.8e-2 off one device for an FNO weight on dp=2,
    reported as the codec's expected deviation), PowerSGD's reshape raised RuntimeError."""
    return torch.view_as_real(flat).view(-1) if flat.is_complex() else flat


def start_compressed(flat: torch.Tensor, params: list[torch.Tensor], group: dist.ProcessGroup,
                     compression: GradCompression, key: tuple) -> torch.futures.Future:
    """Start the compressed all-reduce of one bucket: `flat` (1-D, the gradients of `params` concatenated)
    is replaced in place by the codec's approximation of the AVERAGE over `group` when the returned future
    completes (`finish_compressed` turns it into the sum). `key` identifies the bucket within its pass
    (kept PowerSGD state, module docstring). A compressing PowerSGD bucket has completed on return.

    Raises:
        ValueError: compression "none" (use a plain all-reduce).
    """
    bucket = _BucketView(_codec_view(flat), params)
    if compression.kind == "bf16":
        return default_hooks.bf16_compress_hook(group, bucket)
    if compression.kind != "powersgd":
        raise ValueError(f"start_compressed: no codec for {compression}; all-reduce uncompressed buckets directly")
    states = _STATES.setdefault(params[0], {})
    state_key = (key, tuple(p.numel() for p in params), compression)
    state = states.get(state_key)
    if state is None:
        state = PowerSGDState(process_group=group, matrix_approximation_rank=compression.rank,
                              start_powerSGD_iter=2, min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
                              use_error_feedback=True, warm_start=True, random_seed=compression.seed,
                              compression_stats_logging_frequency=2**62)
        state.start_powerSGD_iter = compression.warmup  # our buckets are never rebuilt (module docstring)
        states[state_key] = state
    compressing = state.iter >= state.start_powerSGD_iter
    future = powerSGD_hook(state, bucket)
    if compressing:
        future.wait()  # its collectives come from callbacks: none may interleave with the caller's (docstring)
    return future


def finish_compressed(future: torch.futures.Future, flat: torch.Tensor, group_size: int) -> None:
    """Wait for `start_compressed`'s future and scale its average back to a sum over the group (in `flat`).

    Raises:
        RuntimeError: the hook's collectives failed or timed out (the process group's timeout).
    """
    out = future.wait()
    out = out[0] if isinstance(out, (list, tuple)) else out
    target = _codec_view(flat)
    if out.data_ptr() != target.data_ptr():
        target.copy_(out)
    flat.mul_(group_size)


_STATES: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""First parameter of a bucket -> {(bucket key, gradient sizes, codec): PowerSGDState}; freed with the parameter."""
