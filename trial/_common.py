"""Shared by the repro scripts of this directory: a 2-layer MLP, one plan per forced role, a 2-rank run."""
import contextlib, copy, io
import torch
import torch.distributed as dist

import parallelizer
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan, all_axis_groups
from parallelizer.rewriter.state import shard_tensor
from parallelizer.runtime import create_groups, spawn
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.trace import trace

SIZES = dict(in_features=16, dim=32, hidden=64, out_features=4)
MESHES = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}), "tp": ({"tp": 2}, {"tp": "tp"})}


def mlp(device="cpu"):
    return zoo.mlp(batch=8, device=device, **SIZES)


def specs():
    model, inputs = mlp()
    with contextlib.redirect_stdout(io.StringIO()):
        return {k: spec_from_plan(parallelizer.plan(parallelizer.trace(model, inputs), m, axis_roles=r))
                for k, (m, r) in MESHES.items()}


def pm_of(model, x, spec):
    create_groups(all_axis_groups(spec.mesh))
    return ParallelModule(trace(model, (x,)), spec, dist.get_rank(), model)


def params_diff(pm, ref):
    ref_p = dict(ref.named_parameters())
    return max((p.detach() - shard_tensor(ref_p[f].detach(), pm.spec.params[f], pm.spec.mesh, pm.coords)).abs().max().item()
               for f, p in pm.named_parameters())


def rank_body(rank, world, specs, body):
    """body(pm, ref, x) -> a printable result, on each mesh; errors reported by type."""
    out = {}
    for name, spec in specs.items():
        model, (x,) = mlp()
        ref = copy.deepcopy(model)
        try:
            out[name] = body(pm_of(model, x, spec), ref, x)
        except Exception as e:
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
        dist.barrier()
    return out


def main(*bodies):
    s = specs()
    for body in bodies:
        for name, r in spawn(rank_body, 2, s, body, timeout_s=300)[0].items():
            print(name, r)
