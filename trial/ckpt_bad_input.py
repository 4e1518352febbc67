"""Trial 4: bad input to checkpoint.load / save on pipeline plans: typed errors, no hangs?

Usage: python trial/ckpt_bad_input.py CASE [timeout]
  deeper:   save a 4-block GPT-2 on pp=2 x dp=2, load into a 6-block GPT-2 on pp=2 x dp=2 (only the last
            stage's ranks miss keys)
  shallower: the reverse (6 -> 4 blocks)
  wider:    load into n_embd=64
  otheropt: optimizer over another module's parameters (save)
  nopath:   load from a directory that does not exist
  step0:    save a pipeline before the first step, load into dp=4
"""
from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from ckpt_matrix import make_opt, make_pm, train  # noqa: E402

PPDP = dict(mesh={"pp": 2, "dp": 2}, schedule="1f1b", microbatches=4)


def worker(rank, world, case, root):
    from parallelizer import checkpoint
    import warnings
    warnings.filterwarnings("ignore")
    root = Path(root)
    t = time.time()
    try:
        if case in ("deeper", "shallower", "wider"):
            src_over = {"n_layer": 6} if case == "shallower" else {}
            dst_over = {"deeper": {"n_layer": 6}, "shallower": {}, "wider": {"n_embd": 64}}[case]
            pm = make_pm("gpt2", PPDP, 0, False, **src_over)
            opt = make_opt("adamw", pm)
            train("gpt2", pm, opt, range(1))
            checkpoint.save(pm, opt, root / "c")
            pm2 = make_pm("gpt2", PPDP, 1, False, **dst_over)
            opt2 = make_opt("adamw", pm2)
            checkpoint.load(pm2, opt2, root / "c")
            return "no error"
        if case == "otheropt":
            pm = make_pm("gpt2", PPDP, 0, False)
            other = torch.nn.Linear(3, 3)
            opt = torch.optim.AdamW(list(pm.parameters()) + list(other.parameters()))
            train("gpt2", pm, opt, range(1))
            checkpoint.save(pm, opt, root / "c")
            return "no error"
        if case == "nopath":
            pm = make_pm("gpt2", PPDP, 0, False)
            opt = make_opt("adamw", pm)
            checkpoint.load(pm, opt, root / "does-not-exist")
            return "no error"
        if case == "step0":
            pm = make_pm("gpt2", PPDP, 0, False)
            opt = make_opt("adamw", pm)
            checkpoint.save(pm, opt, root / "c")
            from ckpt_matrix import build  # noqa
            pm2 = make_pm("gpt2", dict(mesh={"dp": 4}), 1, False)
            opt2 = make_opt("adamw", pm2)
            checkpoint.load(pm2, opt2, root / "c")
            return "no error"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__module__}.{type(e).__name__}: {e}"[:900] + f" ({time.time() - t:.0f}s)"


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    case = sys.argv[1]
    t = time.time()
    try:
        res = spawn(worker, 4, case, tempfile.mkdtemp(prefix="ckbad_"),
                    timeout_s=float(sys.argv[2]) if len(sys.argv) > 2 else 120)
        for r, x in enumerate(res):
            print("rank", r, x)
    except Exception as e:  # noqa: BLE001
        print("SPAWN FAILED", type(e).__name__, str(e)[:1500])
    print("total", round(time.time() - t, 1), "s")
