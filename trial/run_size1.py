"""pytorch#167178 / verl#7493 (an axis of size 1 disables the gradient divide / sync): meshes with a size-1 axis."""
import sys, time
from run_nonpipe import plan
from parallelizer.runtime.rehearsal import rehearse_many
import hc_models as M

MESHES = [({"dp": 1, "tp": 2}, {"dp": "fsdp", "tp": "tp"}), ({"dp": 2, "tp": 1}, {"dp": "ddp", "tp": "tp"}),
          ({"dp": 2, "tp": 1}, {"dp": "fsdp", "tp": "auto"}), ({"dp": 1, "tp": 2}, {"dp": "ddp", "tp": "auto"})]
if __name__ == "__main__":
    cases, labels = [], []
    for name in sys.argv[1:]:
        fn = getattr(M, name)
        for mesh, roles in MESHES:
            try:
                cases.append((fn, {}, plan(fn, mesh, roles)))
                labels.append(f"{name} {mesh} {roles}")
            except Exception as e:
                print(f"PLAN-ERR {name} {mesh} {roles}: {type(e).__name__}: {str(e)[:300]}")
    for label, r in zip(labels, rehearse_many(cases, steps=2)):
        print(f"{'MATCH' if r.matches() else 'MISMATCH'} ratio={r.tolerance_ratio:.3g} grad={r.grad:.2e}({r.worst_grad}) :: {label}")
