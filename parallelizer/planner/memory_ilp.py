"""The memory rows of the ILP as PuLP constraints (`ilp._solve`; the rows: `problem.memory_rows`, `peak_rows`).

Per row k (`peak_rows.MemRow`: per group the bytes of each strategy, indicator terms, a constant), with the memory
corrections z (`Problem.memory_cuts` / `exclusions`, `memory_cut_vars`) and the constant bytes of every plan
(`Problem.const_mem_bytes`):

    sum_g sum_i lin_k[g][i] x[g, i] + sum_t b_k[t] y[t] + sum_A b_kA z_A <= budget - const - const_k

(b_kA: the part of correction A row k takes, `problem.correction_in`: of a correction learnt from saved bytes, the
nodes at or before the row's moment.)

An indicator t (`peak_rows.Indicator`, an OR of alternatives A, each an AND of "group g takes a strategy in S_g")
gets y[t] in [0, 1] and, per alternative, y[t] >= [AND of A]: for two groups with a pair variable
e[g, h, i, j] (`ilp.py`: = x[g, i] x[h, j] for binary x) y[t] >= sum over S_g x S_h of e (the strong form);
otherwise y[t] >= sum_(g in A) sum_(i in S_g) x[g, i] - (|A| - 1). Every b_k[t] is positive (bytes a rank holds) and
y[t] enters no other row or cost, so at binary x the solver may lower y[t] to the OR of its alternatives and no
further: the row equals the bytes at that moment of the pick (`peak.step_peak`), exactly.
"""
from __future__ import annotations

import pulp

from .peak_rows import Indicator
from .problem import Problem, correction_in, corrections, memory_rows

__all__ = ["memory_constraints", "memory_cut_vars", "new_var"]

_GB = 1e9  # bytes -> GB in the solver's rows (as `ilp.py`)


def new_var(prob: pulp.LpProblem, name: str, low: float, up: float, cat: str) -> pulp.LpVariable:
    """A variable attached to `prob` (PuLP >= 3.3 API; the LpVariable constructor is deprecated there)."""
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat=cat)


def memory_constraints(prob: pulp.LpProblem, problem: Problem, x: list[list], pair_vars: dict, mem_terms: list,
                       keyed: list[tuple], recompute: bool, counts: dict) -> tuple[int, int]:
    """Add one constraint per memory row (module docstring; the sum row `problem.mem` takes `mem_terms`, which holds
    the recomputation terms and the corrections of the joint ILP) and the indicator variables its terms need.
    `keyed`: [(z or None over fixed groups, assignment or None: every row, bytes)] of `memory_cut_vars`, each in a
    row as much as `problem.correction_in` says. In the joint ILP with recomputation (`counts`: n[c][mode]) the sum
    row binds, and the rows at moments of the step bind too while no region recomputes: each row - M sum n <= its
    bound, M the most the row can hold (a plan without recomputation is held to the rows it would be held to in the
    ILP without recomputation variables). Returns (variables, constraints) added."""
    ys: dict[Indicator, pulp.LpVariable] = {}
    cons = 0

    def add(name: str, row, terms: list, cut_fixed: float, gate: list) -> None:
        nonlocal cons
        for ind, b in row.terms:
            if ind not in ys:
                ys[ind], added = _indicator(prob, x, pair_vars, ind, len(ys))
                cons += added
            terms.append((ys[ind], b / _GB))
        fixed = row.const + cut_fixed + sum(float(row.lin[g][0]) for g in range(len(x)) if len(x[g]) == 1)
        rhs = problem.budget_bytes - problem.const_mem_bytes - fixed - problem.memory_margin_bytes
        if gate:  # M: every positive coefficient of the row at once, beyond the bound: n >= 1 relaxes the row
            most = sum(max(0.0, c) for _, c in terms) * _GB + max(0.0, -rhs)
            terms = terms + [(n, -most / _GB) for n in gate]
        prob.addConstraint(pulp.LpAffineExpression(terms) <= rhs / _GB, name)
        cons += 1

    def cut_terms(row) -> tuple[list, float]:
        fixed = sum(correction_in(problem, a, b, row) for z, a, b in keyed if z is None)
        return [(v, float(m) / _GB) for g in range(len(x)) for v, m in zip(x[g], row.lin[g])
                if not isinstance(v, int) and m] \
            + [(z, c / _GB) for z, a, b in keyed if z is not None and a is not None
               and (c := correction_in(problem, a, b, row))], fixed

    rows = memory_rows(problem, recompute)
    for k, row in enumerate(rows):
        if row.lin is problem.mem:
            add("memory", row, list(mem_terms), sum(b for z, _, b in keyed if z is None), [])
        else:
            add(f"memory_{k}", row, *cut_terms(row), [])
    gate = [n for per in counts.values() for n in per.values()]
    for k, row in enumerate(problem.cut_rows if recompute and gate else ()):
        add(f"memory_norc_{k}", row, *cut_terms(row), gate)
    return len(ys), cons


def _indicator(prob: pulp.LpProblem, x: list[list], pair_vars: dict, ind: Indicator, n: int
               ) -> tuple[pulp.LpVariable, int]:
    """y in [0, 1] with y >= each alternative's AND (module docstring); (y, constraints added)."""
    y = new_var(prob, f"t_{n}", 0, 1, pulp.LpContinuous)
    for a, alt in enumerate(ind):
        if len(alt) == 2 and (alt[0][0], alt[1][0]) in pair_vars:
            (g, si), (h, sj) = alt  # g < h: the alternative is sorted
            e = pair_vars[(g, h)]
            expr = [(e[i][j], -1) for i in si for j in sj if e[i][j] is not None]
            rhs = 0
        else:
            expr = [(x[g][i], -1) for g, s in alt for i in s if not isinstance(x[g][i], int)]
            rhs = 1 - len(alt)
        prob += pulp.LpAffineExpression([(y, 1)] + expr) >= rhs, f"t_{n}_{a}"
    return y, len(ind)


def memory_cut_vars(prob: pulp.LpProblem, problem: Problem, x: list[list], recompute: bool,
                    counts: dict) -> tuple[list[tuple], float, int, list[tuple]]:
    """Per memory correction (b bytes over A = ((g, i), ...), `ilp.py`'s docstring) z = AND of x[g, i] over A:
    b > 0: z >= sum x - (|A| - 1); b < 0: z <= each x (the row pushes z to the product); both where the rows take
    parts of it of either sign (`Problem.memory_cut_at`). ([(z, b)], bytes of corrections over fixed groups only,
    constraints added, [(z or None, A, b)] for `memory_constraints`)."""
    cuts, const, cons, keyed = [], 0.0, 0, []
    for n, (assign, b) in enumerate(sorted(corrections(problem, recompute).items())):
        if not b or any(len(x[g]) == 1 and i != 0 for g, i in assign):
            continue
        if not (vs := [x[g][i] for g, i in assign if len(x[g]) > 1]):
            const += b
            keyed.append((None, assign, b))
            continue
        z = new_var(prob, f"m_{n}", 0, 1, pulp.LpContinuous)
        spread = list(problem.memory_cut_at.get(assign, {}).values())
        parts = spread + [b, b - sum(spread)]  # what the rows may take of it (`correction_in`)
        if any(p > 0 for p in parts):
            prob += pulp.LpAffineExpression([(z, 1)] + [(v, -1) for v in vs]) >= 1 - len(vs), f"m_{n}"
            cons += 1
        for k, v in enumerate(vs if any(p < 0 for p in parts) else ()):
            prob += pulp.LpAffineExpression([(z, 1), (v, -1)]) <= 0, f"m_{n}_{k}"
            cons += 1
        cuts.append((z, float(b)))
        keyed.append((z, assign, float(b)))
    n_all = [(n, 1) for per in counts.values() for n in per.values()]
    for k, (assign, (_, b)) in enumerate(sorted(problem.exclusions.items()) if recompute else ()):
        z = new_var(prob, f"q_{k}", 0, 1, pulp.LpContinuous)  # the pick again, recomputing nothing: b over the sum row
        prob += pulp.LpAffineExpression([(z, 1)] + [(x[g][i], -1) for g, i in assign] + n_all) >= 1 - len(assign)
        cuts.append((z, float(b)))
        keyed.append((z, None, float(b)))  # in every row
    return cuts, const, cons + (len(problem.exclusions) if recompute else 0), keyed
