"""Loop the 4-rank launch of tests/distributed/test_numerics.py's module fixture; count rank deaths by signal (round 17,
r17c). Usage: PYTHONPATH=<repo> [LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3] MALLOC_PERTURB_=165 python repro.py N TAG."""
import sys, time, os, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "distributed"))
from plan_cases import KINDS, MODELS, case
from parallelizer.runtime.rehearsal import rehearse_many
from parallelizer.runtime.launch import DistributedError

def main():
    n = int(sys.argv[1]); tag = sys.argv[2]
    models = sys.argv[3].split(",") if len(sys.argv) > 3 else list(MODELS)
    built = [case(m, k, 4) for m in models for k in KINDS]
    cases = [(fn, kw, spec) for fn, kw, spec, _ in built]
    log = open(f"/tmp/repro_{tag}.log", "a")
    for i in range(n):
        t0 = time.time(); c0 = os.times()
        try:
            reps = rehearse_many(cases, timeout_s=600)
            bad = sum(not r.matches() for r in reps)
            res = f"ok mismatches={bad}"
        except DistributedError as e:
            res = "FAIL " + str(e).replace("\n", " | ")[:4000]
        except Exception as e:
            res = f"EXC {type(e).__name__}: {e}"[:2000]
        print(f"{time.strftime('%H:%M:%S')} {tag} iter={i} wall={time.time()-t0:.0f}s load={os.getloadavg()[0]:.1f} {res}", file=log, flush=True)

if __name__ == "__main__":
    main()
