"""Bucketed, asynchronous gradient all-reduce of replicated parameters (DDP-style overlap).

`collectives.grad_all_reduce` all-reduces a gradient synchronously inside backward, one parameter at a
time: backward waits for each. For a parameter (a leaf tensor) nothing downstream in backward needs the
reduced gradient, only the optimizer does, so `grad_all_reduce_bucketed` instead:
1. in backward, takes this rank's partial gradient of the parameter (the conjugate of forward identity, as
   for `grad_all_reduce`), appends it to an open bucket of its (process group, dtype, device), and returns
   no gradient to autograd for this use of the parameter;
2. when a bucket holds `bucket_bytes` or more, flattens it and starts an asynchronous all-reduce (sum)
   while backward goes on computing (gloo and nccl run it on their own threads/streams); the first bucket
   of a pass is started at `FIRST_BUCKET_BYTES` already, so that communication starts early (as DDP does);
3. at the end of the backward pass (a final callback of autograd's engine, as DDP's reducer does), starts
   the open buckets, waits for every all-reduce, and adds each reduced gradient to `param.grad`, or, when
   `param.grad` is None, makes `param.grad` a view of the reduced bucket (no copy, as DDP's
   `gradient_as_bucket_view=True`). Float16 / bfloat16 gradients are summed in a float32 bucket and rounded
   once into `param.grad` (`core.redistribute.sum_dtype`; round 24, r24b), as one device accumulates them:
   DDP's bucket in their own dtype rounds after every rank's addition and overflows float16 at 65504.

A bucket is flattened into a buffer kept from one pass to the next (like DDP's bucket tensors): a fresh
allocation of tens of MB is page-faulted in on every step, measured at ~17 ms for 32 MB on this machine
against ~2.6 ms for a copy into a kept buffer. A kept buffer is reused only while nothing else references
its storage (torch's storage use count): while `.grad` views of it are alive (no `zero_grad(set_to_none=
True)` in between, or a caller kept a gradient), the pass flattens into a new buffer instead, so a gradient
handed out is never overwritten. The buffers live as long as the bucket's first parameter, so their memory
is about one copy of the gradients synced this way, as for DDP.

The result equals `grad_all_reduce` up to the summation order of floats: the sum over ranks of this use's
partial gradients, added to whatever autograd accumulated from the parameter's other uses; gradient
accumulation over several backward passes works (each pass adds its own reduced sum). When autograd will
not accumulate into `param.grad` in this pass (`torch.autograd.grad(...)`, `backward(inputs=...)` without
this parameter, a pipeline schedule's split input/weight backward), the gradient is reduced synchronously
and returned, exactly like `grad_all_reduce`.

Bucket contents depend on the order gradients arrive, which is the same on every rank of a group because
the ranks run the same program structure (SPMD); open buckets are started in a fixed (sorted) order.

Waits are bounded by the process group's timeout (`runtime.spawn(timeout_s=...)`, `init_from_env`). A
backward pass that raises never reaches its end callback: its buckets are dropped at the next forward use
outside a backward pass (one backward at a time per process, as for DDP).

With a gradient codec (`compression`, a `rewriter.compression.GradCompression` spec string), step 2 runs
torch's DDP communication hook for it on the bucket (bf16 all-reduce, or PowerSGD with error feedback and
warm start, after its exact warm-up steps; `rewriter.compression`) and step 3 waits for its future and scales
the hook's average back to a sum. A compressing PowerSGD bucket is completed at step 2 already (backward waits:
its collectives come from the hook's callbacks and must not interleave with backward's). The synchronous
fallbacks below stay exact (uncompressed).

Deferred sync (gradient accumulation over microbatches, as DDP's `no_sync()`): inside `deferred_sync(False)`
the gradient of a use is returned to autograd unreduced, so it accumulates locally in `param.grad` (no
collective); inside `deferred_sync(True)` (the step's last backward) the use's gradient plus the locally
accumulated `param.grad` (then cleared) is reduced once, by the same bucketed path and codec, and the result
lands in `param.grad`. So one optimizer step all-reduces each gradient once however many backward passes it
accumulates, and a codec (PowerSGD) compresses the step's gradient, not each microbatch's. Float16 / bfloat16
gradients accumulate in a float32 running sum instead of `.grad` when the caller moves them there after each
earlier pass (`widen_grads`: a pipeline stage does); the last pass folds it in, the bucket sums it in float32, and
it is rounded once into `.grad` (round 26; before, the microbatch gradients added up in the narrow dtype).
The caller must hold back a `.grad` already reduced before the first deferred pass (`runtime.pipeline` takes
the gradients off at the start of a step and adds them back at its end), or it would be reduced again. Outside any
`deferred_sync` context nothing changes (every backward pass reduces its own gradient).

The default bucket size is DistributedDataParallel's `bucket_cap_mb=25` (torch.nn.parallel docs), the
first bucket's size DDP's `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB).
Private torch API (checked on torch 2.13.0): `torch._C._current_graph_task_id`,
`torch._C._will_engine_execute_node` (used by torch.utils.checkpoint), the engine's `queue_callback` (used
by DistributedDataParallel) and `torch._C._storage_Use_Count` (used by torch._inductor's cudagraph trees).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
import torch.fx
from torch.autograd import Variable
from torch.utils.weak import WeakIdKeyDictionary

from ..core.redistribute import sum_dtype
from .collectives import Group, _Conjugate, _GroupView, _identity, _resolve, _sum, grad_all_reduce
from .compression import GradCompression, finish_compressed, start_compressed
from .hierarchical import HierarchicalAllReduce, Hierarchy

__all__ = ["DEFAULT_BUCKET_BYTES", "FIRST_BUCKET_BYTES", "bucket_sizes", "deferred_sync", "grad_all_reduce_bucketed",
           "narrow_grads", "runtime_buckets", "wide_grad", "widen_grads"]

DEFAULT_BUCKET_BYTES = 25 * 2**20
"""25 MiB: DistributedDataParallel's default bucket_cap_mb."""
FIRST_BUCKET_BYTES = 2**20
"""1 MiB: the size at which the first bucket of a backward pass is started (DDP's first-bucket size)."""


def bucket_sizes(nbytes: float, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[float]:
    """The buckets (bytes, in the order they start) that one backward pass's `nbytes` of gradients fill on one
    process group: the first at `FIRST_BUCKET_BYTES`, then `bucket_bytes` each, the rest in the last one. The
    runtime closes a bucket at the first whole gradient that reaches the size, so real buckets are this large
    or a little larger (the planner's model of them). [] for nbytes <= 0."""
    sizes, left, size = [], float(nbytes), float(min(bucket_bytes, FIRST_BUCKET_BYTES))
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
        size = float(bucket_bytes)
    return sizes


def runtime_buckets(steps, k: int, is_parameter: bool) -> bool:
    """Whether the runtime runs step `k` of a parameter's edge (`core.redistribute.edge_steps`, in order) as the
    bucketed asynchronous all-reduce of this module: only a `grad_all_reduce` applied to the parameter itself,
    i.e. the FIRST step of the edge of a parameter (`rewriter.apply`'s `_emit_step` buckets a step whose input
    is a trainable parameter's placeholder). A later `grad_all_reduce` of the same edge (the second mesh axis of
    a parameter replicated on two axes, `grad_all_reduce[dp]` then `grad_all_reduce[tp]`; one after a ZeRO-3
    all-gather) takes the output of the step before, not a leaf, and is emitted as the synchronous
    `collectives.grad_all_reduce`: one blocking all-reduce per parameter in backward. The planner prices
    exactly this (`planner.costs.Pricer.edge_step_times`, `planner.steptime.estimate_step_time`): found in round
    19 (r19f), where every such step was priced as a share of an overlapped bucket, which under-priced the
    4-rank 2x2 plans of llama / GPT-2 by 32-34%."""
    return is_parameter and k == 0 and bool(steps) and steps[0].kind == "grad_all_reduce"


def grad_all_reduce_bucketed(param: torch.Tensor, ranks: Group, bucket_bytes: int, compression: str = "",
                             hierarchy: Hierarchy | None = None) -> torch.Tensor:
    """Replicate parameter -> Replicate used on different data (DDP). Forward: identity. Backward: the
    gradient is summed over `ranks` by a bucketed asynchronous all-reduce and added to `param.grad` at the
    end of the backward pass (module docstring); with `compression` (`GradCompression.spec`, "" = none) the
    bucket goes through that codec (a lossy approximation of the sum).

    Falls back to `grad_all_reduce` (synchronous, gradient returned to autograd) when `param` is not a leaf
    that requires grad, grad mode is off, or `param` has hooks (`register_hook`,
    `register_post_accumulate_grad_hook`: they then see the summed gradient, as with `grad_all_reduce`);
    and, in backward, under `create_graph=True` (double backward). Local shapes: unchanged.

    With the plan's `hierarchy` rule for the group (`rewriter.hierarchical`), a bucket whose bytes the rule
    marks runs the two-level all-reduce (`_start_all_reduce`).

    Raises:
        ValueError: bucket_bytes < 1; bad `ranks`, or the calling rank is not in it; a malformed `compression`.
        DistributedError: torch.distributed not initialised, or no process group with these ranks.
    """
    if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"grad_all_reduce_bucketed: bucket_bytes must be a positive int, got {bucket_bytes!r}")
    codec = GradCompression.parse(compression)
    g = _resolve(ranks, "grad_all_reduce_bucketed", hierarchy)
    if _PASSES and torch._C._current_graph_task_id() == -1:
        _PASSES.clear()  # passes whose backward raised (their end callback never ran); none runs outside backward
    if not (param.is_leaf and param.requires_grad and torch.is_grad_enabled()) or g.size == 1 or _has_hooks(param):
        return grad_all_reduce(param, ranks, hierarchy)
    accumulator = param.view_as(param).grad_fn.next_functions[0][0]  # the AccumulateGrad node of `param`
    return _Deferred.apply(param, accumulator, g, bucket_bytes, codec)


class _Deferred(torch.autograd.Function):
    @staticmethod
    def forward(ctx, param, accumulator, g, bucket_bytes, codec):  # type: ignore[override]
        ctx.param, ctx.accumulator, ctx.g, ctx.bucket_bytes, ctx.codec = param, accumulator, g, bucket_bytes, codec
        return param.view_as(param)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph: reduced at once, never deferred, and differentiable
            return _Conjugate.apply(grad, partial(_sum, g=ctx.g), _identity), None, None, None, None
        if _DEFERRAL.final is False:  # a step's earlier backward: accumulate locally, no collective
            return grad, None, None, None, None
        if _DEFERRAL.final:  # the step's last backward: reduce this use's gradient with the accumulated one
            grad = _fold_in_accumulated(ctx.param, grad)
        if not _accumulates(ctx.accumulator):  # no .grad written by this pass (the caller adds what we return)
            return _sum(grad, ctx.g), None, None, None, None
        _PassSync.current().add(ctx.param, grad, ctx.g, ctx.bucket_bytes, ctx.codec)
        return None, None, None, None, None


class _Deferral:
    final: bool | None = None
    """None: every backward pass reduces its gradients; False: accumulate locally; True: reduce the whole step's."""


_DEFERRAL = _Deferral()
"""The process's deferral state (`deferred_sync`); one backward at a time per process, as for DDP."""


@contextmanager
def deferred_sync(final: bool):
    """Backward passes run in this context defer the bucketed gradient sync to the last of them (DDP's
    `no_sync()` for all but the last microbatch): `final=False` returns each gradient to autograd unreduced
    (it accumulates in `param.grad` locally, no collective); `final=True` reduces (this pass's gradient +
    `param.grad`), clearing `param.grad` first, so `param.grad` ends up holding the reduced sum of the whole
    accumulation. The caller must take off any `.grad` that was already reduced before the first deferred
    pass (module docstring). Nests; restores the previous state on exit. Synchronous fallbacks
    (`grad_all_reduce`: hooks, non-leaf) are not deferred. Raises TypeError for a non-bool `final`."""
    if not isinstance(final, bool):
        raise TypeError(f"deferred_sync: final must be a bool, got {final!r}")
    previous, _DEFERRAL.final = _DEFERRAL.final, final
    try:
        yield
    finally:
        _DEFERRAL.final = previous


def _fold_in_accumulated(param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """`grad` + the locally accumulated gradient (`param.grad` and the float32 running sum of `widen_grads`),
    both cleared (the reduced sum replaces them). With a running sum the result is float32: the bucket sums it in
    float32 and `_PassSync.finish` rounds it once into `param.grad`."""
    wide = _WIDE.pop(param, None)
    if param.grad is None and wide is None:
        return grad
    with torch.no_grad():
        total = grad if wide is None else wide.add_(grad)
        if param.grad is not None:
            total = total + param.grad
            param.grad = None
    return total


def widen_grads(params) -> None:
    """Move each parameter's `.grad` whose sum runs wider (`core.redistribute.sum_dtype`: float16 / bfloat16 in
    float32) into its float32 running sum of the step and set `.grad` to None, so that the next backward pass
    writes a fresh gradient instead of adding to it in the narrow dtype. A pipeline step calls this after every
    backward pass of a stage but its last (`runtime.pipeline._SyncOnceStage`, `runtime.bitpipe`): the microbatch
    gradients then add in float32 and are rounded once (`narrow_grads`, or the deferred dp sync's
    `_fold_in_accumulated`), as one device's backward of the whole batch accumulates them in its kernels. Before
    (round 24's note), autograd added each microbatch's gradient into `.grad` in float16: 2048 + 1 + 1 - 2048
    over 4 microbatches gave 0 where one device gives 2. Other dtypes are left as they are."""
    with torch.no_grad():
        for p in params:
            if p.grad is None or sum_dtype(p.dtype) == p.dtype:
                continue
            grad, p.grad = p.grad, None
            wide = _WIDE.get(p)
            _WIDE[p] = grad.to(sum_dtype(p.dtype)) if wide is None else wide.add_(grad)


def wide_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The parameter's gradient of the step so far in the dtype it is summed in (`sum_dtype`): its float32 running
    sum (`widen_grads`) plus `.grad`, both cleared; `.grad` itself when there is no running sum (None if neither)."""
    wide = _WIDE.pop(param, None)
    grad, param.grad = param.grad, None
    if wide is None:
        return grad
    return wide if grad is None else wide.add_(grad)


def narrow_grads(params) -> None:
    """Round each parameter's float32 running sum (`widen_grads`) plus its `.grad` once into `.grad`, in the
    parameter's dtype (the end of a pipeline stage's backward passes in a step). Parameters without one: unchanged."""
    with torch.no_grad():
        for p in params:
            if p in _WIDE:
                p.grad = wide_grad(p).to(p.dtype)


def _has_hooks(param: torch.Tensor) -> bool:
    """Whether gradient hooks are registered on `param` (they must see its summed gradient as autograd
    delivers it, so its sync stays synchronous)."""
    return bool(param._backward_hooks) or bool(getattr(param, "_post_accumulate_grad_hooks", None))


def _accumulates(accumulator) -> bool:
    """Whether the running backward pass writes the parameter's `.grad` (runs its AccumulateGrad node).
    torch raises RuntimeError for a leaf's node under `torch.autograd.grad(...)`, which never writes `.grad`."""
    try:
        return torch._C._will_engine_execute_node(accumulator)
    except RuntimeError:
        return False


@dataclass
class _Bucket:
    params: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    nbytes: int = 0
    group: _GroupView | None = None


@dataclass
class _Launched:
    key: tuple
    params: list[torch.Tensor]
    flat: torch.Tensor
    work: dist.Work | HierarchicalAllReduce | torch.futures.Future  # Future: a codec reduces the bucket
    group_size: int = 0  # > 0: scale the codec's average back to a sum over this many ranks


@dataclass
class _PassSync:
    """The gradient buckets of one backward pass (one autograd graph task)."""

    open: dict[tuple, _Bucket] = field(default_factory=dict)
    launched: list[_Launched] = field(default_factory=list)

    @staticmethod
    def current() -> "_PassSync":
        """The sync of the running backward pass; the first call of a pass queues `finish` to run at its end."""
        task = torch._C._current_graph_task_id()
        if task not in _PASSES:
            _PASSES[task] = _PassSync()
            Variable._execution_engine.queue_callback(lambda: _PASSES.pop(task).finish())
        return _PASSES[task]

    def add(self, param: torch.Tensor, grad: torch.Tensor, g: _GroupView, bucket_bytes: int,
            codec: GradCompression) -> None:
        key = (g.name, str(grad.dtype), str(grad.device), codec)
        bucket = self.open.setdefault(key, _Bucket(group=g))
        bucket.params.append(param)
        bucket.grads.append(grad)
        bucket.nbytes += grad.numel() * (grad.dtype if codec.lossy else sum_dtype(grad.dtype)).itemsize  # as summed
        first = not any(launched.key == key for launched in self.launched)
        if bucket.nbytes >= (min(bucket_bytes, FIRST_BUCKET_BYTES) if first else bucket_bytes):
            self._launch(key)

    def _launch(self, key: tuple) -> None:
        bucket = self.open.pop(key)
        flat = _buffer(bucket, (len(self.launched), *key))
        torch.cat([t.reshape(-1) for t in bucket.grads], out=flat)
        codec = key[3]
        if codec.lossy:  # a codec runs torch's DDP hook on the whole (flat) group; never two-level
            group = dist.distributed_c10d._resolve_process_group(key[0])
            work = start_compressed(flat, bucket.params, group, codec, (len(self.launched), *key))
            self.launched.append(_Launched(key, bucket.params, flat, work, group.size()))
        else:
            self.launched.append(_Launched(key, bucket.params, flat, _start_all_reduce(flat, bucket.group, self.launched)))

    def finish(self) -> None:
        """Start the open buckets, wait for all, add each reduced gradient to its parameter's `.grad`."""
        for key in sorted(self.open):
            self._launch(key)
        with torch.no_grad():
            for launched in self.launched:
                if launched.group_size:
                    finish_compressed(launched.work, launched.flat, launched.group_size)
                else:
                    launched.work.wait()
                pieces = launched.flat.split([p.numel() for p in launched.params])
                for param, piece in zip(launched.params, pieces):
                    piece = piece.view(param.shape).to(param.dtype)  # a view unless summed wider (`_buffer`)
                    if param.grad is None:
                        param.grad = piece
                    else:
                        param.grad += piece


def _start_all_reduce(flat: torch.Tensor, g: _GroupView,
                      launched: list[_Launched]) -> dist.Work | HierarchicalAllReduce:
    """Start the asynchronous all-reduce (sum) of a bucket: flat, or two-level where the group's hierarchical rule
    says so for its bytes. Each start first moves every two-level all-reduce in flight on to its next phase
    (`HierarchicalAllReduce.advance`), so their phases overlap backward too; all ranks start the same buckets
    in the same order, so they issue the phases in the same order."""
    for earlier in launched:
        if isinstance(earlier.work, HierarchicalAllReduce):
            earlier.work.advance()
    if g.two_level("all_reduce", flat.numel() * flat.element_size()):
        return HierarchicalAllReduce(flat, g.levels)
    return dist.all_reduce(flat, group=dist.distributed_c10d._resolve_process_group(g.name), async_op=True)


def _buffer(bucket: _Bucket, key: tuple) -> torch.Tensor:
    """The kept flat buffer for `bucket`, the `key[0]`-th bucket started in its pass (unique in the pass); a
    new one when the kept one's storage is still referenced (e.g. by `.grad` views of the last pass)."""
    sizes = tuple(g.numel() for g in bucket.grads)
    kept = _BUFFERS.setdefault(bucket.params[0], {})
    entry = kept.get((key, sizes))
    if entry is None or _use_count(entry[0]) > entry[1]:
        grad = bucket.grads[0]
        dtype = grad.dtype if key[-1].lossy else sum_dtype(grad.dtype)  # float16 / bfloat16 sum in float32
        buffer = torch.empty(sum(sizes), dtype=dtype, device=grad.device)
        entry = kept[(key, sizes)] = (buffer, _use_count(buffer))
    return entry[0]


def _use_count(t: torch.Tensor) -> int:
    """How many tensors reference the storage of `t` (plus constant bookkeeping; compare, do not interpret)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


_WIDE: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""Parameter -> float32 running sum of its gradients over the backward passes of the running step that
`widen_grads` took off `.grad` (not reduced over ranks yet); consumed by `narrow_grads`, `wide_grad` or the
deferred sync's `_fold_in_accumulated`."""
_PASSES: dict[int, _PassSync] = {}
"""Backward passes in flight on this process (graph task id -> its buckets); emptied at each pass's end."""
_BUFFERS: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""First parameter of a bucket -> {(bucket key, gradient sizes): (kept flat buffer, its storage use count when
only the buffer held it)}; freed with the parameter."""

torch.fx.wrap("grad_all_reduce_bucketed")
