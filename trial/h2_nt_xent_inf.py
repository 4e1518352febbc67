"""Finding (h2): SimCLR NT-Xent loss in forward (sim = z @ z.T masked_fill(eye, -inf), cross_entropy) on
dp=2 (ddp) with randomised planner costs: the sharded loss is inf while one device's is finite.
    PYTHONPATH=.:trial python trial/h2_nt_xent_inf.py"""
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import h2_models as M  # noqa: E402
from h2_run import plan  # noqa: E402
from parallelizer.runtime.rehearsal import rehearse_many  # noqa: E402

if __name__ == "__main__":
    spec = plan(M.nt_xent, {"dp": 2}, {"dp": "ddp"}, "random", zlib.crc32(b"nt_xent") % 1000)
    for node, lay in sorted(spec.layouts.items()) if hasattr(spec, "layouts") else []:
        pass
    r = rehearse_many([(M.nt_xent, {}, spec)], steps=2)[0]
    print(r)
    print(r.rank0_code)
    print("MATCH" if r.matches() else f"MISMATCH loss diff {r.loss}")
