"""TimeSformer (tiny) under forced ddp / fsdp on dp=2 (NPROC=2) or fsdp+tp / ddp+tp on dp=2 x tp=2 (NPROC=4),
plus random-cost plans; rehearsed against one device. Before the follower fix: InfeasiblePlanError."""
import contextlib, io, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from timesformer_roles import build
from merge_class_sweep import random_cost_plan

def tiny(): return build(2)

if __name__ == "__main__":
    n = int(os.environ.get("NPROC", "2"))
    meshes = ([({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"})] if n == 2 else
              [({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}), ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"})])
    m, inp = tiny()
    with contextlib.redirect_stdout(io.StringIO()):
        tr = parallelizer.trace(m, inp)
    cases = []
    for mesh, roles in meshes:
        for seed in (None, 1):
            with contextlib.redirect_stdout(io.StringIO()):
                p = parallelizer.plan(tr, mesh, axis_roles=roles) if seed is None else random_cost_plan(tr, mesh, roles, seed)
            cases.append((f"{mesh} {roles} seed={seed}", p))
    for (tag, _), r in zip(cases, rehearse_many([(tiny, {}, p) for _, p in cases], steps=2)):
        print(tag, "ratio=%.3g loss=%.2e grad=%.2e params=%.2e" % (r.tolerance_ratio, r.loss, r.grad, r.params), r.collectives)
