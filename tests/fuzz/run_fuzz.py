"""The random-model fuzzer (issue R1): plan seeded random models on random meshes and axis roles, with real
and with randomised costs (to force unusual strategies), run each plan on gloo ranks and compare with one
device: outputs, loss, every gradient, parameters after 2 AdamW steps (`runtime.rehearsal`, float32
tolerance). AdamW runs with eps=1e-3: a parameter whose true gradient is zero (the key bias of attention:
softmax ignores a constant per row) gets rounding noise of ~1e-9 as gradient on both sides, which Adam with a
tiny eps would turn into full steps of either sign; the gradients themselves are compared directly.

    python tests/fuzz/run_fuzz.py --n 300 --seed 0 [--report benchmarks/fuzz_results.json]   (make fuzz)

Every case is reproducible from its case seed: `python tests/fuzz/run_fuzz.py --case SEED`.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fuzz_models, importable by spawned ranks too
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repository root (benchmarks/)

import numpy as np  # noqa: E402

import parallelizer  # noqa: E402
from parallelizer.config import PlanConfig  # noqa: E402
from parallelizer.errors import ParallelizerError  # noqa: E402
from parallelizer.planner.api import build as build_problem, to_plan  # noqa: E402
from parallelizer.planner.ilp import solve  # noqa: E402
from parallelizer.rewriter.spec import spec_from_plan  # noqa: E402
from parallelizer.runtime.rehearsal import rehearse_many  # noqa: E402

import fuzz_models  # noqa: E402

MESHES = ({"dp": 2}, {"tp": 2}, {"dp": 3}, {"tp": 3}, {"dp": 4}, {"tp": 4}, {"dp": 2, "tp": 2})


@dataclass
class Case:
    seed: int
    mesh: dict
    roles: dict
    costs: str          # "real" or "random"
    families: list
    plan_error: str = ""
    spec: object = None


def choose(seed: int) -> Case:
    """Mesh, axis roles and cost mode of case `seed` (the model is `fuzz_models.build(seed)`)."""
    rng = random.Random(seed * 7919 + 17)
    mesh = dict(rng.choice(MESHES))
    roles: dict = {}
    for axis in mesh:
        options = ("auto", "ddp", "fsdp") if axis == "dp" else ("auto", "tp")
        role = rng.choice(options)
        if role != "auto":
            roles[axis] = role
    return Case(seed, mesh, roles, rng.choice(("real", "random")), fuzz_models.describe(seed))


def plan_case(case: Case) -> None:
    """Trace, plan (randomising the ILP's costs in 'random' mode) and keep the spec, or the typed error."""
    model, args = fuzz_models.build(case.seed)
    traced = parallelizer.trace(model, args)
    config = PlanConfig(axis_roles=case.roles)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(case.mesh), tuple(case.mesh.values())),
                                            config=config)
            if case.costs == "random":
                _randomise(problem, case.seed)
            plan = to_plan(traced, problem, pricer, solve(problem, config), config)
        case.spec = spec_from_plan(plan)
    except ParallelizerError as err:  # a typed, up-front refusal: recorded, not a mismatch
        case.plan_error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"


def _randomise(problem, seed: int) -> None:
    """Replace every finite cost of the ILP by a random one (impossible pairs stay impossible)."""
    rng = np.random.default_rng(seed)
    problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
    problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
    for shared in problem.shared:  # keys priced once (`planner.shared_uses`)
        shared.cost = rng.random(shared.cost.shape)


def run(seeds: list[int], chunk: int = 10) -> list[dict]:
    """Plan and rehearse every case; one launch of ranks per `chunk` cases of the same world size."""
    cases = [choose(s) for s in seeds]
    for c in cases:
        plan_case(c)
    results = {c.seed: {"seed": c.seed, "mesh": c.mesh, "roles": c.roles, "costs": c.costs, "families": c.families,
                        "status": "refused", "detail": c.plan_error} for c in cases if c.plan_error}
    by_world: dict[int, list[Case]] = {}
    for c in cases:
        if not c.plan_error:
            by_world.setdefault(int(np.prod(list(c.mesh.values()))), []).append(c)
    for world, group in sorted(by_world.items()):
        for i in range(0, len(group), chunk):
            part = group[i:i + chunk]
            reports = rehearse_many([(fuzz_models.build, {"seed": c.seed}, c.spec) for c in part], steps=2, eps=1e-3)
            print(f"[fuzz] {sum(len(v) for v in by_world.values() if v)} planned; rehearsed {i + len(part)} of "
                  f"{len(group)} cases on {world} ranks", file=sys.stderr, flush=True)
            for c, r in zip(part, reports):
                results[c.seed] = {"seed": c.seed, "mesh": c.mesh, "roles": c.roles, "costs": c.costs,
                                   "families": c.families, "status": "match" if r.matches() else "MISMATCH",
                                   "detail": str(r).split("; collectives")[0], "ratio": r.tolerance_ratio}
    return [results[s] for s in seeds]


def table(results: list[dict]) -> str:
    """Markdown: counts by op family, by mesh and by role set."""
    lines = [f"{len(results)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r['status'] for r in results).items()))]
    for title, keys in (("op family", lambda r: r["families"]), ("mesh", lambda r: [str(r["mesh"])]),
                        ("axis roles", lambda r: [str(r["roles"] or "free")]), ("costs", lambda r: [r["costs"]])):
        rows: dict[str, Counter] = {}
        for r in results:
            for k in keys(r):
                rows.setdefault(k, Counter())[r["status"]] += 1
        lines += ["", f"| {title} | cases | match | mismatch | refused (typed error) |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {sum(c.values())} | {c['match']} | {c['MISMATCH']} | {c['refused']} |" for k, c in sorted(rows.items())]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="number of cases (default 300)")
    ap.add_argument("--seed", type=int, default=0, help="first seed block (cases use seeds seed*100000 + i)")
    ap.add_argument("--case", type=int, default=None, help="run one case seed only, verbosely")
    ap.add_argument("--report", default=None, help="write the results as JSON here")
    ap.add_argument("--results-md", default=None, help="replace the fuzz section of this RESULTS.md with the tables")
    a = ap.parse_args(argv)
    seeds = [a.case] if a.case is not None else [a.seed * 100000 + i for i in range(a.n)]
    start = time.perf_counter()
    results = run(seeds)
    for r in results:
        if r["status"] != "match" or a.case is not None:
            print(json.dumps(r), flush=True)
    print(table(results))
    print(f"({time.perf_counter() - start:.0f} s)")
    if a.report:
        Path(a.report).write_text(json.dumps(results, indent=1))
    if a.results_md:
        from benchmarks.run_all import machine, replace_section
        md = Path(a.results_md)
        section = (f"## Random-model fuzzer (`make fuzz N={a.n} SEED={a.seed}`)\n\nMachine: {machine()}  \nDate: "
                   f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {time.perf_counter() - start:.0f} s\n\n"
                   + table(results))
        md.write_text(replace_section(md.read_text() if md.exists() else "# Benchmark results\n", section))
    return 1 if any(r["status"] == "MISMATCH" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
