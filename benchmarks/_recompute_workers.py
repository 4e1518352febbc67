"""Rank-side code of `benchmarks.bench_recompute` and `tests/distributed/test_recompute.py` (spawned functions must
live in an importable module), and the models with users' own checkpoint regions they run."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parallelizer import zoo
from parallelizer.rewriter.spec import ShardingSpec, all_axis_groups
from parallelizer.runtime.launch import create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.runtime.rehearsal import _rank_main  # the rank side of `rehearse`: one launch for all cases
from parallelizer.tracer.trace import trace

GPT2 = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, batch=4, seq_len=16, labels=True)


def checkpointed_gpt2(reentrant: bool, dropout: float = 0.0):
    """zoo GPT-2 with transformers' gradient checkpointing on every decoder layer (a user's own regions)."""
    model, inputs, kwargs = zoo.gpt2(dropout=dropout, **GPT2)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model, inputs, kwargs


class CheckpointedMLP(torch.nn.Module):
    """(B, 16) -> scalar: a user region that is not a repeated block (`fc1 -> gelu` under checkpoint)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(lambda t: torch.nn.functional.gelu(self.fc1(t)), x, use_reentrant=False)
        return self.fc2(h).pow(2).mean()


def checkpointed_mlp():
    torch.manual_seed(0)
    return CheckpointedMLP(), (torch.randn(8, 16),)


class _Count(TorchDispatchMode):
    """Counts calls of one ATen op (forward and backward, recomputation included)."""

    def __init__(self, op) -> None:
        super().__init__()
        self.op, self.calls = op, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is self.op
        return func(*args, **(kwargs or {}))


def _train(rank: int, traced, spec: ShardingSpec, dropout: float, steps: int) -> dict:
    """3 AdamW steps of zoo GPT-2 under `spec`, the RNG seeded per step; the losses, every step's local
    gradients, the final local parameters, the bytes saved for backward outside recomputed regions (step 0)
    and the number of softmax calls in step 0's forward + backward."""
    torch.manual_seed(0)
    model, inputs, kwargs = zoo.gpt2(dropout=dropout, **GPT2)
    pm = ParallelModule(traced, spec, rank, model)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3, eps=1e-3)
    losses, grads, saved = [], [], {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    count = _Count(torch.ops.aten._softmax.default)
    for step in range(steps):
        torch.manual_seed(100 + step)
        opt.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if step == 0 else _nothing(), \
                count if step == 0 else _nothing():
            loss = pm(*inputs, **kwargs)[0]
            if step == 0:
                state = {p.untyped_storage().data_ptr() for p in pm.parameters()}
                saved_bytes = sum(v for k, v in saved.items() if k not in state)
            loss.backward()
        losses.append(loss.detach())
        grads.append({k: p.grad.clone() for k, p in pm.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads, "params": {k: p.detach().clone() for k, p in pm.named_parameters()},
            "saved": saved_bytes, "softmax": count.calls, "recomputed": pm.program.recomputed,
            "code": pm.program.graph_module.code,
            "region_code": "".join(m.code for n, m in pm.program.graph_module.named_children() if n.startswith("recompute_"))}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def recompute_rank(rank: int, world_size: int, cases: list[tuple], dropout: float, steps: int,
                   single_device: list[tuple]) -> dict:
    """One launch for the whole test (starting ranks and importing transformers cost seconds):
    - `cases`: (axis name, spec without recomputation, {mode: spec with it}): every program trains `steps`
      steps with the same RNG; returns, per "<axis>_<mode>", the largest differences of the losses, every
      step's gradients and the final parameters against the plain program, its saved bytes and softmax calls
      next to the plain program's, and the recomputed regions;
    - `single_device`: (model_fn, model_kwargs, spec) compared with the eager model by the rehearsal's rank
      code (`runtime.rehearsal`: output, loss, gradients, parameters after `steps` AdamW steps)."""
    torch.set_num_threads(1)  # ranks share this machine's 2 cores: one compute thread each
    traced = trace(*zoo.gpt2(dropout=dropout, **GPT2))
    out = {}
    diff = lambda x, y: (x - y).abs().max().item()  # noqa: E731
    for axis, plain_spec, by_mode in cases:
        create_groups(all_axis_groups(plain_spec.mesh))
        plain = _train(rank, traced, plain_spec, dropout, steps)
        for mode, spec in by_mode.items():
            r = _train(rank, traced, spec, dropout, steps)
            out[f"{axis}_{mode}"] = {
                "loss": max(diff(x, y) for x, y in zip(plain["losses"], r["losses"])),
                "grad": max(diff(ga[k], gb[k]) for ga, gb in zip(plain["grads"], r["grads"]) for k in ga),
                "params": max(diff(plain["params"][k], r["params"][k]) for k in r["params"]),
                "saved": (plain["saved"], r["saved"]), "softmax": (plain["softmax"], r["softmax"]),
                "recomputed": r["recomputed"], "checkpoint_calls": r["code"].count("torch.utils.checkpoint.checkpoint("),
                "region_collectives": sum(r["region_code"].count(f"collectives_{kind}(")  # forward ones
                                          for kind in ("all_reduce", "all_gather", "all_gather_rs", "all_to_all"))}
    rehearsed = [_rank_main(rank, world_size, fn, kwargs, spec, steps, 1e-3, 1e-3) for fn, kwargs, spec in single_device]
    return {"recompute": out, "single_device": rehearsed}
