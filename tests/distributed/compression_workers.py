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


def run_codecs(rank: int, world_size: int, spec: ShardingSpec, codecs: list[GradCompression]) -> dict:
    """Train the single-device reference and the sharded program once per codec (`spec` with that codec) on
    the same global batch; return each run's numbers (rank's own gradient shards, full parameters)."""
    model, inputs = small_gpt()
    traced = trace(model, inputs)
    create_groups(all_axis_groups(spec.mesh))
    out = {"reference": _train(copy.deepcopy(model), inputs, STEPS), "runs": []}
    for codec in codecs:
        pm = ParallelModule(traced, dataclasses.replace(spec, compression=codec), rank, copy.deepcopy(model))
        run = _train(pm, inputs, STEPS)
        run["code"] = pm.program.graph_module.code if rank == 0 else ""
        out["runs"].append(run)
    return out
