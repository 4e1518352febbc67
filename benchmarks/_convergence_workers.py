"""Rank body of `bench_convergence`: a character-level GPT-2 trained on the Python standard library's source
with `auto_parallelize` (pp=2 x dp=2) and `pm.step`, under one compression arm."""
from __future__ import annotations

import contextlib
import io
import time

import torch
import torch.nn.functional as F

import parallelizer
from parallelizer import zoo


def corpus_tokens(max_bytes: int) -> torch.Tensor:
    """Byte-level tokens (vocab 256) of the standard library's top-level *.py files, sorted by name and
    concatenated until `max_bytes` (the same bytes on every machine with this Python version)."""
    import os
    import sysconfig
    root = sysconfig.get_paths()["stdlib"]
    data = bytearray()
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") and len(data) < max_bytes:
            with open(os.path.join(root, name), "rb") as f:
                data += f.read()
    return torch.frombuffer(data[:max_bytes], dtype=torch.uint8).to(torch.long)


def batches(tokens: torch.Tensor, steps: int, batch: int, seq_len: int, seed: int):
    """`steps` (inputs, targets) pairs of random windows (batch, seq_len), the same sequence for every arm."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, tokens.numel() - seq_len - 1, (batch,), generator=g)
        window = torch.stack([tokens[s:s + seq_len + 1] for s in start.tolist()])
        yield window[:, :-1], window[:, 1:]


def next_char_loss(output, target) -> torch.Tensor:
    """Mean cross-entropy of the next byte: logits (b, t, 256), target (b, t)."""
    logits = output.logits if hasattr(output, "logits") else output[0]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def train_rank(rank: int, world_size: int, cfg: dict, options: dict) -> dict:
    """Train `cfg["steps"]` AdamW steps with plan `options` (the arm); returns the batch loss of every step
    (rank 0), the plan's boundary compression and DP compression record, and seconds."""
    torch.set_num_threads(1)  # 4 ranks share the machine's cores
    torch.manual_seed(0)
    model, _ = zoo.gpt2(batch=cfg["batch"], seq_len=cfg["seq_len"], **cfg["model"])
    tokens = corpus_tokens(cfg["corpus_bytes"])
    data = list(batches(tokens, cfg["steps"], cfg["batch"], cfg["seq_len"], cfg["seed"]))
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (data[0][0],), mesh={"pp": 2, "dp": 2},
                                           microbatches=cfg["microbatches"], schedule=cfg["schedule"],
                                           axis_roles={"dp": "ddp"}, **options)
    opt = torch.optim.AdamW(pm.parameters(), lr=cfg["lr"], weight_decay=0.0)
    losses, start = [], time.perf_counter()
    for ids, target in data:
        opt.zero_grad()
        losses.append(float(pm.step(ids, target=target, loss_fn=next_char_loss)))
        opt.step()
    pipe = pm.plan.pipeline
    return {"losses": losses if rank == 0 else [], "seconds": time.perf_counter() - start,
            "boundary": pipe.compression.to_dict() if getattr(pipe, "compression", None) is not None else None,
            "dp_compression": getattr(pm.plan, "compression", None)}
