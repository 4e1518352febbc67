"""Rank body for test_checkpoint: train, checkpoint, resume on other meshes (importable by name in spawned ranks).

Memory is measured as the peak resident set size above the level before a call: /proc/self/clear_refs
resets the kernel's high-water mark (VmHWM), so VmHWM after the call minus VmRSS before it is the most
memory the call added at any moment. Each rank first sets glibc's mmap threshold to 64 KiB (mallopt
M_MMAP_THRESHOLD, as the MALLOC_MMAP_THRESHOLD_ variable would at process start), so that glibc returns
every freed tensor's pages at once (its adaptive threshold would otherwise keep freed blocks mapped and the
figure would count memory no tensor holds).
"""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import torch
import torch.distributed as dist

from parallelizer import Plan, auto_parallelize, checkpoint, zoo
from parallelizer.rewriter.spec import all_axis_groups, spec_from_plan
from parallelizer.rewriter.state import gather_tensor, shard_tensor
from parallelizer.runtime import create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.trace import trace

CFG = dict(n_layer=2, n_embd=256, n_head=4, vocab_size=4001, batch=8, seq_len=16, labels=True)
# the pipeline round trips: 4 blocks (zbv on pp=2 cuts 4 stages), small, vocab 257 (uneven shards)
PIPE_CFG = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=257, batch=8, seq_len=16, labels=True)
FROZEN = "transformer.wpe.weight"


def build(seed: int = 0, cfg: dict = CFG):
    """GPT-2 (tied wte / lm_head, vocab 4001: uneven shards) with the position table frozen."""
    model, args, kwargs = zoo.gpt2(**cfg, seed=seed)
    model.get_parameter(FROZEN).requires_grad_(False)
    return model, args, kwargs


def batch(step: int, cfg: dict = CFG) -> tuple[tuple, dict]:
    ids = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq_len"]),
                        generator=torch.Generator().manual_seed(100 + step))
    return (ids,), {"labels": ids}


def _rss(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def return_freed_pages() -> None:
    """Allocations of 64 KiB and more are mmapped and unmapped on free (module docstring)."""
    if not ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 65536):
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD, 65536) failed")


def peak_added_bytes(fn) -> int:
    """The largest amount of resident memory `fn()` added at any moment (module docstring)."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _rss("VmRSS")
    fn()
    return _rss("VmHWM") - before


_TRACES: dict[tuple, object] = {}  # this rank's trace per config (tracing costs seconds; 8 modules use 2 configs)


def _traced(cfg: dict):
    """The trace of `cfg`'s model, made once per rank: a TracedGraph is read-only to the ParallelModules built
    on it, each of which takes the weights of its own freshly built model (as rehearsal's `traces` cache)."""
    key = tuple(sorted(cfg.items()))
    if key not in _TRACES:
        model, args, kwargs = build(0, cfg)
        _TRACES[key] = trace(model, args, kwargs)
    return _TRACES[key]


def _module(spec, seed: int, cfg: dict = CFG) -> tuple[ParallelModule, torch.optim.Optimizer]:
    model = build(seed, cfg)[0]
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(_traced(cfg), spec, dist.get_rank(), model)
    return pm, torch.optim.AdamW(pm.parameters(), lr=1e-3, eps=1e-6)


def _train(pm, opt, steps, cfg: dict = CFG) -> list[float]:
    """AdamW steps through `pm.step` (the model's own loss), alike for ParallelModule and PipelineModule."""
    losses = []
    for step in steps:
        args, kwargs = batch(step, cfg)
        opt.zero_grad()
        losses.append(pm.step(*args, **kwargs).item())
        opt.step()
    return losses


def _full_optimizer_state(pm, opt) -> dict[str, torch.Tensor]:
    """fqn.key -> full tensor of every optimizer state entry (gathered; small model)."""
    out = {}
    for fqn, p in pm.named_parameters():
        for key, value in opt.state.get(p, {}).items():
            if value.ndim:
                value = gather_tensor(value, pm.spec.params[fqn], pm.spec.mesh, pm.groups,
                                      tuple(pm.traced.parameters[fqn].shape), pm.coords)
            out[f"{fqn}.{key}"] = value.clone()
    return out


def resume(rank: int, world_size: int, specs: dict, root: str, pipelines: dict) -> dict:
    """Train 3 steps on specs["first"], save, train 2 more; resume from the checkpoint on every other spec
    (a model of another seed, so every value must come from the checkpoint) and train the same 2 steps.
    Returns losses, bitwise checks and memory peaks of this rank."""
    return_freed_pages()
    root_dir = Path(root)
    pm, opt = _module(specs["first"], seed=0)
    _train(pm, opt, range(3))
    checkpoint.save(pm, opt, root_dir / "warmup")  # imports and first-use allocations, not measured
    out = {"save_peak": peak_added_bytes(lambda: checkpoint.save(pm, opt, root_dir / "ckpt"))}
    out["export_peak"] = peak_added_bytes(lambda: checkpoint.export_full_state_dict(pm, root_dir / "export"))
    params = {k: v.clone() for k, v in pm.full_state_dict().items()}
    state = _full_optimizer_state(pm, opt)
    out["frozen_has_state"] = pm.get_parameter(FROZEN) in opt.state
    out["largest_bytes"] = max(v.numel() * v.element_size() for v in [*params.values(), *state.values()])
    out["local_bytes"] = sum(p.numel() * p.element_size() for p in pm.state_dict().values())
    out["full_bytes"] = sum(v.numel() * v.element_size() for v in params.values())
    out["losses"] = _train(pm, opt, range(3, 5))
    out["params_at_3"] = params if rank == 0 else {}
    for name, spec in specs.items():
        if name == "first":
            continue
        warm, warm_opt = _module(spec, seed=1)  # a first load, not measured (imports, first-use buffers)
        checkpoint.load(warm, warm_opt, root_dir / "warmup")
        del warm, warm_opt
        pm2, opt2 = _module(spec, seed=1)
        result = {"load_peak": peak_added_bytes(lambda: checkpoint.load(pm2, opt2, root_dir / "ckpt"))}
        result["state_local_bytes"] = sum(v.numel() * v.element_size() for s in opt2.state.values()
                                          for v in s.values())
        result["params_bitwise"] = all(
            torch.equal(p, shard_tensor(params[fqn], spec.params[fqn], spec.mesh, pm2.coords))
            for fqn, p in pm2.named_parameters())
        restored = _full_optimizer_state(pm2, opt2)
        result["state_keys_equal"] = sorted(restored) == sorted(state)
        result["state_bitwise"] = all(torch.equal(restored[k], v) for k, v in state.items() if k in restored)
        result["frozen_has_state"] = pm2.get_parameter(FROZEN) in opt2.state
        result["lr"] = opt2.param_groups[0]["lr"]
        result["losses"] = _train(pm2, opt2, range(3, 5))
        out[name] = result
    dist.barrier()
    out["pipeline"] = _pipeline_round_trips(root_dir, pipelines)
    dist.barrier()
    return out


def _pipeline_module(plan_json: str, seed: int):
    model, args, kwargs = build(seed, PIPE_CFG)  # the global batch: auto_parallelize traces one microbatch of it
    pm = auto_parallelize(model, args, example_kwargs=kwargs, plan=Plan.from_json(plan_json))
    return pm, torch.optim.AdamW(pm.parameters(), lr=1e-3, eps=1e-6)


def _pipeline_round_trips(root: Path, plans: dict) -> dict:
    """Checkpoints between pipeline and other plans of a 4-block GPT-2 (test_checkpoint's pipeline test):
    - "pp_dp" (pp=2 x dp=2 1f1b, seed 0) trains 3 steps, is saved ("pp_ckpt") and exported, trains 2 more;
    - "pp_ckpt" loads into a ParallelModule on "dp2_tp2" (seed 1), which saves it again ("plain_ckpt") and
      trains the same 2 steps;
    - "plain_ckpt" loads into "pp_tp" (pp=2 x tp=2 zbv, seed 1: pp rank 0 holds wte AND the tied lm_head copy,
      both must receive the value) and trains the same 2 steps.
    Returns bitwise checks after each load, the losses and the full parameters after the 2 steps."""
    pm, opt = _pipeline_module(plans["pp_dp"], seed=0)
    _train(pm, opt, range(3), PIPE_CFG)
    checkpoint.save(pm, opt, root / "pp_ckpt")
    at_3 = pm.full_state_dict()
    checkpoint.export_full_state_dict(pm, root / "pp_export")
    dist.barrier()
    exported = checkpoint.read_full_state_dict(root / "pp_export")
    out = {"export_equal": (sorted(exported) == sorted(build(0, PIPE_CFG)[0].state_dict())
                            and all(torch.equal(v, at_3[k]) for k, v in exported.items()))}
    out["pp_losses"] = _train(pm, opt, range(3, 5), PIPE_CFG)
    out["pp_at_5"] = pm.full_state_dict()
    out["moved"] = max((out["pp_at_5"][k] - at_3[k]).abs().max().item() for k in at_3)
    plain, plain_opt = _module(spec_from_plan(Plan.from_json(plans["dp2_tp2"])), 1, PIPE_CFG)
    checkpoint.load(plain, plain_opt, root / "pp_ckpt")
    out["into_plain_bitwise"] = all(torch.equal(v, at_3[k]) for k, v in plain.full_state_dict().items())
    checkpoint.save(plain, plain_opt, root / "plain_ckpt")
    out["plain_losses"] = _train(plain, plain_opt, range(3, 5), PIPE_CFG)
    out["plain_at_5"] = plain.full_state_dict()
    pm2, opt2 = _pipeline_module(plans["pp_tp"], seed=1)
    checkpoint.load(pm2, opt2, root / "plain_ckpt")
    out["into_pp_bitwise"] = all(torch.equal(v, at_3[k]) for k, v in pm2.full_state_dict().items())
    out["into_pp_lr"] = opt2.param_groups[0]["lr"]
    out["into_pp_losses"] = _train(pm2, opt2, range(3, 5), PIPE_CFG)
    out["into_pp_at_5"] = pm2.full_state_dict()
    out["partial_errors"] = partial_checkpoint_errors(pm2, root / "partial")
    out["step0"] = _step0_round_trip(root, plans["pp_tp"], spec_from_plan(Plan.from_json(plans["dp2_tp2"])))
    return out


def _step0_round_trip(root: Path, pp_tp: str, plain) -> dict:
    """Checkpoints saved before the optimizer's first step, on the `plain` spec (into pp_tp) and on pp_tp (into
    `plain`): saving creates no optimizer state (torch's get_optimizer_state_dict would step Adam once with zero gradients:
    step 1 before the first real step, a different run), the loaded optimizer has none, and one step after
    the load matches one step of the saving module (same loss, parameters within 1e-5)."""
    pm, opt = _module(plain, seed=2, cfg=PIPE_CFG)
    checkpoint.save(pm, opt, root / "step0_dp")
    out = {"dp_save_created_state": bool(opt.state)}
    pmp, optp = _pipeline_module(pp_tp, seed=1)
    checkpoint.load(pmp, optp, root / "step0_dp")
    out["into_pp_state"] = bool(optp.state)
    saved = pm.full_state_dict()
    out["into_pp_bitwise"] = all(torch.equal(v, saved[k]) for k, v in pmp.full_state_dict().items())
    checkpoint.save(pmp, optp, root / "step0_pp")
    pm2, opt2 = _module(plain, seed=3, cfg=PIPE_CFG)
    try:
        checkpoint.load(pm2, opt2, root / "step0_pp")
        out["from_pp_error"] = None
    except Exception as e:  # noqa: BLE001 (the test reports it)
        out["from_pp_error"] = f"{type(e).__name__}: {e}"[:300]
        return out
    out["from_pp_state"] = bool(opt2.state)
    out["losses"] = [_train(m, o, range(1), PIPE_CFG) for m, o in ((pm, opt), (pmp, optp), (pm2, opt2))]
    fulls = [m.full_state_dict() for m in (pm, pmp, pm2)]
    out["max_diff"] = max((f[k] - fulls[0][k]).abs().max().item() for f in fulls[1:] for k in fulls[0])
    return out


def partial_checkpoint_errors(pm, path: Path, lacking: str = "transformer.h.3.") -> str:
    """Write a checkpoint of `pm` (a PipelineModule) without the tensors whose names start with `lacking` (held
    by the last stage only) and load it: every rank must raise the same StateDictError. Before the fix only
    the last stage's ranks raised and the others entered DCP's collective load alone (a hang, or a gloo
    "connection closed" RuntimeError once the raising ranks exited). Returns "TypeName: message"."""
    import torch.distributed.checkpoint as dcp
    tree = checkpoint._tree(pm, None, None)
    dcp.save({"model": {k: v for k, v in tree["model"].items() if not k.startswith(lacking)}},
             checkpoint_id=str(path))
    try:
        checkpoint.load(pm, None, path)
    except Exception as e:  # noqa: BLE001 (the test checks the type)
        return f"{type(e).__name__}: {e}"
    return "no error"
