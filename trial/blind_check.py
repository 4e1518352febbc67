"""DPT depth on ddp: does the report now say NOTHING CHECKED?"""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
import models9 as M

if __name__ == "__main__":
    cases = []
    for n in sys.argv[1:] or ["dpt", "dpt_seg"]:
        m, a, k = getattr(M, n)()
        cases.append((getattr(M, n), {}, parallelizer.plan(parallelizer.trace(m, a, k), {"dp": 2}, axis_roles={"dp": "ddp"})))
    for (fn, _, _), r in zip(cases, rehearse_many(cases, steps=2)):
        print("RESULT", fn.__name__, "ddp2 blind" if r.blind else "ddp2 checked", r.grad_scale, str(r).split("reference:")[1][:400])
