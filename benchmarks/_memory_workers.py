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
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

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
