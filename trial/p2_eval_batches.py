"""Eval with two batch sizes in a row after a training plan of batch 8 (ddp, 2 ranks)."""
import copy, os, sys, warnings, torch
sys.path.insert(0, os.path.dirname(__file__))
from p2_models import SkipConvNet, _conv_data, ratio
import parallelizer
from parallelizer.runtime import spawn


def body(rank, world):
    warnings.simplefilter("ignore")
    torch.manual_seed(0); m = SkipConvNet(); ref = copy.deepcopy(m).eval(); x, _ = _conv_data(8)
    pm = parallelizer.auto_parallelize(m, (x,), axis_roles={"dp": "ddp"}).eval()
    out = []
    for n in (3, 8, 3):
        xb = _conv_data(n)[0]
        try:
            with torch.no_grad():
                out.append(f"batch {n}: ratio {ratio(pm(xb), ref(xb)):.4f}")
        except Exception as e:
            out.append(f"batch {n}: {type(e).__name__}: {str(e)[:150]}")
    return out


if __name__ == "__main__":
    print("\n".join(spawn(body, 2)[0]))
