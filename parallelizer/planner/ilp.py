"""The ILP: choose one strategy per variable group to minimise the estimated step time under a memory budget.

Formulation (groups, costs and memory from `problem.py`; all sums in sorted, deterministic order):

    Variables
        x[g, i] in {0, 1}      group g takes strategy i            (groups with one strategy are constants)
        e[g, h, i, j] in [0,1] groups g < h take strategies i, j   (only for non-separable pairs; continuous
                                                                    is exact given binary x, see below)
    Objective (seconds, scaled to microseconds for the solver), plus a tie-break term T
        min  sum_g sum_i lin[g][i] x[g, i]  +  sum_(g,h) sum_(i,j) C[g,h][i, j] e[g, h, i, j]  +  T
        lin: compute fwd+bwd of every member op on local shapes, plus edges inside a group;
        C:   collective seconds fwd+bwd of every edge between g and h, including gradient synchronisation
             (grad_all_reduce / the reduce_scatter backward of all_gather), i.e. DDP/ZeRO traffic.
    Constraints
        sum_i x[g, i] = 1                                   for every group g          (one-hot)
        sum_j e[g, h, i, j] = x[g, i]                       for every pair, every i    (rows)
        sum_i e[g, h, i, j] = x[h, j]                       for every pair, every j    (columns)
        sum_g sum_i row[g][i] x[g, i] + sum_t b[t] y[t]     for every memory row (`problem.memory_rows`; bytes per
                             <= budget - const               device at a moment of the step, `peak_rows`: parameter
                                                             state, gradients made, activations saved and their
                                                             gradients alive; y[t]: indicators of strategies of
                                                             several groups, DDP's kept buckets and FSDP's regathered
                                                             copies (`memory_ilp`); the end of backward and the
                                                             optimizer step; the sum row `mem` with recomputation;
                                                             const = buffers, outputs)
    Memory corrections (`Problem.memory_cuts`, learnt by `memory_fit.solve_fitting` from replays of picked plans on
    the ranks' local storages): b bytes over an assignment A of strategies to groups enter the memory row as b z_A,
    z_A in [0, 1] linearising the AND of x[g, i] over A (`memory_ilp.memory_cut_vars`; exact for binary x, either
    sign of b); a row at a moment of the step takes the part of b learnt at nodes whose saved tensors are alive there
    (`problem.correction_in`, round 27).
    `Problem.exclusions` (replayed peaks above the rows) alike, with recomputation variables only while sum n = 0.
    One redistribution per (value, target layout) (`shared_uses`): the rewriter runs one copy of a value per
    target layout however many uses read it, so the cost entries of keys that several uses of one value can ask
    for leave the pair matrices and are paid through y[a, K] in [0, 1] with y >= (pair product of every use
    taking K while the value takes a): once when any use takes the key.
    Tie-break (`tie_break_weights`): among plans of equal estimated time, less memory, then fewer collective
    launches. T = w_mem * (bytes of the memory row) + w_coll * (collectives launched, forward + backward, of
    every edge: `Pricer.edge_cost`), with w_mem * M_max <= TIE_RESOLUTION_US / 2 and w_coll * K_max <=
    TIE_RESOLUTION_US / 2, where M_max and K_max are the largest memory and collective count any choice can
    have (sums of per-group and per-pair maxima). So 0 <= T <= TIE_RESOLUTION_US for every choice, and a plan
    whose estimated time is lower by more than TIE_RESOLUTION_US (1e-2 us = 10 ns per step) is always
    preferred: the tie-break cannot change a strictly better choice, only order plans within 10 ns of each
    other (10 ns of a step that takes milliseconds is below anything the cost model resolves). Memory comes
    first when a memory difference of MEMORY_TIE_QUANTUM_BYTES (1 MB) outweighs the whole collective term:
    w_coll * K_max <= w_mem * MEMORY_TIE_QUANTUM_BYTES; smaller memory differences mix with collective
    counts. The bound on T is exact; how finely T itself is resolved depends on the solver: its absolute MIP
    gap `_ABS_GAP_US` (1e-6 us) leaves memory differences below 2e-4 * M_max unresolved (M_max = 100 GB:
    20 MB), and collective counts are resolved only where w_coll exceeds it (small problems).
    No wider near-tie band (decided round 17, r17e; benchmarks/RESULTS.md): a second, lexicographic solve
    "least memory subject to time <= (1 + eps) x the optimum" spends the whole slack on memory. Tried at
    eps = 2% (the 4-layer GPT-2 of bench_steptime on dp=2, profile of 2026-12-03 14:28): it sharded the
    embedding tables (S(1), all_to_all + reduce_scatter added) for 4.5 MB (3.3%) less, estimated 247.6 vs
    243.9 ms, i.e. more of the blocking collectives that GPT-2's and Llama's 2-rank fsdp and tp plans
    measure 21-27% above their price (/tmp/r17/bench1.txt); the plan it should have moved toward (ddp) differs from the free one by 2 slices of the embedding
    output and does the same work (rank CPU per step 214.1-214.4 vs 215.8-216.9 ms, 12 interleaved rounds).
    Activation recomputation (`problem.py`, `recompute.py`). Forced modes are already folded into lin and
    mem. Under PlanConfig.recompute == "auto" the ILP with recomputation adds, per `RecomputeClass` c (N_c
    identical regions sharing the groups G_c) and mode m in {selective, full}:
        n[c, m] in {0..N_c}, n[c, sel] + n[c, full] <= N_c        instances of the class in mode m
        w[c, m, g, i] in [0, N_c] continuous, for g in G_c:
            sum_i w[c, m, g, i] = n[c, m],   w[c, m, g, i] <= N_c x[g, i]
        v[c, m, g, h, i, j] in [0, N_c] continuous, for each pair term with P[c,m][g,h][i, j] > 0:
            v >= w[c, m, g, i] + w[c, m, h, j] - n[c, m]
        objective += sum E[c,m][g][i] w[c,m,g,i] + sum P[c,m][g,h][i,j] v[c,m,g,h,i,j],
        memory row += sum D[c,m][g][i] w[c,m,g,i]
    where E (extra seconds: the recomputed forward compute), P (the forward collectives the region runs
    again, per (producer, consumer) strategy pair of each redistribution into a recomputed node:
    `RegionRecompute.rerun_edges`, `RegionPrice.rerun_comm_s`) and D (saved-bytes change, <= 0) are one
    instance's terms (`recompute.price_region` as linear forms). With binary one-hot x, the two
    constraints force w[c,m,g,i] = n[c,m] x[g,i] (the disaggregated form of the product of an integer and a
    one-hot vector), so v = max(0, n (x[g,i] + x[h,j] - 1)) = n x[g,i] x[h,j] at the optimum (P > 0): the
    linearisation is exact, and the recomputation of n instances is priced at the strategies the ILP picks
    for the block. P pays a redistribution per use, where the program runs one copy per (value, target
    layout) (`shared_uses`): an upper bound of the re-run collectives where several uses in a region share
    a copy; the plan's cost (`api.to_plan`) and `estimate_step_time` price them once per copy. Which
    instances recompute does not change time or memory on a fixed mesh (they are identical); the first
    n[c, full] regions in graph order get "full", the next n[c, sel] "selective".
    Recomputation traded for a faster layout (`solve`): the ILP without recomputation is solved first (as
    before); where memory can bind (some choice exceeds the budget) the joint ILP above is solved too, and
    its plan is kept when it recomputes and its objective is lower by more than `RECOMPUTE_MIN_GAIN` (or
    `mip_rel_gap`) relative; ties go to no recomputation, so a plan where recomputation never pays is
    byte-identical to before. With no plan within the budget without recomputation, the joint ILP alone.
    With binary x the row/column equalities force e[g,h,i,j] = x[g,i] x[h,j] (a transportation polytope
    with 0/1 margins has one vertex), the strong linearisation (ENVIRONMENT-NOTES: the weak form
    e >= x_u + x_v - 1 does not solve at scale).

Solver: PuLP + HiGHS (highspy) with threads=1 and a fixed random_seed (reproducible), CBC as fallback.
A plan is called optimal only when the solver reports a proven optimum (HiGHS model status kOptimal,
i.e. `prob.sol_status == LpSolutionOptimal`) within `mip_rel_gap`; a time-limited solve that found a
feasible point is reported as "feasible" with its gap.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
import pulp

from ..config import PlanConfig
from ..errors import InfeasiblePlanError, format_bytes
from .highs_bulk import BulkHiGHS, quiet_stdout
from .memory_ilp import memory_constraints, memory_cut_vars, new_var
from .problem import Problem, activation_rows, cut_bytes, max_memory_bytes, min_memory_bytes, most_memory_bytes

_SCALE = 1e6  # seconds -> microseconds in the solver's objective
_GB = 1e9
TIE_RESOLUTION_US = 1e-2  # the tie-break term lies in [0, this] microseconds (module docstring)
MEMORY_TIE_QUANTUM_BYTES = 1_000_000  # a memory difference this large outweighs any collective-count difference
_MAX_EXACT_CLASSES = 3  # `min_memory_with_recompute_bytes` enumerates 3^classes mode combinations up to this
_ABS_GAP_US = 1e-6  # solver's absolute MIP gap, microseconds (HiGHS's default; 1e-12 made solves ~35% slower)


@dataclass(frozen=True, slots=True)
class Solution:
    """Chosen strategy index per group, the objective (seconds), and the solver report."""

    choice: tuple[int, ...]
    objective_s: float
    status: str
    optimal: bool
    gap: float | None
    time_s: float
    num_variables: int
    num_binary: int
    num_constraints: int
    solver: str
    recompute: tuple[tuple[str, str], ...] = ()  # (region, mode) of regions not "none", sorted


def objective_s(problem: Problem, choice: tuple[int, ...]) -> float:
    """The ILP objective of a choice, in seconds (sum of linear and pair costs)."""
    total = sum(float(problem.lin[g][c]) for g, c in enumerate(choice))
    total += sum(float(m[choice[a], choice[b]]) for (a, b), m in sorted(problem.pairs.items()))
    return total + sum(s.seconds(choice)[0] for s in problem.shared)


def memory_bytes(problem: Problem, choice: tuple[int, ...]) -> int:
    """The memory row of a choice, bytes per device, with the corrections that hold at it (`Problem.memory_cuts`)."""
    return int(problem.const_mem_bytes + sum(float(problem.mem[g][c]) for g, c in enumerate(choice))
               + cut_bytes(problem, choice))


def tie_break_weights(problem: Problem) -> tuple[float, float]:
    """(w_mem per byte, w_coll per collective), in microseconds, of the tie-break term (module docstring)."""
    m_max = float(sum(float(m.max()) for m in problem.mem)) or 1.0
    k_max = float(sum(float(c.max()) for c in problem.lin_counts)
                  + sum(float(c.max()) for c in problem.pair_counts.values())
                  + sum(float(s.count.max(axis=0).sum()) for s in problem.shared)) or 1.0
    w_mem = TIE_RESOLUTION_US / 2 / m_max
    w_coll = min(TIE_RESOLUTION_US / 2, w_mem * MEMORY_TIE_QUANTUM_BYTES) / k_max
    return w_mem, w_coll


def min_memory_with_recompute_bytes(problem: Problem) -> int:
    """The least memory of any plan when the free regions may recompute (`problem.recompute_classes`).

    For fixed strategies the memory is linear in the counts n[c, m] over {n[c, sel] + n[c, full] <= N_c},
    so its minimum lies at a vertex: each class entirely in one mode. Per combination of modes the memory is
    a sum of independent per-group choices (min over each group's strategies); exact for up to
    `_MAX_EXACT_CLASSES` classes, otherwise a lower bound (each class's largest saving bounded per group).
    """
    classes = problem.recompute_classes
    if not classes:
        return min_memory_bytes(problem)
    if len(classes) > _MAX_EXACT_CLASSES:
        need = float(min_memory_bytes(problem, recompute=True))
        for cls in classes:
            need += min(0.0, *(cls.count * sum(float(a.min()) for a in delta.values())
                               for _, delta in cls.terms.values()))
        return int(need)
    best = math.inf
    for combo in itertools.product(("none", "selective", "full"), repeat=len(classes)):
        mem = [m.copy() for m in problem.mem]
        for cls, mode in zip(classes, combo):
            for g, a in (cls.terms[mode][1].items() if mode != "none" else ()):
                mem[g] = mem[g] + cls.count * a
        best = min(best, problem.const_mem_bytes + sum(float(m.min()) for m in mem))
    return int(best + sum(min(0.0, b) for b in problem.memory_cuts.values()))


def check_memory(problem: Problem, config: PlanConfig | None = None, recompute: bool = False) -> None:
    """Raise InfeasiblePlanError when even the leanest strategies exceed the budget (with `recompute`: also
    recomputing every free region, `min_memory_with_recompute_bytes`). The remedies listed are only those not
    already in effect (`_memory_remedies`)."""
    need = min_memory_with_recompute_bytes(problem) if recompute else min_memory_bytes(problem)
    if need > problem.budget_bytes:
        roles = dict(config.axis_roles) if config is not None else {}
        raise InfeasiblePlanError(
            f"memory: needs >= {format_bytes(need)} per device, budget {format_bytes(problem.budget_bytes)} "
            + (f"(after a reserve of {format_bytes(problem.reserve_bytes)}) " if problem.reserve_bytes else "")
            + f"on mesh {problem.mesh}" + (f" with axis_roles {roles}" if roles else "")
            + (" even with activation recomputation" if recompute else "") + ". Remedies: "
            + _memory_remedies(problem, config))


OUTPUTS_REMEDY_FRACTION = 0.1  # returned values above this share of the budget are named first among the remedies


def _memory_remedies(problem: Problem, config: PlanConfig | None) -> str:
    """The remedies of `check_memory`'s message, leaving out those already in effect: returning less when the
    returned values (`Problem.output_mem_bytes`) take over `OUTPUTS_REMEDY_FRACTION` of the budget, sharding roles when no
    axis is forced to "ddp" or "tp", a data axis unless every axis of the mesh is forced to "tp" (a free axis is
    already searched as one), recomputation when recompute is "auto" or "full", bf16 when the plan is priced in
    bf16, ZeRO-1 when it is on or no axis is "ddp", a smaller reserve when none is kept."""
    mode = config.recompute if config is not None else "auto"
    forced = dict(config.axis_roles) if config is not None else {}
    roles = set(forced.values())
    axes = [a for a, n in zip(problem.mesh.axis_names, problem.mesh.shape) if n > 1]
    returned = problem.output_mem_bytes
    remedies = [
        f"return less: the module's returned values take {format_bytes(returned)} on every rank (each rank gets "
        "them whole; a language model's logits beside its loss: return only the loss, e.g. a wrapper whose "
        "forward returns `out.loss`)" if returned > OUTPUTS_REMEDY_FRACTION * problem.budget_bytes else "",
        "roles that shard more (e.g. 'fsdp' instead of 'ddp', or none: the planner then also shards parameters and "
        "optimizer state where it pays)" if roles & {"ddp", "tp"} else "",
        f"activation recomputation (recompute='auto' lets the planner choose, or 'full'; now recompute={mode!r}; "
        "CLI --recompute)" if mode in ("none", "selective") else "",
        "ZeRO-1 over the 'ddp' axis (zero1='dp', CLI --zero1 dp: each rank keeps 1/N of the optimizer state)"
        if "ddp" in roles and (config is None or config.zero1 is None) else "",
        "more devices (a larger mesh)",
        "a data axis so that parameters and optimizer state can be sharded (ZeRO/FSDP is searched on every axis "
        "that shards the batch)" if all(forced.get(a) == "tp" for a in axes) else "",
        "fewer samples per step (gradient accumulation)",
        "bf16 precision (precision='bf16', 18 instead of 16 B/param but half the activations)"
        if problem.precision != "bf16" else "",
        "a smaller memory reserve (memory_reserve_bytes=)" if problem.reserve_bytes > 0 else "",
    ]
    remedies = [r for r in remedies if r]
    return ", ".join(remedies[:-1]) + f", or {remedies[-1]}."


RECOMPUTE_MIN_GAIN = 1e-6  # `solve`: a plan with recomputation must be faster by this fraction (tie rule)


def solve(problem: Problem, config: PlanConfig) -> Solution:
    """Build and solve the ILP of the module docstring. Under PlanConfig.recompute == "auto" with free regions
    (`problem.recompute_classes`) the layout and the recomputation are chosen jointly by time (module
    docstring, "Recomputation traded for a faster layout"): (1) the ILP without recomputation; (2) unless
    memory cannot bind (every choice fits the budget: recomputation then only adds time) the joint ILP, whose
    plan is kept when it recomputes and is faster than (1) by more than `RECOMPUTE_MIN_GAIN` (and
    `mip_rel_gap`); otherwise (1), byte-identical to before. When (1) finds nothing within the budget, (2).

    Raises:
        InfeasiblePlanError: the memory budget cannot be met (binding constraint and remedies in the text),
            or the solver found no solution within the time limit.
    """
    if config.recompute != "auto" or not problem.recompute_classes:
        return _solve(problem, config, False)
    plain = None
    if min_memory_bytes(problem) <= problem.budget_bytes:
        try:
            plain = _solve(problem, config, False)
        except InfeasiblePlanError:
            pass  # the leanest strategies fit alone but not together with the edges they imply: recompute
        if plain is not None and max_memory_bytes(problem) <= problem.budget_bytes:
            return plain  # memory cannot bind: no recomputation can make a plan faster
    if plain is None:
        return _solve(problem, config, True)
    try:
        joint = _solve(problem, config, True)
    except InfeasiblePlanError:  # the joint ILP hit the time limit where the plain one did not
        return plain
    gain = max(RECOMPUTE_MIN_GAIN, config.mip_rel_gap)
    return joint if joint.recompute and joint.objective_s < plain.objective_s * (1 - gain) else plain


LEAN_SLACK = 0.01  # `solve_lean`: the fastest layout within 1% of the least activation bytes


def activation_bytes(problem: Problem, choice: tuple[int, ...]) -> float:
    """Bytes saved for backward of a choice (`problem.activation_rows`, with `Problem.memory_cuts`)."""
    return float(sum(float(a[c]) for a, c in zip(activation_rows(problem), choice))) + cut_bytes(problem, choice)


def solve_lean(problem: Problem, config: PlanConfig) -> Solution:
    """The memory-lean layout: the fastest choice (the ILP of the module docstring, without recomputation
    variables: the caller prices recomputation per mode) among those whose activation bytes are within
    `LEAN_SLACK` of the least any choice saves. Two solves: (1) minimise the activation bytes (the memory row
    less the parameters' training state); (2) minimise time under an added row `activations <= A1 (1 + slack)`.
    On a tensor-parallel mesh this reaches the sequence-parallel layout of Korthikanti et al. 2022 (norms,
    dropouts and residual adds sharded between the tp matmuls, reduce-scatter + all-gather instead of
    all-reduce) when the rule table offers it, since no other layout saves fewer bytes; the pipeline search
    (`planner.search`) chooses per stage between it and `solve`'s time-optimal layout.

    Raises:
        InfeasiblePlanError: as `solve`.
    """
    least = _solve(problem, config, False, minimise="activations")
    bound = activation_bytes(problem, least.choice) * (1 + LEAN_SLACK) + 1.0
    return _solve(problem, config, False, act_bound_bytes=bound)


def recompute_cost(problem: Problem, choice: tuple[int, ...], counts: dict[int, dict[str, int]]) -> tuple[float, float]:
    """(extra seconds, saved-bytes change) of `counts[class][mode]` instances recomputing at `choice`."""
    extra = delta = 0.0
    for c, per_mode in counts.items():
        for m, n in per_mode.items():
            e, d = problem.recompute_classes[c].terms[m]
            extra += n * sum(float(a[choice[g]] if isinstance(g, int) else a[choice[g[0]], choice[g[1]]])
                             for g, a in e.items())
            delta += n * sum(float(a[choice[g]]) for g, a in d.items())
    return extra, delta


def decision_counts(problem: Problem, decision: dict[str, str]) -> dict[int, dict[str, int]]:
    """How many of each free class's regions (`problem.recompute_classes`) recompute in each mode under
    `decision` (region -> "selective" | "full", a plan's `Plan.recompute`): the `counts` of `recompute_cost`.
    Regions the problem folded into lin / mem (`problem.recompute_fixed`) or that no class holds are left out
    (their price is in the problem already, or there is none)."""
    counts: dict[int, dict[str, int]] = {}
    for c, cls in enumerate(problem.recompute_classes):
        for region in cls.regions:
            mode = decision.get(region, "none")
            if mode != "none":
                counts.setdefault(c, {}).setdefault(mode, 0)
                counts[c][mode] += 1
    return counts


def _solve(problem: Problem, config: PlanConfig, recompute: bool, minimise: str = "time",
           act_bound_bytes: float | None = None) -> Solution:
    """The ILP of the module docstring, with the recomputation variables when `recompute`. `minimise`:
    "time" (the objective of the module docstring) or "activations" (the activation bytes, `solve_lean`);
    `act_bound_bytes`: an added row bounding the activation bytes (`solve_lean`)."""
    check_memory(problem, config, recompute)
    prob = pulp.LpProblem("parallelizer_plan", pulp.LpMinimize)
    x: list[list] = []
    for g, n in enumerate(problem.sizes()):
        ok = np.isfinite(problem.lin[g])
        if not ok.any():
            raise InfeasiblePlanError(f"no plan on mesh {problem.mesh}: {_binding(problem, config)}")
        # Integer in [0, 1] rather than LpBinary: PuLP resets a binary's bounds to [0, 1], which would
        # re-allow an impossible strategy (upper bound 0).
        x.append([1] if n == 1 else [new_var(prob, f"x_{g}_{i}", 0, 1 if ok[i] else 0, pulp.LpInteger)
                                     for i in range(n)])
    w_mem, w_coll = tie_break_weights(problem)
    counts = problem.lin_counts or [np.zeros(len(v)) for v in problem.lin]
    terms = [(v, float(c) * _SCALE + w_mem * float(m) + w_coll * float(k)) for g in range(len(x))
             for v, c, m, k in zip(x[g], problem.lin[g], problem.mem[g], counts[g])
             if not isinstance(v, int) and np.isfinite(c)]
    num_cons = 0
    for g, vs in enumerate(x):
        if len(vs) > 1:
            prob += pulp.LpAffineExpression([(v, 1) for v in vs]) == 1, f"onehot_{g}"
            num_cons += 1
    num_edge = 0
    pair_vars: dict[tuple[int, int], list[list]] = {}
    for (a, b), mat in sorted(problem.pairs.items()):
        na, nb = mat.shape
        num_edge += int(np.isfinite(mat).sum())
        # Python lists, not numpy scalars, in the loops below: the same float values, read ~10x faster
        finite = np.isfinite(mat).tolist()  # an impossible pair (inf) gets no variable: it cannot be chosen
        cost = mat.tolist()
        count = np.asarray(problem.pair_counts.get((a, b), np.zeros(mat.shape)), dtype=float).tolist()
        e = pair_vars[(a, b)] = [[new_var(prob, f"e_{a}_{b}_{i}_{j}", 0, 1, pulp.LpContinuous) if finite[i][j] else None
                                  for j in range(nb)] for i in range(na)]
        terms += [(e[i][j], cost[i][j] * _SCALE + w_coll * count[i][j])
                  for i in range(na) for j in range(nb) if finite[i][j]]
        for i in range(na):
            prob += pulp.LpAffineExpression([(e[i][j], 1) for j in range(nb) if finite[i][j]]
                                            + [(x[a][i], -1)]) == 0, f"r_{a}_{b}_{i}"
        for j in range(nb):
            prob += pulp.LpAffineExpression([(e[i][j], 1) for i in range(na) if finite[i][j]]
                                            + [(x[b][j], -1)]) == 0, f"c_{a}_{b}_{j}"
        num_cons += na + nb
    num_shared, shared_cons = _shared_vars(prob, problem, x, pair_vars, terms, w_coll)
    num_cons += shared_cons
    mem_terms = [(v, float(m) / _GB) for g in range(len(x)) for v, m in zip(x[g], problem.mem[g])
                 if not isinstance(v, int) and m]
    counts_vars = _recompute_vars(prob, problem, x, terms, mem_terms, w_mem) if recompute else {}
    cuts, cut_fixed, cut_cons, keyed = memory_cut_vars(prob, problem, x, recompute, counts_vars)
    terms, mem_terms = terms + [(z, w_mem * b) for z, b in cuts], mem_terms + [(z, b / _GB) for z, b in cuts]
    num_cons += cut_cons
    acts = activation_rows(problem)
    if minimise == "activations":  # MB, so that the solver's gaps resolve bytes as they resolve microseconds
        terms = [(v, float(a) / 1e6) for g in range(len(x)) for v, a in zip(x[g], acts[g])
                 if not isinstance(v, int) and a] + [(z, b / 1e6) for z, b in cuts]
    if act_bound_bytes is not None:
        fixed_act = sum(float(acts[g][0]) for g in range(len(x)) if len(x[g]) == 1) + cut_fixed
        prob += pulp.LpAffineExpression([(v, float(a) / _GB) for g in range(len(x)) for v, a in zip(x[g], acts[g])
                                         if not isinstance(v, int) and a] + [(z, b / _GB) for z, b in cuts]) \
            <= (act_bound_bytes - fixed_act) / _GB, "activations"
        num_cons += 1
    prob += pulp.LpAffineExpression(terms)
    # the sum row, or one per moment of the step (`peak_rows`), with their indicators (`memory_ilp`)
    num_ind, row_cons = memory_constraints(prob, problem, x, pair_vars, mem_terms, keyed, recompute,
                                             counts_vars)
    num_cons += row_cons
    num_bin = sum(len(v) for v in x if len(v) > 1)
    solver_name, solver = _solver(config)
    start = time.perf_counter()
    with quiet_stdout():
        prob.solve(solver)
    elapsed = time.perf_counter() - start
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        check_memory(problem, config, recompute)
        proved = prob.status == pulp.LpStatusInfeasible  # not the time limit: no plan exists
        if not proved and act_bound_bytes is None and _time_limit_binds(problem):
            raise InfeasiblePlanError(
                f"the {solver_name} solver found no plan within {config.time_limit_s} s (status "
                f"{pulp.LpStatus[prob.status]}, {elapsed:.1f} s) on mesh {problem.mesh}: it stopped at its time limit "
                f"before finding any plan. Not memory: even the heaviest placements need "
                f"{format_bytes(most_memory_bytes(problem))} of the {format_bytes(problem.budget_bytes)} budget, and "
                "every node has a placement that its neighbours accept. Remedy: raise time_limit_s (the limit is "
                "wall-clock seconds, so a machine busy with other work reaches it with less of the search done)")
        raise InfeasiblePlanError(
            f"the {solver_name} solver " + ("proved that no plan exists" if proved else
                                            f"found no plan within {config.time_limit_s} s")
            + f" (status {pulp.LpStatus[prob.status]}, {elapsed:.1f} s) on mesh {problem.mesh}: "
            f"{_binding(problem, config)}. Remedies for a binding memory budget: raise it, more devices, activation "
            "recomputation (recompute='auto' or 'full')" + ("." if proved else "; for the time limit: raise "
                                                             "time_limit_s."))
    choice = tuple(0 if len(vs) == 1 else int(np.argmax([v.varValue or 0.0 for v in vs])) for vs in x)
    gap = _gap(prob, solver_name)
    optimal = prob.sol_status == pulp.LpSolutionOptimal and (gap is None or gap <= max(config.mip_rel_gap, 1e-6))
    counts = {c: {m: int(round(v.varValue or 0.0)) for m, v in per.items()} for c, per in counts_vars.items()}
    decision = dict(problem.recompute_fixed)
    for c, per in counts.items():
        free = iter(problem.recompute_classes[c].regions)
        for m in ("full", "selective"):
            decision.update((next(free), m) for _ in range(per.get(m, 0)))
    extra_s = recompute_cost(problem, choice, counts)[0]
    num_rc = sum(len(per) for per in counts_vars.values())
    num_vars = len(prob.variables()) if recompute else num_bin + num_edge + num_shared + len(cuts) + num_ind
    return Solution(choice, objective_s(problem, choice) + extra_s, "optimal" if optimal else "feasible", optimal,
                    gap, elapsed, num_vars,
                    num_bin + num_rc,
                    len(prob.constraints) if recompute else num_cons, solver_name,
                    tuple(sorted((r, m) for r, m in decision.items() if m != "none")))


def _recompute_vars(prob: pulp.LpProblem, problem: Problem, x: list[list], terms: list, mem_terms: list,
                    w_mem: float) -> dict[int, dict[str, pulp.LpVariable]]:
    """Add the recomputation variables and constraints of the module docstring; extend the objective and
    memory-row term lists in place. Returns n[c][mode]."""
    counts: dict[int, dict[str, pulp.LpVariable]] = {}
    for c, cls in enumerate(problem.recompute_classes):
        N = cls.count
        n = counts[c] = {m: new_var(prob, f"n_{c}_{m}", 0, N, pulp.LpInteger) for m in sorted(cls.terms)}
        prob += pulp.LpAffineExpression([(v, 1) for v in n.values()]) <= N, f"modes_{c}"
        for m, (extra, delta) in sorted(cls.terms.items()):
            pair_keys = sorted(k for k in extra if not isinstance(k, int))
            single = {g for k in pair_keys for g in k}
            w_of: dict[int, list] = {}
            for g in sorted({k for k in extra if isinstance(k, int)} | set(delta) | single):
                zero = np.zeros(len(x[g]))
                e, d = extra.get(g, zero), delta.get(g, zero)
                if len(x[g]) == 1:  # a fixed group: the term is linear in n itself
                    terms.append((n[m], float(e[0]) * _SCALE + w_mem * float(d[0])))
                    mem_terms.append((n[m], float(d[0]) / _GB))
                    w_of[g] = [n[m]]
                    continue
                w = w_of[g] = [new_var(prob, f"w_{c}_{m}_{g}_{i}", 0, N, pulp.LpContinuous) for i in range(len(x[g]))]
                prob += pulp.LpAffineExpression([(v, 1) for v in w] + [(n[m], -1)]) == 0, f"wsum_{c}_{m}_{g}"
                for i, v in enumerate(w):
                    prob += pulp.LpAffineExpression([(v, 1), (x[g][i], -N)]) <= 0, f"wx_{c}_{m}_{g}_{i}"
                    terms.append((v, float(e[i]) * _SCALE + w_mem * float(d[i])))
                    mem_terms.append((v, float(d[i]) / _GB))
            for g, h in pair_keys:  # v >= w[g, i] + w[h, j] - n: n instances when both take (i, j), else 0
                mat = extra[(g, h)]
                for i, j in zip(*np.nonzero(mat > 0)):
                    v = new_var(prob, f"v_{c}_{m}_{g}_{h}_{i}_{j}", 0, N, pulp.LpContinuous)
                    prob += pulp.LpAffineExpression([(v, 1), (w_of[g][i], -1), (w_of[h][j], -1), (n[m], 1)]) >= 0, \
                        f"v_{c}_{m}_{g}_{h}_{i}_{j}"
                    terms.append((v, float(mat[i, j]) * _SCALE))
    return counts


def _shared_vars(prob: pulp.LpProblem, problem: Problem, x: list[list], pair_vars: dict, terms: list,
                 w_coll: float) -> tuple[int, int]:
    """Add y[a, K] >= ind_u(a, K) of every shared key (`shared_uses` module docstring) and its cost to `terms`
    (in place). Returns (variables, constraints) added."""
    num_vars = num_cons = 0
    for n, sr in enumerate(problem.shared):
        g = sr.g
        for a in range(len(x[g])):
            for K in range(sr.cost.shape[1]):
                inds = [ind for h, key_of in sr.uses
                        if (ind := _indicator(x, pair_vars, g, a, h, key_of, K)) is not None]
                if not inds or not (sr.cost[a, K] > 0 or sr.count[a, K] > 0):
                    continue
                y = new_var(prob, f"y_{n}_{a}_{K}", 0, 1, pulp.LpContinuous)
                terms.append((y, float(sr.cost[a, K]) * _SCALE + w_coll * float(sr.count[a, K])))
                num_vars += 1
                for m, ind in enumerate(inds):
                    prob += _at_least(y, ind), f"y_{n}_{a}_{K}_{m}"
                    num_cons += 1
    return num_vars, num_cons


def _at_least(y: pulp.LpVariable, ind) -> pulp.LpConstraint:
    """The row `y - ind >= 0` exactly as PuLP's operators build it (terms in that order, the same constant, 0 or
    0.0), without their intermediate copies: `ind` a variable, a list of variables (PuLP's `lpSum` of them), or
    anything else (built by the operators)."""
    if isinstance(ind, pulp.LpVariable):
        expr = pulp.LpAffineExpression([(y, 1), (ind, -1)], constant=0)
    elif isinstance(ind, list):
        expr = pulp.LpAffineExpression([(y, 1)] + [(v, -1) for v in ind], constant=0.0)
    else:
        return y - ind >= 0
    return pulp.LpConstraint(expr, pulp.LpConstraintGE, rhs=0)


def _indicator(x: list[list], pair_vars: dict, g: int, a: int, h: int, key_of: tuple[int, ...], K: int):
    """ind_u(a, K) (`shared_uses`): 1 when group g takes strategy a and use u (group h, key index per strategy)
    takes key K: a variable (or 1), or a list of variables whose sum it is; None when it is always 0."""
    cols = [b for b, key in enumerate(key_of) if key == K]
    if not cols:
        return None
    if h == g:
        return x[g][a] if a in cols else None
    if len(x[h]) == 1:  # the use's strategy is fixed
        return x[g][a]
    if len(x[g]) == 1:
        return [x[h][b] for b in cols]  # their sum (`_at_least`)
    lo, hi = min(g, h), max(g, h)
    e = pair_vars[(lo, hi)]
    vs = [e[a][b] if g == lo else e[b][a] for b in cols]
    vs = [v for v in vs if v is not None]
    return vs or None


def _time_limit_binds(problem: Problem) -> bool:
    """Whether a solve stopped without a plan can only have been stopped by its time limit: even the heaviest
    placement of every group (`problem.most_memory_bytes`) fits the budget, so the memory row cannot exclude any plan, and
    arc consistency leaves every group a placement (`diagnose.structurally_open`). Round 20 (r20h): mT5's default
    config on dp=2 x tp=2 under load stopped at its 60 s limit and was told the 71 GB budget (787 MB needed) might
    bind."""
    if problem.graph is None or most_memory_bytes(problem) > problem.budget_bytes:
        return False
    from .diagnose import structurally_open
    return structurally_open(problem)


def _binding(problem: Problem, config: PlanConfig) -> str:
    """What binds (`diagnose.binding_constraint`), or the memory statement when the problem has no graph."""
    if problem.graph is None:
        return f"the memory budget {format_bytes(problem.budget_bytes)} or the solver's time limit binds"
    from .diagnose import binding_constraint
    return binding_constraint(problem, problem.graph, config)


def _solver(config: PlanConfig):
    if config.solver == "highs" and "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        return "highs", BulkHiGHS(msg=False, timeLimit=config.time_limit_s, threads=1,  # PuLP's model, in bulk
                                  gapRel=config.mip_rel_gap, gapAbs=_ABS_GAP_US, random_seed=0)
    return "cbc", pulp.PULP_CBC_CMD(msg=False, timeLimit=config.time_limit_s, threads=1,
                                    gapRel=config.mip_rel_gap, options=["randomSeed 0", "randomCbcSeed 0"])


def _gap(prob: pulp.LpProblem, solver_name: str) -> float | None:
    if solver_name != "highs":
        return None
    try:
        gap = float(prob.solverModel.getInfo().mip_gap)
    except Exception:  # noqa: BLE001 -- an older highspy without getInfo: unknown gap
        return None
    if gap != gap or gap == float("inf"):  # no MIP (every group fixed) or no bound reported
        return 0.0 if prob.sol_status == pulp.LpSolutionOptimal else None
    return gap
