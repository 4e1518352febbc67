"""Rank function and model for test_grad_compression (importable by name in spawned ranks)."""
from __future__ import annotations

import copy
import dataclasses

import torch

from parallelizer import trace, zoo
from parallelizer.rewriter.compression import GradCompression
from parallelizer.rewriter.spec import ShardingSpec, all_axis_groups
from parallelizer.runtime.launch import create_groups
from parallelizer.runtime.module import ParallelModule

STEPS = 3
LR = 1e-3


def small_gpt():
    """An fp32 GPT whose weight matrices PowerSGD compresses (32 x 32 and up at rank 2; biases and norms exact)."""
    return zoo.gpt(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64, batch=4, with_targets=True,
                   dropout=0.0, seed=0)


def _train(model, inputs, steps: int) -> dict:
    """Loss, gradients of the first step and parameters + loss after `steps` AdamW steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=1e-3)
    first_loss, grads = None, None
    for step in range(steps):
        opt.zero_grad()
        loss = model(*inputs)
        loss.backward()
        if step == 0:
            first_loss = loss.detach().clone()
            grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
        opt.step()
    with torch.no_grad():
        final = model(*inputs).detach().clone()
    params = model.full_state_dict() if hasattr(model, "full_state_dict") else model.state_dict()
    return {"loss": first_loss, "grads": grads, "params": {k: v.detach().clone() for k, v in params.items()},
            "final_loss": final}


def run_codecs(rank: int, world_size: int, spec: ShardingSpec, codecs: list[GradCompression],
               ddp_spec: ShardingSpec) -> dict:
    """Train the single-device reference and the sharded program once per codec (`spec` with that codec) on
    the same global batch; return each run's numbers (rank's own gradient shards, full parameters), and under
    "torch_ddp" those of `run_against_torch_ddp` (`ddp_spec`: a dp=2 DDP plan of `two_linear`)."""
    model, inputs = small_gpt()
    traced = trace(model, inputs)
    create_groups(all_axis_groups(spec.mesh))
    out = {"reference": _train(copy.deepcopy(model), inputs, STEPS), "runs": [],
           "torch_ddp": run_against_torch_ddp(rank, world_size, ddp_spec)}
    for codec in codecs:
        pm = ParallelModule(traced, dataclasses.replace(spec, compression=codec), rank, copy.deepcopy(model))
        run = _train(pm, inputs, STEPS)
        run["code"] = pm.program.graph_module.code if rank == 0 else ""
        out["runs"].append(run)
    return out


class TwoLinear(torch.nn.Module):
    """x (b, 16) -> tanh(fc1) (b, 32) -> fc2 (b, 24); MSE against y (b, 24). PowerSGD rank 4 compresses both
    weights ((32, 16) and (24, 32): (n + m) 4 x 2 < n m) and all-reduces the biases exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 24)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.fc2(torch.tanh(self.fc1(x))), y)


def two_linear(seed: int = 0):
    """The model and a global batch of 8 (the same on every rank)."""
    torch.manual_seed(seed)
    model = TwoLinear()
    return model, (torch.randn(8, 16), torch.randn(8, 24))


DDP_STEPS, DDP_WARMUP, DDP_LR = 5, 2, 0.5


def _sgd_grads(model, inputs_of_step, steps: int) -> list[dict]:
    """Gradients of every step of `steps` plain SGD steps (lr `DDP_LR`)."""
    opt = torch.optim.SGD(model.parameters(), lr=DDP_LR)
    out = []
    for step in range(steps):
        opt.zero_grad()
        model(*inputs_of_step(step)).backward()
        out.append({k: p.grad.detach().clone() for k, p in model.named_parameters()})
        opt.step()
    return out


def run_against_torch_ddp(rank: int, world_size: int, spec: ShardingSpec) -> dict:
    """PowerSGD rank 4 with `DDP_WARMUP` exact steps in our bucketed sync (one bucket, and one bucket per
    parameter) next to torch's own DistributedDataParallel + `powerSGD_hook` (`start_powerSGD_iter=DDP_WARMUP`,
    error feedback, warm start, seed 0) and plain DDP (exact), on the same data: per step the gradients of each.
    DDP averages the ranks' local-mean-loss gradients, our sync sums the partial gradients of the global mean
    loss: the same quantity. Also returns the PowerSGD iteration count of each of our kept states. The groups
    of `spec.mesh` must exist (`create_groups`)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel
    from parallelizer.rewriter import compression as codec_module

    model, (x, y) = two_linear()
    traced = trace(model, (x, y))
    codec = GradCompression("powersgd", rank=4, seed=0, warmup=DDP_WARMUP)
    half = slice(rank * 4, rank * 4 + 4)
    out = {}
    for name, bucket_bytes in (("ours", 2**20), ("ours_per_param", 1)):
        pm = ParallelModule(traced, dataclasses.replace(spec, compression=codec), rank, copy.deepcopy(model),
                            grad_bucket_bytes=bucket_bytes)
        out[name] = _sgd_grads(pm, lambda step: (x, y), DDP_STEPS)
        params = [p for _, p in pm.named_parameters()]
        out[name + "_iters"] = sorted(state.iter for p in params for state in codec_module._STATES.get(p, {}).values())
    for name, hooked in (("torch_powersgd", True), ("torch_exact", False)):
        ddp = DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=25)
        if hooked:
            state = PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=DDP_WARMUP,
                                  use_error_feedback=True, warm_start=True, random_seed=0)
            ddp.register_comm_hook(state, powerSGD_hook)
        grads = _sgd_grads(ddp, lambda step: (x[half], y[half]), DDP_STEPS)
        out[name] = [{k.removeprefix("module."): g for k, g in step.items()} for step in grads]
    return out


def complex_codec_grads(rank: int, world_size: int, spec: ShardingSpec) -> dict:
    """The complex spectral weight of an FNO layer (`complex_workers.spectral`) under each lossy codec on dp=2
    (`spec`: ddp): per codec, its gradient after two backward passes on the same batch (the sum of two), next to
    one device's. bf16 after the warm-up-free cast, PowerSGD rank 1 with one warm-up step (exact) then one
    compressed step."""
    from complex_workers import spectral

    model, inputs = spectral()
    traced = trace(model, inputs)
    create_groups(all_axis_groups(spec.mesh))
    reference = copy.deepcopy(model)
    for _ in range(2):
        reference(*inputs).pow(2).mean().backward()
    out = {"reference": reference.w.grad.clone()}
    for codec in (GradCompression("bf16"), GradCompression("powersgd", rank=1, warmup=1)):
        pm = ParallelModule(traced, dataclasses.replace(spec, compression=codec), rank, copy.deepcopy(model))
        grads = []
        for _ in range(2):
            pm(*inputs).pow(2).mean().backward()
            grads.append(pm.get_parameter("w").grad.clone())
        out[codec.kind] = grads
    return out
