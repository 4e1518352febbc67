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


def train_rank(rank: int, world_size: int, cfg: dict, options: dict, probe_steps: tuple[int, ...] = ()) -> dict:
    """Train `cfg["steps"]` AdamW steps with plan `options` (the arm); returns the batch loss of every step
    (rank 0), the plan's boundary compression and DP compression record, and seconds; with `probe_steps`, also
    "probe": at those (0-based) steps, the PowerSGD error of this rank's buckets (`_probe_powersgd`)."""
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
    losses, start, probe, step = [], time.perf_counter(), {}, [0]
    with _probe_powersgd(pm, probe_steps, step, probe) if probe_steps else contextlib.nullcontext():
        for step[0], (ids, target) in enumerate(data):
            opt.zero_grad()
            losses.append(float(pm.step(ids, target=target, loss_fn=next_char_loss)))
            opt.step()
    pipe = pm.plan.pipeline
    return {"losses": losses if rank == 0 else [], "seconds": time.perf_counter() - start,
            "boundary": pipe.compression.to_dict() if getattr(pipe, "compression", None) is not None else None,
            "dp_compression": getattr(pm.plan, "compression", None), "probe": probe}


@contextlib.contextmanager
def _probe_powersgd(pm, steps: tuple[int, ...], step: list[int], out: dict):
    """While active, each compressing PowerSGD bucket at a step in `steps` (`step[0]`: the running one) is
    also all-reduced exactly first (an extra blocking all-reduce on the main thread, before the hook's), and
    `out[step]` gets {"total": ||PowerSGD average - exact average|| / ||exact average|| over the bucket,
    "grad_norm": ||exact average||, "per_param": {FQN: the same ratio per gradient}} (Frobenius norms; the
    PowerSGD result includes the error fed back from earlier steps, i.e. what the optimizer receives)."""
    import torch.distributed as dist
    from parallelizer.rewriter import compression

    names, hook = {id(p): n for n, p in pm.named_parameters()}, compression.powerSGD_hook

    def probed(state, bucket):
        if state.iter < state.start_powerSGD_iter or step[0] not in steps:
            return hook(state, bucket)
        exact = bucket.buffer().clone()
        dist.all_reduce(exact, group=state.process_group)
        exact /= state.process_group.size()
        future = hook(state, bucket)
        got = future.wait()  # the bucket's buffer, the average (the hook completes it: `start_compressed`)
        sizes = [p.numel() for p in bucket.parameters()]
        out[step[0]] = {"total": ((got - exact).norm() / exact.norm()).item(), "grad_norm": exact.norm().item(),
                        "per_param": {names[id(p)]: ((g - e).norm() / e.norm()).item() for p, g, e in
                                      zip(bucket.parameters(), got.split(sizes), exact.split(sizes))}}
        return future

    compression.powerSGD_hook = probed
    try:
        yield
    finally:
        compression.powerSGD_hook = hook
