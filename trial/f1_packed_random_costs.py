"""Packed llama (use_cache=True default, no attention_mask) on tp=2 and dp=2 (auto roles) with random planner costs."""
import contextlib, io, sys
import numpy as np
sys.path.insert(0, "tests/distributed")
import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve
from parallelizer.runtime.rehearsal import rehearse_many
from trial_models import packed_llama


def random_plan(mesh, roles, seed):
    model, inputs, kwargs = packed_llama()
    with contextlib.redirect_stdout(io.StringIO()):
        traced, config = parallelizer.trace(model, inputs, kwargs), PlanConfig(axis_roles=roles)
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())), config=config)
        rng = np.random.default_rng(seed)
        problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
        problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
        return to_plan(traced, problem, pricer, solve(problem, config), config)


if __name__ == "__main__":
    cases = [({"tp": 2}, {"tp": "auto"}, 1), ({"tp": 2}, {"tp": "tp"}, 2), ({"dp": 2}, {"dp": "fsdp"}, 3)]
    plans = [random_plan(*c) for c in cases]
    for c, r in zip(cases, rehearse_many([(packed_llama, {}, p) for p in plans], steps=2)):
        print(c, "matches" if r.matches() else "MISMATCH", r)
