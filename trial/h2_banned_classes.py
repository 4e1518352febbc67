"""Finding (h2): vocab-parallel cross-entropy on logits with -inf entries (banned classes / padded vocab /
a masked in-batch diagonal): NaN loss on tp=2 where one device's is finite. The rank whose class shard does
not hold a row's target gathers a clamped index; when that logit is -inf, `picked * inside` = -inf * 0 = NaN.
    PYTHONPATH=.:trial python trial/h2_banned_classes.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import h2_models as M  # noqa: E402
from h2_run import plan  # noqa: E402
from parallelizer.runtime.rehearsal import rehearse_many  # noqa: E402

if __name__ == "__main__":
    m, a = M.banned_classes()
    print("eager loss", m(*a).item())
    spec = plan(M.banned_classes, {"tp": 2}, {"tp": "tp"}, "random", 1)  # random costs: vocab-parallel CE
    r = rehearse_many([(M.banned_classes, {}, spec)], steps=2)[0]
    print(r)
    print([ln for ln in r.rank0_code.splitlines() if "cross_entropy" in ln])
    print("MATCH" if r.matches() else f"MISMATCH loss diff {r.loss}")
