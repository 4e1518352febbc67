"""Part 2, more mistakes: per-rank seeds, eval with another batch, pp not first, a plan file for another mesh."""
import os, sys, tempfile, warnings
import torch
import parallelizer
from parallelizer.runtime import spawn
sys.path.insert(0, os.path.dirname(__file__))
from p2_models import SkipConvNet, TwoTower, _conv_data, _tt_data


def body(rank, world):
    out = {}

    def attempt(name, fn):
        warnings.simplefilter("ignore")
        try:
            out[name] = fn()
        except Exception as e:
            out[name] = f"{type(e).__name__}: {str(e)[:300]}"

    def per_rank_seed():
        torch.manual_seed(rank); m = TwoTower(); u, i, _ = _tt_data(8)
        return str(parallelizer.auto_parallelize(m, (u, i), axis_roles={"dp": "ddp"}).plan.mesh)
    attempt("per-rank seed", per_rank_seed)

    def eval_other_batch():
        torch.manual_seed(0); m = SkipConvNet(); x, _ = _conv_data(8)
        pm = parallelizer.auto_parallelize(m, (x,), axis_roles={"dp": "ddp"})
        pm.eval()
        with torch.no_grad():
            return str(pm(_conv_data(3)[0]).shape)
    attempt("eval with another batch", eval_other_batch)

    def pp_not_first():
        torch.manual_seed(0); m = TwoTower(); u, i, _ = _tt_data(8)
        return str(parallelizer.auto_parallelize(m, (u, i), mesh={"dp": 1, "pp": 2}).plan.mesh)
    attempt("pp axis not first", pp_not_first)

    def pp_no_blocks():
        torch.manual_seed(0); m = TwoTower(); u, i, _ = _tt_data(8)
        return str(parallelizer.auto_parallelize(m, (u, i), mesh={"pp": 2}).plan.mesh)
    attempt("pp on a model without repeated blocks", pp_no_blocks)

    def plan_other_mesh():
        torch.manual_seed(0); m = TwoTower(); u, i, _ = _tt_data(8)
        pm = parallelizer.auto_parallelize(m, (u, i), mesh={"tp": 2}, axis_roles={"tp": "tp"})
        path = os.path.join(tempfile.gettempdir(), "r9c_tp_plan.json")
        if rank == 0:
            pm.plan.save(path)
        torch.distributed.barrier()
        return str(parallelizer.auto_parallelize(m, (u, i), mesh={"dp": 2}, plan=path).plan.mesh)
    attempt("saved tp plan applied with mesh dp=2", plan_other_mesh)

    def train_after_eval_no_grad():
        torch.manual_seed(0); m = SkipConvNet(); x, y = _conv_data(8)
        pm = parallelizer.auto_parallelize(m, (x,), axis_roles={"dp": "ddp"})
        with torch.no_grad():
            pm(x)
        loss = torch.nn.functional.cross_entropy(pm(x), y)
        loss.backward()
        return f"ok, grads: {all(p.grad is not None for p in pm.parameters())}"
    attempt("no_grad forward then train", train_after_eval_no_grad)
    return out


if __name__ == "__main__":
    res = spawn(body, 2, timeout_s=600)
    for k in res[0]:
        print(f"- {k}: r0 {res[0][k]}")
        if res[1][k] != res[0][k]:
            print(f"    r1 {res[1][k]}")
