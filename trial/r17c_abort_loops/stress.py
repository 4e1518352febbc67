"""Loop cheap 4-rank launches and log each (ok / FAIL / RERUN with the rank's stack), round 17 (r17c).

Usage: PYTHONPATH=<repo> [MALLOC_PERTURB_=165] python trial/r17c_abort_loops/stress.py N TAG {body,uneven}
body: sub-groups of a 2x2 mesh and 20 rounds of collectives; uneven: one rank (rotating) stays 1 s longer and returns
an 800 kB tensor while the others leave. Log: /tmp/stress_TAG.log.
"""
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stress_workers as SW  # noqa: E402
from parallelizer.runtime.launch import DistributedError, spawn  # noqa: E402


def main():
    n, tag, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    log = open(f"/tmp/stress_{tag}.log", "a")
    for i in range(n):
        t0 = time.time()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if kind == "body":
                    spawn(SW.body, 4, timeout_s=300)
                else:
                    spawn(SW.uneven_exit, 4, i % 4, 1.0, 200_000, timeout_s=300)
                res = "ok"
            except DistributedError as e:
                res = "FAIL " + str(e).replace("\n", " | ")[:3000]
        for w in caught:
            if "RankCrash" in w.category.__name__:
                res += " RERUN " + str(w.message).replace("\n", " | ")[:3000]
        print(f"{time.strftime('%H:%M:%S')} {tag} iter={i} wall={time.time() - t0:.1f}s "
              f"load={os.getloadavg()[0]:.1f} {res}", file=log, flush=True)


if __name__ == "__main__":
    main()
