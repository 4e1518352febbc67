"""Round 9b trial, the user's loop: SGD (momentum, weight decay) and AdamW (weight decay), with
clip_grad_norm_ (2 and inf) on pm.parameters(), 3 steps, against the eager model; out-of-range labels;
dropout replicas on dp x tp.

python trial/r9b_loop.py"""
from __future__ import annotations

import contextlib
import copy
import io
import sys
import warnings

import torch
import torch.distributed as dist

import parallelizer
from parallelizer.rewriter.spec import all_axis_groups, spec_from_plan
from parallelizer.runtime import create_groups, spawn
from parallelizer.runtime.module import ParallelModule
from parallelizer.runtime.rehearsal import _loss
from parallelizer.tracer.trace import trace

sys.path.insert(0, "trial")
import r9b_models as M  # noqa: E402

MESHES = {"fsdp2": ({"dp": 2}, {"dp": "fsdp"}), "tp2": ({"tp": 2}, {"tp": "tp"}),
          "ddp2": ({"dp": 2}, {"dp": "ddp"})}
MESHES4 = {"2x2": ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}), "tp4": ({"tp": 4}, {"tp": "tp"})}


def _ratio(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs() / (1e-5 + 1.3e-6 * b.abs())).max().item() if a.numel() else 0.0


def loop(rank, world_size, cases):
    out = {}
    for key, name, spec in cases:
        fn = getattr(M, name)
        for opt_name in ("sgd", "adamw"):
            for norm in (None, 2.0, float("inf")):
                model, inputs = fn()
                ref = copy.deepcopy(model)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    pm = ParallelModule(trace(model, inputs), spec, rank, model)
                create_groups(all_axis_groups(spec.mesh))
                mk = (lambda ps: torch.optim.SGD(ps, lr=0.3, momentum=0.9, weight_decay=0.1)) if opt_name == "sgd" \
                    else (lambda ps: torch.optim.AdamW(ps, lr=3e-2, eps=1e-3, weight_decay=0.1))
                opts = [mk(pm.parameters()), mk(ref.parameters())]
                worst = {"loss": 0.0, "norm": 0.0, "params": 0.0}
                for _ in range(3):
                    losses = []
                    for m, opt in zip((pm, ref), opts):
                        loss = _loss(m(*inputs))
                        loss.backward()
                        losses.append(loss)
                        if norm is not None:
                            total = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5, norm)
                            losses.append(total)
                        opt.step()
                        opt.zero_grad()
                    if norm is None:
                        worst["loss"] = max(worst["loss"], _ratio(losses[0], losses[1]))
                    else:
                        worst["loss"] = max(worst["loss"], _ratio(losses[0], losses[2]))
                        worst["norm"] = max(worst["norm"], _ratio(losses[1], losses[3]))
                full = pm.full_state_dict()
                for k, v in ref.state_dict().items():
                    if k in full:
                        worst["params"] = max(worst["params"], _ratio(full[k], v))
                out[(key, name, opt_name, norm)] = worst
                if rank == 0:
                    print("loop", key, name, opt_name, norm, {a: round(b, 3) for a, b in worst.items()}, flush=True)
        dist.barrier()
    return out


def bad_labels(rank, world_size, cases):
    """labels out of range (not ignore_index): eager raises; what does pm do?"""
    out = {}
    for key, name, spec in cases:
        model, (ids, labels) = getattr(M, name)()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm = ParallelModule(trace(model, (ids, labels)), spec, rank, model)
        create_groups(all_axis_groups(spec.mesh))
        for bad in (M.V + 3, -5):
            lab = labels.clone()
            lab[:, 1] = bad  # in every row: each rank of a batch-sharded plan sees one
            try:
                model(ids, lab)
                eager = "no error"
            except Exception as e:  # noqa: BLE001
                eager = type(e).__name__
            try:
                val = pm(ids, lab)
                got = f"returned {val.item():.4f}"
            except Exception as e:  # noqa: BLE001
                got = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            out[(key, name, bad)] = (eager, got)
            print("labels", rank, key, name, bad, eager, got, flush=True)
            dist.barrier()
    return out


def drop_replicas(rank, world_size, cases):
    """dropout on dp x tp: after 3 SGD steps every rank's gathered parameters must be the same."""
    out = {}
    for key, name, spec in cases:
        model, inputs = getattr(M, name)()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm = ParallelModule(trace(model, inputs), spec, rank, model)
        create_groups(all_axis_groups(spec.mesh))
        opt = torch.optim.SGD(pm.parameters(), lr=0.5)
        for _ in range(3):
            _loss(pm(*inputs)).backward()
            opt.step()
            opt.zero_grad()
        full = pm.full_state_dict()
        worst = 0.0
        for k, v in full.items():
            copies = [torch.empty_like(v) for _ in range(world_size)]
            dist.all_gather(copies, v.contiguous())
            worst = max(worst, max((c - copies[0]).abs().max().item() for c in copies))
        out[(key, name)] = worst
    return out


def _specs(names, meshes):
    cases = []
    for name in names:
        for key, (mesh, roles) in meshes.items():
            model, inputs = getattr(M, name)()
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = parallelizer.plan(parallelizer.trace(model, inputs), mesh, axis_roles=roles)
            cases.append((key, name, spec_from_plan(plan)))
    return cases


def both(rank, world_size, loop_cases, label_cases, drop_cases):
    return loop(rank, world_size, loop_cases), bad_labels(rank, world_size, label_cases), \
        drop_replicas(rank, world_size, drop_cases)


if __name__ == "__main__":
    loop_names = ["clip_model", "tied_ce", "smoothed_ce", "token_mean", "padded_emb", "seq_norm_block", "row_bias"]
    for meshes in (MESHES, MESHES4):
        size = 2 if meshes is MESHES else 4
        res = spawn(both, size, _specs(loop_names, meshes), _specs(["tied_ce", "smoothed_ce"], meshes),
                    _specs(["drop_rep"], meshes), timeout_s=900)
        lo, lab, dr = res[0]
        for k, v in lo.items():
            flag = "" if max(v.values()) <= 1 else "   <<<< DIFFER"
            print("loop", k, {a: round(b, 3) for a, b in v.items()}, flag)
        for k, v in lab.items():
            print("labels", k, v, "| other ranks:", [r[1][k][1] for r in res[1:]])
        for k, v in dr.items():
            print("dropout replicas", k, v)
