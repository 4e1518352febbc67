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

Transient buffers inside a kernel or a collective are not visible to these hooks; the figures are what a
memory model of training state and saved activations (ours: `cost_model.memory`) predicts.
"""
from __future__ import annotations

import torch

from parallelizer.rewriter.spec import ShardingSpec, all_axis_groups
from parallelizer.runtime.launch import create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.runtime.rehearsal import _loss as rehearsal_loss  # the model's loss, as rehearse takes it
from parallelizer.tracer.trace import trace


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
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    opt.step()
    optimizer, _ = _storage_bytes(t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))
    return {"params": params, "buffers": buffers, "activations": activations, "grads": grads,
            "optimizer": optimizer}
