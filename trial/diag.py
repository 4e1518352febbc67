"""Per-parameter gradient differences of a plan vs eager (2 ranks). Usage: diag.py MODULE NAME MESHLABEL"""
import sys, os, copy
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import parallelizer
from parallelizer.runtime.launch import spawn, create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.rewriter.spec import all_axis_groups, spec_from_plan
from parallelizer.rewriter.state import shard_tensor
from parallelizer.runtime.rehearsal import _loss
from drive import MESHES


def rank_fn(rank, ws, modname, name, spec):
    mod = __import__(modname)
    torch.manual_seed(0)
    model, a, k = mod.build(name)
    ref = copy.deepcopy(model)
    tr = parallelizer.trace(model, a, k)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(tr, spec, rank, model)
    _loss(pm(*a, **k)).backward()
    _loss(ref(*a, **k)).backward()
    rows = []
    for fqn, p in pm.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        rg = ref.get_parameter(fqn).grad
        rg = torch.zeros_like(ref.get_parameter(fqn)) if rg is None else rg
        r = shard_tensor(rg, spec.params[fqn], spec.mesh, pm.coords)
        rows.append(((g - r).abs().max().item(), r.abs().max().item(), fqn, str(spec.params[fqn])))
    rows.sort(reverse=True)
    return rows[:12]


if __name__ == "__main__":
    modname, name, ml = sys.argv[1:4]
    mod = __import__(modname)
    mesh, roles = MESHES[ml]
    m, a, k = mod.build(name)
    plan = parallelizer.plan(parallelizer.trace(m, a, k), mesh, axis_roles=roles, time_limit_s=30)
    res = spawn(rank_fn, 2, modname, name, spec_from_plan(plan), timeout_s=400)
    for row in res[0]:
        print("%.3g  ref %.3g  %s  %s" % row)
