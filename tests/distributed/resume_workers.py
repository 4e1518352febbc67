"""Rank bodies for test_resume_contract: per-rank state dicts saved and loaded the way DDP scripts do it.

Every check compares with the eager model on one device, built from the same seed in the same rank. Functions
return plain values (messages, booleans, numbers) so that the test asserts them in the parent.
"""
from __future__ import annotations

import copy
import io

import torch
import torch.distributed as dist

from parallelizer import zoo
from parallelizer.errors import StateDictError
from contract_workers import _diff, _pm, _shard

SIZES = dict(batch=8, in_features=16, dim=32, hidden=64, out_features=4)


def _batch(step: int) -> torch.Tensor:
    return torch.randn(SIZES["batch"], SIZES["in_features"], generator=torch.Generator().manual_seed(100 + step))


def _train(m, opt, steps: range) -> None:
    for s in steps:
        m(_batch(s)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def _blob(pm, opt) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": pm.state_dict(), "opt": opt.state_dict() if opt is not None else None}, buf)
    return buf.getvalue()


def _load(blob: bytes) -> dict:
    return torch.load(io.BytesIO(blob))


def rank0_file_resume(rank: int, world_size: int, specs: dict) -> dict:
    """Per spec, after 2 AdamW steps on pm and on eager:
    "model": pm.load_state_dict of RANK 0's saved state dict (DDP's "rank 0 saves, every rank loads"): "loaded" or
        the StateDictError's message;
    "optimizer": a new AdamW loading rank 0's optimizer state dict, then step(): ("stepped", moved) or
        (message, whether the parameters stayed unchanged);
    "own_files": each rank reloads its OWN saved model and optimizer state (after the parameters were disturbed),
        then 2 more steps on pm and eager: max |diff| of the parameters to eager's shards."""
    out = {}
    for name, spec in specs.items():
        r = {}
        model, (x,) = zoo.mlp(**SIZES)
        reference = copy.deepcopy(model)
        pm = _pm(model, (x,), spec)
        opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (pm, reference))
        _train(pm, opt, range(2))
        _train(reference, ref_opt, range(2))
        own = _blob(pm, opt)
        box = [own]
        dist.broadcast_object_list(box, src=0)  # the file rank 0 wrote, read by every rank
        first = _load(box[0])
        with torch.no_grad():
            for p in pm.parameters():
                p.add_(1.0)
        try:
            pm.load_state_dict(first["model"])
            r["model"] = "loaded"
        except StateDictError as exc:
            r["model"] = str(exc)
        pm(_batch(2)).pow(2).mean().backward()
        again = torch.optim.AdamW(pm.parameters(), lr=1e-2)
        again.load_state_dict(first["opt"])
        before = [p.detach().clone() for p in pm.parameters()]
        try:
            again.step()
            r["optimizer"] = ("stepped", any(not torch.equal(a, b) for a, b in zip(before, pm.parameters())))
        except StateDictError as exc:
            r["optimizer"] = (str(exc), all(torch.equal(a, b) for a, b in zip(before, pm.parameters())))
        pm.zero_grad()
        mine = _load(own)
        pm.load_state_dict(mine["model"])
        resumed = torch.optim.AdamW(pm.parameters(), lr=1e-2)
        resumed.load_state_dict(mine["opt"])
        _train(pm, resumed, range(2, 4))
        _train(reference, ref_opt, range(2, 4))
        r["own_files"] = max(_diff(p, _shard(reference.get_parameter(f).detach(), spec, f, pm))
                             for f, p in pm.named_parameters())
        out[name] = r
    return out


def dcp_direct(rank: int, world_size: int, specs: dict, directory: str) -> dict:
    """torch.distributed.checkpoint called directly on pm.state_dict() / opt.state_dict() (not through
    parallelizer.checkpoint), per spec in order (ddp2 first): "save" / "optimizer save" / "load": the
    StateDictError's message, or for ddp2 the max |diff| of the parameters to their values before a save, a
    disturbance and a load (a round trip)."""
    import torch.distributed.checkpoint as dcp

    out = {}
    for name, spec in specs.items():
        r = {}
        model, (x,) = zoo.mlp(**SIZES)
        pm = _pm(model, (x,), spec)
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
        _train(pm, opt, range(1))
        before = {k: v.clone() for k, v in pm.state_dict().items()}
        path = f"{directory}/{name}"
        try:
            dcp.save({"model": pm.state_dict()}, checkpoint_id=path)
            with torch.no_grad():
                for p in pm.parameters():
                    p.add_(1.0)
            loaded = {"model": pm.state_dict()}
            dcp.load(loaded, checkpoint_id=path)
            pm.load_state_dict(loaded["model"])
            r["save"] = max(_diff(pm.state_dict()[k], v) for k, v in before.items())
        except StateDictError as exc:
            r["save"] = str(exc)
        for key, call in (("optimizer save", lambda: dcp.save({"optim": opt.state_dict()}, checkpoint_id=path + "-o")),
                          ("load", lambda: dcp.load({"model": pm.state_dict()}, checkpoint_id=f"{directory}/ddp2"))):
            try:
                call()
                r[key] = "ran"
            except StateDictError as exc:
                r[key] = str(exc)
        out[name] = r
    return out


def pipeline_rank0_file(rank: int, world_size: int) -> str:
    """GPT-2 on pp=2 x dp=2 (fsdp), one pm.step + AdamW step, then every rank loads RANK 0's pm.state_dict():
    "loaded", or the error's type and message (stage 1's ranks lack stage 0's keys: torch's RuntimeError, or a
    StateDictError first when they hold a copy of a tied tensor)."""
    import parallelizer

    model, (ids,), kw = zoo.hf.gpt2(batch=4, seq_len=16, labels=True)
    pm = parallelizer.auto_parallelize(model, (ids,), mesh={"pp": 2, "dp": 2}, axis_roles={"dp": "fsdp"},
                                       example_kwargs=kw, microbatches=2)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
    pm.step(ids, **kw)
    opt.step()
    box = [_blob(pm, opt)]
    dist.broadcast_object_list(box, src=0)
    try:
        pm.load_state_dict(_load(box[0])["model"])
        return "loaded"
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"


def _resume_with_freezing(specs: dict, directory: str, tag: str, trainable: tuple[bool, ...]) -> float | str:
    """4 AdamW steps of the MLP with the head trainable or frozen at step s as `trainable[s]` says: eager on one
    device; steps 0-1 on ddp2, saved with `parallelizer.checkpoint`, loaded into a model of another seed on tp2
    (the head already set as step 2 wants it) and steps 2-3 there. Returns the largest |diff| of the parameters to
    eager's, or the load's StateDictError message."""
    from parallelizer import checkpoint

    def run(m, opt, steps):
        for s in steps:
            for name in ("head.weight", "head.bias"):
                m.get_parameter(name).requires_grad_(trainable[s])
            _train(m, opt, range(s, s + 1))

    eager, (x,) = zoo.mlp(**SIZES)
    run(eager, torch.optim.AdamW(eager.parameters(), lr=1e-2, eps=1e-4), range(4))
    pm = _pm(zoo.mlp(**SIZES)[0], (x,), specs["ddp2"])
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=1e-4)
    run(pm, opt, range(2))
    checkpoint.save(pm, opt, f"{directory}/{tag}")
    pm2 = _pm(zoo.mlp(**SIZES, seed=1)[0], (x,), specs["tp2"])
    for name in ("head.weight", "head.bias"):
        pm2.get_parameter(name).requires_grad_(trainable[2])
    opt2 = torch.optim.AdamW(pm2.parameters(), lr=1e-2, eps=1e-4)
    try:
        checkpoint.load(pm2, opt2, f"{directory}/{tag}")
    except StateDictError as exc:
        return str(exc)
    run(pm2, opt2, range(2, 4))
    return max(_diff(p, _shard(eager.get_parameter(fqn), specs["tp2"], fqn, pm2)) for fqn, p in pm2.named_parameters())


def unfrozen_after_checkpoint(rank: int, world_size: int, specs: dict, directory: str) -> float | str:
    """Progressive unfreezing across a resume: the head is frozen for 2 AdamW steps on ddp2, saved (no optimizer
    state for the head), loaded on tp2 with the head trainable, and trained 2 more steps; on one device the
    head's state starts at its first step (round 12: the load raised StateDictError listing the head's state
    keys). `_resume_with_freezing`."""
    return _resume_with_freezing(specs, directory, "frozen-head", (False, False, True, True))


def _halving(step: int) -> float:
    return 0.5 ** step


def scheduler_after_load(rank: int, world_size: int, specs: dict, directory: str) -> dict:
    """An LR scheduler built after the load, as many scripts do: 2 AdamW steps with LambdaLR(0.5 ** step) on
    fsdp2, saved with `parallelizer.checkpoint` (the groups hold the scheduler's 'initial_lr') and the scheduler's
    own state_dict; loaded into a model of another seed on tp2 (ddp2 for the pipeline-free path through
    torch's set_optimizer_state_dict: both), THEN LambdaLR built and its state loaded, 2 more steps. Eager does
    the same on one device with torch's Optimizer.load_state_dict. Returns, per target spec, the largest |diff|
    of the parameters to eager's and the learning rates of both, or the error's message (round 12: the load
    raised StateDictError naming 'initial_lr')."""
    from torch.optim.lr_scheduler import LambdaLR

    from parallelizer import checkpoint

    def train(m, opt, sched, steps):
        for s in steps:
            m(_batch(s)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            sched.step()

    eager, (x,) = zoo.mlp(**SIZES)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2, eps=1e-4)
    sched_e = LambdaLR(opt_e, _halving)
    train(eager, opt_e, sched_e, range(2))
    saved = copy.deepcopy((eager.state_dict(), opt_e.state_dict(), sched_e.state_dict()))
    eager2 = zoo.mlp(**SIZES, seed=1)[0]
    eager2.load_state_dict(saved[0])
    opt_e2 = torch.optim.AdamW(eager2.parameters(), lr=1e-2, eps=1e-4)
    opt_e2.load_state_dict(saved[1])
    sched_e2 = LambdaLR(opt_e2, _halving)
    sched_e2.load_state_dict(saved[2])
    train(eager2, opt_e2, sched_e2, range(2, 4))

    pm = _pm(zoo.mlp(**SIZES)[0], (x,), specs["fsdp2"])
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=1e-4)
    sched = LambdaLR(opt, _halving)
    train(pm, opt, sched, range(2))
    checkpoint.save(pm, opt, f"{directory}/with-scheduler")
    sched_state = sched.state_dict()
    out = {}
    for name in ("tp2", "ddp2"):
        pm2 = _pm(zoo.mlp(**SIZES, seed=1)[0], (x,), specs[name])
        opt2 = torch.optim.AdamW(pm2.parameters(), lr=1e-2, eps=1e-4)
        try:
            checkpoint.load(pm2, opt2, f"{directory}/with-scheduler")
        except StateDictError as exc:
            out[name] = str(exc)
            continue
        sched2 = LambdaLR(opt2, _halving)
        sched2.load_state_dict(sched_state)
        train(pm2, opt2, sched2, range(2, 4))
        out[name] = {"diff": max(_diff(p, _shard(eager2.get_parameter(fqn), specs[name], fqn, pm2))
                                 for fqn, p in pm2.named_parameters()),
                     "lr": [g["lr"] for g in opt2.param_groups], "eager_lr": [g["lr"] for g in opt_e2.param_groups],
                     "initial_lr": [g["initial_lr"] for g in opt2.param_groups]}
    return out


def frozen_when_loading(rank: int, world_size: int, specs: dict, directory: str) -> float | str:
    """The reverse of `unfrozen_after_checkpoint`: every parameter trains 2 AdamW steps on ddp2 and is saved (the
    head's state included); loaded on tp2 into a model whose head is frozen, which trains 1 step, then the head is
    unfrozen for 1 more step. On one device torch's Optimizer.load_state_dict keeps the frozen head's state,
    which the step after unfreezing continues from (round 12: StateDictError listing the head's state keys as
    unexpected). `_resume_with_freezing`."""
    return _resume_with_freezing(specs, directory, "all-trained", (True, True, False, True))


def other_plan_file(rank: int, world_size: int, specs: dict) -> str:
    """This rank's own `torch.save(pm.state_dict())` from tp2 (the bias and head are whole there), loaded on fsdp2
    where they are shards: the error, which named a state dict of the unparallelised model ("the model's full
    shape where this rank holds a shard", remedy load_full_state_dict) though the file came from another plan
    (trial r13d)."""
    x = zoo.mlp(**SIZES)[1][0]
    blob = _blob(_pm(zoo.mlp(**SIZES)[0], (x,), specs["tp2"]), None)
    try:
        _pm(zoo.mlp(**SIZES, seed=1)[0], (x,), specs["fsdp2"]).load_state_dict(_load(blob)["model"])
    except StateDictError as exc:
        return str(exc)
    return "loaded"
