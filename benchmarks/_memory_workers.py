"""Rank-side code of `benchmarks.bench_memory` (spawned functions must live in an importable module).

`measure_rank` builds one case's model on CPU, applies the planner's plan (`ParallelModule`) and measures what
this rank really holds, by category, in bytes:

- params / buffers: the local tensors registered on the ParallelModule (unique storages);
- activations: tensors autograd saves for backward during one forward, recorded with
  `torch.autograd.graph.saved_tensors_hooks` (unique storages, whole storage counted, parameter and buffer
  storages left out, inputs included), i.e. what is held when the forward has returned and backward begins (a
  storage freed after its forward use, as gathered FSDP parameters are, counts 0);
- grads: `.grad` of every local parameter after backward;
- optimizer: AdamW's state tensors after one step (exp_avg, exp_avg_sq; the 0-d `step` counters too).

`measure_pipeline_rank` does the same for a pipeline plan during one pipeline step, with the PEAK of the saved
tensors alive at once (microbatches in flight as the schedule interleaves them), tracked by saved-tensor hooks
whose packed objects live exactly as long as autograd keeps the tensor.

Transient buffers inside a kernel or a collective are not visible to these hooks; the figures are what a
memory model of training state and saved activations (ours: `cost_model.memory`) predicts.

`measure_peak_rank` measures the TRUE peak of a training step instead (`LiveStorages`: every storage alive as the
step's ops run), what `planner.peak` prices (round 25, r25c).
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from parallelizer.runtime.pipeline_rehearsal import pipeline_run
from parallelizer.rewriter.spec import ShardingSpec, all_axis_groups
from parallelizer.runtime.launch import create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.runtime.rehearsal import _loss as rehearsal_loss  # the model's loss, as rehearse takes it
from parallelizer.tracer.trace import trace
from parallelizer.runtime.zero1 import plan_optimizer


def _storage_bytes(tensors) -> tuple[int, set[int]]:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values()), set(seen)


def measure_rank(rank: int, world_size: int, cases: list[tuple]) -> list[dict]:
    """For each (model_fn, model_kwargs, spec) case: this rank's bytes by category (module docstring)."""
    out = []
    for model_fn, kwargs, spec in cases:
        out.append(_measure(rank, model_fn, kwargs, spec))
    return out


def _measure(rank: int, model_fn, model_kwargs: dict, spec: ShardingSpec) -> dict:
    model, inputs, *rest = model_fn(**model_kwargs)
    kwargs = rest[0] if rest else {}
    traced = trace(model, inputs, kwargs)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(traced, spec, rank, model, grad_bucket_bytes=0)
    params, param_ptrs = _storage_bytes(pm.parameters())
    buffers, buffer_ptrs = _storage_bytes(pm.buffers())
    state = param_ptrs | buffer_ptrs
    saved: list[torch.UntypedStorage] = []

    def pack(t: torch.Tensor):
        saved.append(t.untyped_storage())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = pm(*inputs, **kwargs)
    loss = rehearsal_loss(output)
    # measured when forward has returned: storages freed after their forward use (reshard) count 0 bytes
    activations = sum({s.data_ptr(): s.nbytes() for s in saved if s.data_ptr() not in state}.values())
    loss.backward()
    grads, _ = _storage_bytes(p.grad for p in pm.parameters() if p.grad is not None)
    opt = plan_optimizer(pm.parameters(), spec, pm, 1e-3, 1e-8)  # ZeroRedundancyOptimizer for a zero1 plan
    opt.step()
    held = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer: the state of this rank's partition
    optimizer, _ = _storage_bytes(t for st in held.state.values() for t in st.values() if isinstance(t, torch.Tensor))
    return {"params": params, "buffers": buffers, "activations": activations, "grads": grads,
            "optimizer": optimizer}


class _Held:
    """A tensor saved for backward, as packed by the saved-tensor hook: it lives exactly as long as autograd
    keeps the saved tensor (until the backward of its microbatch has run and released the graph)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _LiveSaved:
    """Saved-tensor hooks that track the bytes of the storages autograd holds for backward, live, and their
    peak over a pipeline step: a storage counts while any saved tensor on it is alive, once; parameter and
    buffer storages (`resident`) are left out."""

    def __init__(self, resident: set[int]) -> None:
        self.resident, self.live, self.now, self.peak = resident, {}, 0, 0

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr in self.resident or nbytes == 0:
            return t
        count, _ = self.live.get(ptr, (0, nbytes))
        if count == 0:
            self.now += nbytes
            self.peak = max(self.peak, self.now)
        self.live[ptr] = (count + 1, nbytes)
        held = _Held(t)
        weakref.finalize(held, self._release, ptr)
        return held

    def _release(self, ptr: int) -> None:
        count, nbytes = self.live[ptr]
        if count == 1:
            del self.live[ptr]
            self.now -= nbytes
        else:
            self.live[ptr] = (count - 1, nbytes)

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held


def measure_pipeline_rank(rank: int, world_size: int, cases: list[tuple]) -> list[dict]:
    """For each (model_fn, model_kwargs of the GLOBAL batch, intra-stage spec, pipeline section dict) case: what
    this rank holds during one pipeline step (`runtime.pipeline.build`, as `rehearse` runs it), by category:
    params / buffers of its stage modules, grads after the step, AdamW state after one optimizer step, and the
    PEAK of the tensors saved for backward live during the step (`_LiveSaved`: microbatches in flight as the
    schedule really interleaves them)."""
    return [_measure_pipeline(*case) for case in cases]


def _measure_pipeline(model_fn, model_kwargs: dict, spec: ShardingSpec, pipe: dict) -> dict:
    torch.manual_seed(0)
    model, inputs, *rest = model_fn(**model_kwargs)
    run, _, flat, batch = pipeline_run(model, inputs, rest[0] if rest else {}, spec, pipe)
    params, param_ptrs = _storage_bytes(p for s in run.stages for p in s.parameters())
    buffers, buffer_ptrs = _storage_bytes(b for s in run.stages for b in s.buffers())
    hooks = _LiveSaved(param_ptrs | buffer_ptrs)
    with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
        run.step(*flat, target=torch.zeros(batch))
    grads, _ = _storage_bytes(p.grad for s in run.stages for p in s.parameters() if p.grad is not None)
    opt = torch.optim.AdamW([p for s in run.stages for p in s.parameters()], lr=1e-3)
    opt.step()
    optimizer, _ = _storage_bytes(t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))
    dist.barrier()
    return {"params": params, "buffers": buffers, "activations": hooks.peak, "grads": grads,
            "optimizer": optimizer}


class LiveStorages(TorchDispatchMode):
    """The bytes of every tensor storage alive, and their peak, as the ops of a training step run: each op's output
    storages are counted once from the op that makes them until torch frees them (a C++ weak reference,
    `StorageWeakRef`, checked before every op), on every thread the step's ops are dispatched from (the autograd
    engine runs a CPU backward on the caller's thread, the mode goes with it); an op's output on a storage it was
    given (an in-place op, a view) is not new. So the peak sees activations,
    activation gradients, parameter gradients, gradient buckets, gathered FSDP parameters, collective outputs and
    optimizer temporaries as they live; storages made before the mode was entered are not counted (the caller adds
    the parameters and buffers), nor buffers an op uses internally and frees before it returns (kernel workspace).

    Why not torch.profiler(profile_memory=True): its [memory] events are recorded only on the thread that started
    it, and a storage handed to a gloo collective is often freed on gloo's thread: the running total of a 2-rank
    FSDP step kept 0.6-4 MB per step of such frees (round 25, r25c), a drift that grows with the steps."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0
        self.peak_op = ""

    def _sweep(self) -> None:
        """Drop the freed storages and take every live one's CURRENT size: a storage resized in place (an FSDP
        gathered parameter released to 0 bytes after forward and refilled in backward, `rewriter.reshard`) counts
        what it holds now. Round 26 (r26c): the size at creation was counted until the storage died, so a released
        gathered weight still counted whole from its forward to the end of backward."""
        self.now = 0
        for k, (ref, _) in list(self.live.items()):
            if ref.expired():
                del self.live[k]
                continue
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            nbytes = storage.nbytes() if storage is not None else 0
            self.live[k] = (ref, nbytes)
            self.now += nbytes

    def live_bytes(self) -> int:
        """The bytes of the storages the tracker saw made that are alive now (the peak is kept)."""
        self._sweep()
        return self.now

    def reset_peak(self) -> None:
        """Start a new peak from the bytes alive now."""
        self._sweep()
        self.peak = self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._sweep()
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage()._cdata for t in torch.utils._pytree.tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor) and t.device.type == "cpu"}
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self.live and key not in given and storage.nbytes():  # new, not an in-place result
                    # (a storage refilled in place, `rewriter.reshard`, is one the tracker knows: its size is re-read)
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.now += storage.nbytes()
        if self.now > self.peak:
            phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward/step"
            self.peak, self.peak_op = self.now, f"{func} ({phase})"
        return out


def measure_peak_rank(rank: int, world_size: int, cases: list[tuple]) -> list[dict]:
    """For each (model_fn, model_kwargs, spec) case: this rank's TRUE peak of one training step (not a sum of kinds).
    The step (forward, the model's loss backward, AdamW step, `zero_grad(set_to_none=True)`) runs twice under
    `LiveStorages`; the second step's peak = the module's local parameters and buffers that the tracker did not see
    made (unique storages) + the peak of the storages alive during the second step, which counts the optimizer
    state and the gradient buckets the first step made and keeps. The input batch is made inside each step (the
    program's first activation); the output is held through the step. Returns per case {"peak": bytes, "static":
    parameters + buffers, "after": bytes held after the second step, "at": the op (and phase) at the peak,
    "backward_end": bytes held when the second step's backward has returned, its loss and output still held}."""
    out = []
    for model_fn, model_kwargs, spec in cases:
        torch.manual_seed(0)
        model, inputs, *rest = model_fn(**model_kwargs)
        kwargs = rest[0] if rest else {}
        traced = trace(model, inputs, kwargs)
        create_groups(all_axis_groups(spec.mesh))
        pm = ParallelModule(traced, spec, rank, model)  # the default gradient buckets, as a user runs it
        del model
        opt = plan_optimizer(pm.parameters(), spec, pm, 1e-3, 1e-8)
        tracker = LiveStorages()
        with tracker:
            for step in range(2):
                tracker.reset_peak()
                args = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
                kw = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
                output = pm(*args, **kw)  # held through the step, as a loop reading `out.loss` holds it
                loss = rehearsal_loss(output)
                loss.backward()
                backward_end = tracker.live_bytes()  # its loss and output still held, as a loop holds them
                opt.step()
                opt.zero_grad(set_to_none=True)
                del args, kw, loss, output
            peak, peak_op = tracker.peak, tracker.peak_op
            tracker.reset_peak()  # sweeps what the step freed last
        # parameters and buffers the tracker did not see made (a module may make its local tensors at first use)
        static = sum({s._cdata: s.nbytes() for s in (t.untyped_storage() for t in (*pm.parameters(), *pm.buffers()))
                      if s._cdata not in tracker.live}.values())
        dist.barrier()
        out.append({"peak": static + peak, "static": static, "after": static + tracker.now, "at": peak_op,
                    "backward_end": static + backward_end})
        del pm, opt
    return out


def measure_pipeline_peak_rank(rank: int, world_size: int, cases: list[tuple]) -> list[dict]:
    """For each (model_fn, model_kwargs of the GLOBAL batch, intra-stage spec, pipeline section dict) case: this
    rank's TRUE peak of a pipeline training step (`LiveStorages`, as `measure_peak_rank`): the second of two steps
    (the schedule's forwards and backwards of every microbatch, AdamW, `zero_grad(set_to_none=True)`), + the stage
    modules' parameters and buffers the tracker did not see made. Returns per case {"peak", "static", "at"}."""
    out = []
    for model_fn, model_kwargs, spec, pipe in cases:
        torch.manual_seed(0)
        model, inputs, *rest = model_fn(**model_kwargs)
        run, _, flat, batch = pipeline_run(model, inputs, rest[0] if rest else {}, spec, pipe)
        del model
        params = [p for s in run.stages for p in s.parameters()]
        opt = torch.optim.AdamW(params, lr=1e-3)
        tracker = LiveStorages()
        with tracker:
            for _ in range(2):
                tracker.reset_peak()
                run.step(*[t.clone() for t in flat], target=torch.zeros(batch))
                opt.step()
                opt.zero_grad(set_to_none=True)
            peak, peak_op = tracker.peak, tracker.peak_op
            tracker.reset_peak()
        state = (*params, *(b for s in run.stages for b in s.buffers()))
        static = sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in state
                      if t.untyped_storage()._cdata not in tracker.live}.values())
        dist.barrier()
        out.append({"peak": static + peak, "static": static, "at": peak_op})
        del run, opt
    return out
