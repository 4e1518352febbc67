"""Batch driver: plan many models on one mesh, rehearse them all in ONE launch of ranks; a case that raises
inside the ranks is recorded and the rest go on. Usage: drive2.py MODULE NAMES|all MESH [MESH...]"""
import json, sys, time, traceback, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import parallelizer
from parallelizer.runtime.rehearsal import checked_spec, _rank_main, _report
from parallelizer.runtime.launch import spawn
from parallelizer.runtime import DistributedError
from drive import MESHES, short


def _safe_cases(rank, ws, cases, steps, lr, eps):
    out = []
    for fn, kw, spec in cases:
        try:
            out.append(_rank_main(rank, ws, fn, kw, spec, steps, lr, eps))
        except Exception as e:  # noqa
            out.append("ERR " + short(e) + "\n" + traceback.format_exc()[-1200:])
    return out


def run(modname, names, ml, out):
    mod = __import__(modname)
    mesh, roles = MESHES[ml]
    ws = 1
    for v in mesh.values():
        ws *= v
    cases = []
    for name in names:
        try:
            model, a, k = mod.build(name)
            tr = parallelizer.trace(model, a, k)
            plan = parallelizer.plan(tr, mesh, axis_roles=roles, time_limit_s=20)
            spec = checked_spec(plan, mod.build, {"name": name})
            cases.append((name, plan, spec))
        except Exception as e:
            rec = dict(model=name, mesh=ml, result="plan-error", err=short(e), tb=traceback.format_exc()[-1500:])
            print(json.dumps(rec)[:500], flush=True)
            open(out, "a").write(json.dumps(rec) + "\n")
    if not cases:
        return
    try:
        per_rank = spawn(_safe_cases, ws, [(mod.build, {"name": n}, s) for n, _, s in cases], 2, 1e-3, 1e-3,
                         timeout_s=60 + 40 * len(cases))
    except DistributedError as e:
        for n, _, _ in cases:
            rec = dict(model=n, mesh=ml, result="batch-died", err=short(e),
                       detail="\n".join(e.failures.values())[-2000:])
            open(out, "a").write(json.dumps(rec) + "\n")
        print("BATCH DIED", short(e), flush=True)
        return
    for i, (n, plan, spec) in enumerate(cases):
        res = [r[i] for r in per_rank]
        errs = [r for r in res if isinstance(r, str)]
        if errs:
            rec = dict(model=n, mesh=ml, result="run-error", err=errs[0].splitlines()[0], detail=errs[0])
        else:
            r = _report(ws, res, spec.compression.spec, spec.autocast)
            rec = dict(model=n, mesh=ml, result="match" if r.matches() else "MISMATCH", ratio=r.tolerance_ratio,
                       out=r.output, loss=r.loss, grad=r.grad, params=r.params, worst_grad=r.worst_grad,
                       worst_param=r.worst_param, coll=r.collectives, fallbacks=[str(f)[:80] for f in (plan.fallbacks or [])][:5])
        print(json.dumps(rec)[:700], flush=True)
        open(out, "a").write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    modname = sys.argv[1]
    mod = __import__(modname)
    names = mod.ALL if sys.argv[2] == "all" else sys.argv[2].split(",")
    for ml in sys.argv[3:]:
        run(modname, names, ml, f"trial/res_{modname}.jsonl")
