"""Trial 4: a pipeline load of a checkpoint that lacks keys only the last stage holds (a 4-block checkpoint
into a 6-block model, reduced). Before the fix: stage-1 ranks raise StateDictError, stage-0 ranks enter DCP's
load alone -> hang / gloo RuntimeError. Usage: python trial/ckpt_partial_keys.py"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "distributed"))
from ckpt_matrix import make_pm  # noqa: E402


def worker(rank, world, root):
    import warnings
    warnings.filterwarnings("ignore")
    from checkpoint_workers import partial_checkpoint_errors
    pm = make_pm("gpt2", dict(mesh={"pp": 2, "dp": 2}, schedule="1f1b", microbatches=4), 0, False)
    return partial_checkpoint_errors(pm, Path(root) / "partial")[:300]


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    try:
        for r, x in enumerate(spawn(worker, 4, tempfile.mkdtemp(prefix="ckpart_"), timeout_s=60)):
            print("rank", r, x)
    except Exception as e:  # noqa: BLE001
        print("SPAWN FAILED", type(e).__name__, str(e)[:1200])
