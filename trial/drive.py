"""Driver: trace -> plan on meshes -> rehearse_many; prints one line per cell and appends to a jsonl."""
import json, sys, time, traceback, os
sys.path.insert(0, os.path.dirname(__file__))
import torch
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from parallelizer.runtime import DistributedError

MESHES = {
    "dp2-ddp": ({"dp": 2}, {"dp": "ddp"}),
    "tp2-tp": ({"tp": 2}, {"tp": "tp"}),
    "dp2-fsdp": ({"dp": 2}, {"dp": "fsdp"}),
    "dp2-free": ({"dp": 2}, None),
    "tp2-free": ({"tp": 2}, None),
    "dp2tp2-fsdp+tp": ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}),
    "dp2tp2-ddp+tp": ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}),
    "tp4-tp": ({"tp": 4}, {"tp": "tp"}),
    "dp4-fsdp": ({"dp": 4}, {"dp": "fsdp"}),
}


def short(e):
    s = str(e).strip().splitlines()
    return (type(e).__name__ + ": " + (s[0] if s else ""))[:300]


def run(modname, names, meshes, out="trial/results.jsonl"):
    mod = __import__(modname)
    for name in names:
        by_ws = {}
        for ml in meshes:
            mesh, roles = MESHES[ml]
            t0 = time.time()
            try:
                model, a, k = mod.build(name)
                tr = parallelizer.trace(model, a, k)
                plan = parallelizer.plan(tr, mesh, axis_roles=roles, time_limit_s=30)
                ws = 1
                for v in mesh.values():
                    ws *= v
                by_ws.setdefault(ws, []).append((ml, plan))
            except Exception as e:
                rec = dict(model=name, mesh=ml, result="plan-error", err=short(e),
                           tb=traceback.format_exc()[-1500:])
                print(json.dumps(rec)[:600], flush=True)
                open(out, "a").write(json.dumps(rec) + "\n")
        for ws, items in by_ws.items():
            try:
                reps = rehearse_many([(mod.build, {"name": name}, p) for _, p in items], steps=2, timeout_s=400)
                for (ml, p), r in zip(items, reps):
                    rec = dict(model=name, mesh=ml, result="match" if r.matches() else "MISMATCH",
                               ratio=r.tolerance_ratio, out=r.output, loss=r.loss, grad=r.grad, params=r.params,
                               worst_grad=r.worst_grad, worst_param=r.worst_param, coll=r.collectives,
                               fallbacks=len(getattr(p, "fallbacks", []) or []))
                    print(json.dumps(rec), flush=True)
                    open(out, "a").write(json.dumps(rec) + "\n")
            except Exception as e:
                detail = ""
                if isinstance(e, DistributedError):
                    detail = "\n".join(list(e.failures.values()))[-2500:]
                for ml, p in items:
                    rec = dict(model=name, mesh=ml, result="run-error", err=short(e), detail=detail)
                    print(json.dumps(rec)[:1500], flush=True)
                    open(out, "a").write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    modname = sys.argv[1]
    names = sys.argv[2].split(",")
    meshes = sys.argv[3].split(",") if len(sys.argv) > 3 else ["dp2-ddp", "tp2-tp", "dp2tp2-fsdp+tp"]
    run(modname, names, meshes)
