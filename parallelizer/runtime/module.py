"""`ParallelModule`: a rank's sharded program with its local parameter shards, usable like the model.

`parameters()` are the local shards (any torch optimizer steps on them); `forward` takes the same inputs
as the original model (global tensors: each rank slices what it needs) and returns the same structure.
`full_state_dict()` gathers a state dict with the original FQNs (tied aliases included) that loads into the
unparallelised model with strict=True; `load_full_state_dict()` does the reverse.
"""
from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from ..rewriter.apply import RankProgram, rewrite
from ..rewriter.grad_sync import DEFAULT_BUCKET_BYTES
from ..rewriter.spec import ShardingSpec, mesh_coords
from ..errors import PlanMismatchError
from ..rewriter.state import gather_tensor, init_local_shard, shard_tensor
from ..rewriter.verify import verify
from ..tracer.graph import TracedGraph


class ParallelModule(torch.nn.Module):
    """The sharded model of one rank.

    Attributes:
        program: the `RankProgram` (its `graph_module.code` shows every collective with its ranks).
        traced, spec: what the program was made from.
    Parameters and buffers are registered under their original FQNs (canonical names for tied ones).
    A `model` on the `meta` device gets each parameter's local shard initialised on this rank alone
    (`rewriter.state.init_local_shard`, seed `init_seed`): the full tensor never exists anywhere.
    Gradients of replicated parameters (DDP) are all-reduced in buckets of `grad_bucket_bytes` (default
    25 MiB, as DistributedDataParallel) asynchronously during backward and are complete in `.grad` when
    `backward()` returns; `grad_bucket_bytes=0` all-reduces each one synchronously instead
    (`rewriter.grad_sync`).
    Raises PlanMismatchError for a buffer left on `meta` (its values cannot be invented).
    """

    def __init__(self, traced: TracedGraph, spec: ShardingSpec, rank: int, model: torch.nn.Module,
                 init_seed: int = 0, grad_bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        super().__init__()
        self.traced, self.spec, self.rank = traced, spec, rank
        self.program: RankProgram = rewrite(traced, spec, rank, grad_bucket_bytes=grad_bucket_bytes)
        verify(self.program, traced, spec)
        self.coords = mesh_coords(spec.mesh, rank)
        self.groups = self.program.groups
        full = {**dict(model.named_parameters()), **dict(model.named_buffers()), **traced.constant_values()}
        for fqn in self.program.state_fqns:
            local = self._local(fqn, full[fqn].detach(), init_seed)
            if self.traced.parameters[fqn].is_buffer:  # lifted constants: per-rank copies, not in the state dict
                _owner(self, fqn).register_buffer(fqn.rpartition(".")[2], local,
                                                  persistent=not self.traced.parameters[fqn].is_constant)
            else:
                _owner(self, fqn).register_parameter(fqn.rpartition(".")[2], torch.nn.Parameter(local))

    def _local(self, fqn: str, full: torch.Tensor, seed: int) -> torch.Tensor:
        """This rank's shard: cut from a real tensor, or initialised in place for a parameter on `meta`."""
        layout = self.spec.params[fqn]
        if full.device.type != "meta":
            return shard_tensor(full, layout, self.spec.mesh, self.coords)
        if self.traced.parameters[fqn].is_constant:
            raise PlanMismatchError(
                f"{fqn!r} {tuple(full.shape)}, a tensor created inside forward, was traced on the meta device, so "
                "its values are unknown; build the model on CPU to run it (a plan made on meta still applies: "
                "auto_parallelize(model, inputs, plan=plan))")
        if self.traced.parameters[fqn].is_buffer:
            raise PlanMismatchError(
                f"buffer {fqn!r} {tuple(full.shape)} is on the meta device, so its values are unknown; build the "
                "modules that own buffers on CPU (buffers are small), or load them with load_full_state_dict")
        return init_local_shard(fqn, tuple(full.shape), full.dtype, layout, self.spec.mesh, self.coords, seed=seed)

    def _state(self) -> list[torch.Tensor]:
        return [self.get_parameter(f) if not self.traced.parameters[f].is_buffer else self.get_buffer(f)
                for f in self.program.state_fqns]

    def forward(self, *args, **kwargs):
        """Run the sharded program on global inputs; returns the model's output structure."""
        spec = self.traced.exported.call_spec
        tensors = self.traced.tensor_inputs(args, kwargs)  # constants (bool, float, str...) checked, then dropped
        out = self.program.graph_module(*self._state(), *tensors)
        return pytree.tree_unflatten(list(out), spec.out_spec) if spec.out_spec is not None else out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Gather every parameter and buffer to its full tensor (collective: call on all ranks).

        Keys are the original FQNs including tied aliases, so `model.load_state_dict(sd, strict=True)`
        works on the unparallelised model. Like `nn.Module.state_dict`, a tensor stored replicated shares
        storage with the live parameter: clone it to keep a snapshot across optimizer steps.
        """
        out = {}
        for fqn, local in zip(self.program.state_fqns, self._state()):
            if self.traced.parameters[fqn].is_constant:  # a tensor made in forward: not in the model's state dict
                continue
            full = gather_tensor(local, self.spec.params[fqn], self.spec.mesh, self.groups,
                                 tuple(self.traced.parameters[fqn].shape), self.coords)
            for name in (fqn, *self.traced.parameters[fqn].aliases):
                out[name] = full
        return out

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy this rank's shard of each full tensor in `state_dict` into the local parameters/buffers."""
        with torch.no_grad():
            for fqn, local in zip(self.program.state_fqns, self._state()):
                if self.traced.parameters[fqn].is_constant:
                    continue
                local.copy_(shard_tensor(state_dict[fqn], self.spec.params[fqn], self.spec.mesh, self.coords))


def _owner(root: torch.nn.Module, fqn: str) -> torch.nn.Module:
    """The (created on demand) submodule of `root` that owns attribute path `fqn`."""
    module = root
    for part in fqn.split(".")[:-1]:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    return module
