"""Round 9b: the (12, 8) -> (16, 6) view on dp=3 (no whole-row re-cut exists): planned off the sharded option."""
import contextlib, io, sys
sys.path.insert(0, "trial")
import parallelizer
import r9b_models as M
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse

if __name__ == "__main__":
    m, inp = M.sharded_view()
    with contextlib.redirect_stdout(io.StringIO()):
        p = parallelizer.plan(parallelizer.trace(m, inp), {"dp": 3}, axis_roles={"dp": "ddp"})
    print([(n, x.inputs, x.output) for n, x in p.nodes.items() if "view" in n], p.notes())
    r = rehearse(M.sharded_view, {}, spec_from_plan(p))
    print("dp=3", r.matches(), r.tolerance_ratio)
