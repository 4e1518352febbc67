"""Trial 4: a checkpoint saved before the first optimizer step (a common "step-0" checkpoint).

Usage: python trial/ckpt_step0.py MESH   e.g. dp=2  or  pp=2
Run A trains 3 AdamW steps; run B (same seed) saves at step 0 and then trains the same 3 steps. A user expects
equal losses (saving must not change training). Then a fresh model loads B's step-0 checkpoint on dp=2 and
trains 3 steps: its losses should equal A's too.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ckpt_matrix import make_opt, make_pm, train  # noqa: E402


def worker(rank, world, mesh, root):
    import warnings
    warnings.filterwarnings("ignore")
    from parallelizer import checkpoint
    plan = dict(mesh=mesh, schedule="1f1b", microbatches=2) if "pp" in mesh else dict(mesh=mesh)
    pm, opt = (lambda pm: (pm, make_opt("adamw", pm)))(make_pm("gpt2", plan, 0, False))
    a = train("gpt2", pm, opt, range(3))
    pm, opt = (lambda pm: (pm, make_opt("adamw", pm)))(make_pm("gpt2", plan, 0, False))
    checkpoint.save(pm, opt, Path(root) / "c0")
    state_after_save = {k: (v.item() if hasattr(v, "item") and v.ndim == 0 else "t") for k, v in
                        next(iter(opt.state.values()), {}).items()}
    b = train("gpt2", pm, opt, range(3))
    out = {"A": a, "B_saved_at_0": b, "opt_state_after_save": state_after_save}
    pm, opt = (lambda pm: (pm, make_opt("adamw", pm)))(make_pm("gpt2", dict(mesh={"dp": 2}), 1, False))
    try:
        checkpoint.load(pm, opt, Path(root) / "c0")
        out["C_loaded"] = train("gpt2", pm, opt, range(3))
    except Exception as e:  # noqa: BLE001
        out["C_loaded"] = f"{type(e).__name__}: {str(e)[:400]}"
    return out


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    k, v = sys.argv[1].split("=")
    res = spawn(worker, 2, {k: int(v)}, tempfile.mkdtemp(prefix="ck0_"), timeout_s=200)
    for key, val in res[0].items():
        print(key, val)
