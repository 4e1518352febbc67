"""The training-loop probes of explore.py on plans made with RANDOM ILP costs (tests/fuzz/run_fuzz.py's
_randomise), so the planner picks unusual layouts; 2 ranks (dp=2 free, tp=2 free) and 4 ranks (2x2 free)."""
import contextlib, io, sys
sys.path.insert(0, __file__.rpartition("/")[0])
sys.path.insert(0, __file__.rpartition("/")[0] + "/../tests/fuzz")
import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from run_fuzz import _randomise
import explore

NAMES = ["autograd_grad", "retain_graph", "siamese", "nograd_between", "opt_in_backward", "grad_hook_scale",
         "functional_call", "maml", "freeze_between", "double", "init_apply", "apply_xavier_seeded",
         "full_model_div_norm", "meta_to_empty_apply", "apply_freeze_by_type", "forward_hook_pm", "backward_hook_pm"]


def spec(mesh, seed):
    model, x = explore.build()
    traced = parallelizer.trace(model, (x,))
    config = PlanConfig()
    with contextlib.redirect_stdout(io.StringIO()):
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())), config=config)
        _randomise(problem, seed)
        return spec_from_plan(to_plan(traced, problem, pricer, solve(problem, config), config))


if __name__ == "__main__":
    world = int(sys.argv[1])
    meshes = {2: [{"dp": 2}, {"tp": 2}], 4: [{"dp": 2, "tp": 2}]}[world]
    specs = {f"{m}-seed{s}": spec(m, s) for m in meshes for s in (1, 2)}
    for k, v in specs.items():
        print(k, {f: str(l) for f, l in list(v.params.items())[:4]})
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else NAMES
    res = spawn(explore.body, world, specs, names, timeout_s=900)
    for key in res[0]:
        vals = [r[key][:2] for r in res]
        print(key, vals[0] if all(v == vals[0] for v in vals) else vals)
