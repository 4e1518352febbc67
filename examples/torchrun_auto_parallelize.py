"""Your own model through `parallelizer.auto_parallelize` under torchrun (gloo on CPU, nccl on GPUs).

    torchrun --nproc-per-node 4 examples/torchrun_auto_parallelize.py [--steps 5] [--mesh dp=2,tp=2]
    torchrun --nproc-per-node 4 examples/torchrun_auto_parallelize.py --mesh pp=2,dp=2   # pipeline stages

Every rank builds the same model (seeded) and the same global batch; `auto_parallelize` initialises the
process group from torchrun's environment, rank 0 plans (trace -> ILP) and broadcasts the plan, every rank
builds its sharded program (or, with a "pp" axis, its pipeline stages on torch.distributed.pipelining), and
the loop below trains it with a plain torch optimizer on the local shards. Each non-pipeline axis gets a role
(dp: "ddp", tp: "tp"): priced on the default cluster (H100s), this small model's sharding does not pay for its
communication, and without roles the plan replicated everything on every rank (before: the default run "trained
5 steps on (dp=2, tp=2)" with no collective at all; a NoParallelismWarning said so). The loop is the same for every
plan: `loss = pm.step(tokens, target=targets, loss_fn=...)` runs forward, loss and backward (over the
microbatches for a pipeline) and returns the loss of the whole batch on every rank. Some targets are -100
(padding, ignored): the pipeline weighs its microbatch losses by their token counts, so the loss is the
single-device loss of the batch. Rank 0 prints the plan summary and the loss of each step; every rank checks
it against the same steps on one device (the unsharded model), which it can run because the model is tiny.
"""
from __future__ import annotations

import argparse
import copy
import os

import torch
import torch.distributed as dist
from torch import nn

import parallelizer
from parallelizer.cli import parse_mesh
from parallelizer.core.mesh import MeshSpec


class TinyLM(nn.Module):
    """A user's own model: embedding, two residual MLP blocks, a vocabulary head, mean cross-entropy."""

    def __init__(self, vocab: int = 512, dim: int = 256, hidden: int = 1024) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(),
                                                  nn.Linear(hidden, dim)) for _ in range(2))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, dim)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)  # (B, T, vocab)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the targets that are not -100."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--mesh", default=None, help="e.g. dp=4 (default: dp=2,tp=2 on 4 ranks, else dp = world size)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = TinyLM()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 512, (16, 64), generator=gen)  # (B, T): the global batch, the same on every rank
    targets = torch.roll(tokens, -1, dims=1)
    targets[:, -1] = -100  # no next token
    targets[:3, 8:] = -100  # padded samples: microbatches count different numbers of tokens
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mesh = parse_mesh(args.mesh) if args.mesh else ({"dp": 2, "tp": 2} if world == 4 else None)
    # Roles: on CPU ranks the default pricing (H100s) finds this small model's sharding unprofitable and would
    # replicate everything (a NoParallelismWarning: 4 ranks doing one rank's work), so fix each axis's kind
    # (dp: data parallel, tp: Megatron tensor parallel), inside pipeline stages too (before, pp=2 x tp=2 left tp
    # unused and still printed "trained ... on (pp=2, tp=2)").
    axes = dict(zip(*((m := MeshSpec.of(mesh)).axis_names, m.shape))) if mesh is not None else {"dp": world}
    roles = {a: {"dp": "ddp", "tp": "tp"}[a] for a, n in axes.items() if a in ("dp", "tp") and n > 1} or None
    pm = parallelizer.auto_parallelize(model, (tokens,), mesh=mesh, optimizer="adamw", time_limit_s=30,
                                       axis_roles=roles)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print(pm.plan.summary(max_nodes=6), flush=True)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for step in range(args.steps):
        opt.zero_grad()
        loss = pm.step(tokens, target=targets, loss_fn=loss_fn)  # the same call for every plan
        opt.step()
        ref_opt.zero_grad()
        ref_loss = loss_fn(reference(tokens), targets)
        ref_loss.backward()
        ref_opt.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.6f} (single device {ref_loss.item():.6f})", flush=True)
        if not torch.allclose(loss, ref_loss, rtol=1e-4, atol=1e-5):
            raise SystemExit(f"rank {rank}: loss {loss.item()} differs from single device {ref_loss.item()}")
    if rank == 0:
        mesh_text = pm.plan.pipeline.mesh if pm.plan.pipeline is not None else pm.plan.mesh
        print(f"trained {args.steps} steps on {mesh_text}: losses match single device", flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)  # skip interpreter teardown, which can abort after gloo use on this torch build


if __name__ == "__main__":
    main()
