"""depth_pro tp=2 mismatch (ratio 8.8 at fp32): the fp32 plan's spec rehearsed on the float64 model."""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
import models9 as M

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "depth_pro"
    mesh, roles = ({"tp": 2}, {"tp": "tp"})
    m, a, k = getattr(M, name)()
    spec = spec_from_plan(parallelizer.plan(parallelizer.trace(m, a, k), mesh, axis_roles=roles))
    r = rehearse_many([(getattr(M, name + "64"), {}, spec)], steps=2)[0]
    print("RESULT", name + "64", "tp2", r)
