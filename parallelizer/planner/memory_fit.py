"""The ILP's memory rows checked against the replay of the plan it picks (round 25 r25d; round 26 r26d: the step peak).

The memory rows (`problem.memory_rows`: the bytes at cut points of the step, `peak_rows`) price each op's saved
bytes per strategy on the GLOBAL graph's storages (`Pricer.node_cost`); a chosen plan is priced by replaying it on
each rank's LOCAL shapes and strides (`local_storage.local_saved_bytes`: view or copy by the local strides, a
redistributed input its own storage, the first saver of a storage charged it) and walking its step
(`peak.step_peak`: forward and backward moments, with the transients the rows leave out: FSDP's regathered
parameters, DDP's buckets, a composite op's inner gradients, AdamW's temporaries, the forward's unsaved values).

`solve_fitting` makes the rows agree with the replay where the solver looks:

    1. solve (`ilp.solve` / `ilp.solve_lean`); replay the pick; per op node n, d_n = replayed - row saved bytes;
    2. each d_n != 0 becomes a memory correction of the problem (`Problem.memory_cuts`, added to every row): d_n
       bytes whenever the groups that decide n's storages (`_deciders`: n, the producers of its inputs through view
       chains, and every reader of those values) take the strategies they have in this pick (an AND of one-hot
       variables, `ilp._memory_cut_vars`: linear, exact for that assignment in either sign);
    3. the pick is returned when its replayed step peak (`replayed_peak`) fits the budget and no correction that
       LOWERS the rows was new (one could admit a faster plan the rows rejected) or the rows cannot exclude any plan
       (`problem.max_memory_bytes`); otherwise re-solve with the corrections, up to `MAX_FIT_ROUNDS` solves. A pick
       whose peak is over the budget at a backward moment no row stands at adds that moment's row (`peak_rows`, cut
       at its node: exact for every plan, lazily, as a cutting plane: since round 27 (r27d) the rows hold the
       transients of pairs of strategies too, DDP's kept buckets and FSDP's regathered parameters, over indicator
       variables, `peak_rows`); what its peak still exceeds the rows by (a forward moment, a saved-bytes correction
       of a node after the moment, the joint ILP's sum row) goes on the stored layouts it has (`_exclude`: the pick
       and its equally priced twins cannot recur; without free recomputation only while no region recomputes).

Never returned: a plan whose replayed step peak (= `api.to_plan`'s `memory_bytes["peak"]`) exceeds the budget. After
the last round the fastest pick that fitted is kept; when none did, `InfeasiblePlanError` says where the last pick
peaks (forward / backward node, optimizer step), by how much, the node the replay holds most above its row, and the
remedies.
"""
from __future__ import annotations

import dataclasses
import math
import operator

import torch

from ..config import PlanConfig
from ..core.layout import local_shape
from ..errors import InfeasiblePlanError, format_bytes
from ..tracer import TracedGraph
from .costs import Pricer
from .ilp import (Solution, _memory_remedies, decision_counts, max_memory_bytes, memory_bytes, recompute_cost, solve,
                  solve_lean)
from .local_storage import StorageSpan, local_saved_bytes
from .peak import StepPeak, step_peak
from .problem import Problem, cut_bytes, layout_of, rows_bytes
from .peak_rows import cut_rows
from .recompute import regions

__all__ = ["MAX_FIT_ROUNDS", "node_excess", "replayed_peak", "solve_fitting"]

MAX_FIT_ROUNDS = 8  # solves at most; each learns the corrections of one pick (a pick is never repeated over budget)
TOLERANCE_MARGIN_BYTES = 1024
"""The least margin (`Problem.memory_margin_bytes`) added when the solver returned a pick whose rows exceed the budget:
HiGHS's primal feasibility tolerance (1e-7, its default) on rows in GB is 100 B; 1 KiB clears it ten times over."""


def solve_fitting(tg: TracedGraph, problem: Problem, pricer: Pricer, config: PlanConfig,
                  lean: bool = False) -> tuple[Problem, Solution, dict[str, int], StepPeak]:
    """(the problem with the corrections learnt, the solution, its replayed saved bytes per op node: `local_saved_bytes`,
    its `StepPeak`) of the fastest plan whose step peak replayed on the ranks' local storages fits
    `problem.budget_bytes` (module docstring). `problem` is not changed (the corrections go into a copy). `lean`:
    `ilp.solve_lean` instead of `ilp.solve`. The returned `Solution.time_s` sums the solver's time of every solve.

    Raises:
        InfeasiblePlanError: as `ilp.solve`, or no pick of `MAX_FIT_ROUNDS` solves fits the budget by its replayed
            step peak (names where it peaks, the node held most above its row, its op, output shape and strategy, the
            excess and the mesh).
    """
    run = solve_lean if lean else solve
    problem = dataclasses.replace(problem, memory_cuts=dict(problem.memory_cuts), cut_rows=list(problem.cut_rows),
                                  exclusions=dict(problem.exclusions), stats=dict(problem.stats),
                                  memory_cut_at=dict(problem.memory_cut_at))
    best: tuple[Solution, dict[str, int], StepPeak] | None = None
    spent, last, seen = 0.0, None, {}
    for rounds in range(1, MAX_FIT_ROUNDS + 1):
        problem.stats["fit_rounds"] = rounds  # solves run (a test's and a benchmark's figure)
        try:
            sol = run(problem, config)
        except InfeasiblePlanError as exc:
            if best is None and last is not None:  # every plan left is over the budget by its replay
                raise _over_budget(tg, problem, *last) from exc
            if best is None:
                raise
            break  # the corrections exclude every other plan: the fitting pick stands
        spent += sol.time_s
        solver_rows = _bound_bytes(problem, sol)  # what the rows the solver had hold the pick to
        spans: list = []
        held = local_saved_bytes(tg, {n: layout_of(problem, n, sol.choice) for n in problem.spaces}, problem.spaces,
                                 pricer, spans)
        excess = node_excess(tg, problem, pricer, sol.choice, held)
        peak = replayed_peak(tg, problem, pricer, sol, held, spans)
        fits = peak.peak_bytes <= problem.budget_bytes
        last = (sol, excess, peak)
        if fits and (best is None or sol.objective_s < best[0].objective_s):
            best = (sol, held, peak)
        lowers = _learn(tg, problem, sol.choice, excess)
        if fits and (not lowers or max_memory_bytes(problem) <= problem.budget_bytes):
            break
        if fits:
            continue
        if solver_rows > problem.budget_bytes:  # within the solver's feasibility tolerance: keep the rows below it
            problem.memory_margin_bytes += max(2 * (solver_rows - problem.budget_bytes), TOLERANCE_MARGIN_BYTES)
        _add_row(tg, problem, pricer, peak)  # a row at the moment it peaks at, for every plan
        bound = _bound_bytes(problem, sol)
        if bound < peak.peak_bytes:  # the rows miss a transient or a dependency: this pick is excluded
            seen[peak.at] = seen.get(peak.at, 0) + 1  # again at the same moment: on every plan (a margin)
            _exclude(tg, problem, sol, peak.peak_bytes - bound, every=seen[peak.at] > 1)
    if best is None:
        raise _over_budget(tg, problem, *last)
    return problem, dataclasses.replace(best[0], time_s=spent), best[1], best[2]


def replayed_peak(tg: TracedGraph, problem: Problem, pricer: Pricer, sol: Solution, held: dict[str, int],
                  spans: list[StorageSpan]) -> StepPeak:
    """The step peak of `sol`'s plan on a rank (`peak.step_peak`, forward and backward), with its saved bytes and
    forward storages replayed on the local shards (`held`, `spans`: `local_saved_bytes`); resident = the stored
    parameter shards' params + optimizer bytes + buffers + returned values (`Problem.const_mem_bytes`); the
    recomputed regions' savings as `api.to_plan` prices them (`api.recompute_prices`)."""
    from .api import recompute_prices  # api imports this module
    strat = {n: layout_of(problem, n, sol.choice) for n in problem.spaces}
    resident = problem.const_mem_bytes
    for p in tg.parameters.values():
        if not p.is_buffer:
            numel = math.prod(local_shape(p.shape, strat[p.placeholders[0]].output, problem.mesh))
            param_b, _, opt_b = pricer.param_state_bytes(numel, p.requires_grad)
            resident += param_b + opt_b
    members = regions(tg)
    deltas = {members[r]: int(rp.saved_delta_bytes)
              for r, rp in recompute_prices(tg, problem, pricer, strat, dict(sol.recompute)).items()}
    return step_peak(tg, strat, problem.spaces, pricer, held, resident_bytes=resident, recompute_deltas=deltas,
                     forward_spans=spans)


def _add_row(tg: TracedGraph, problem: Problem, pricer: Pricer, peak: StepPeak) -> None:
    """Add the memory row of the backward moment `peak` is at (`peak_rows.cut_rows` cut at that node: what any plan
    holds there, its pair-dependent transients included) when the ILP has cut rows and not that one yet."""
    node = peak.at.removeprefix("backward of ")
    label = f"backward at {node}"
    if problem.cut_rows and node != peak.at and all(row.label != label for row in problem.cut_rows):
        problem.cut_rows += cut_rows(tg, problem.spaces, problem.group_of, problem.sizes(), problem.node_saved,
                                     pricer, problem.mesh, at={node})


def _bound_bytes(problem: Problem, sol: Solution) -> float:
    """What the ILP's memory rows held `sol` to: the largest cut row (`problem.rows_bytes`), or, where it chose
    recomputation of free regions (the joint ILP bounds the sum row), the sum row with that recomputation."""
    if decision_counts(problem, dict(sol.recompute)):  # `memory_bytes`: the sum row, with every correction
        return memory_bytes(problem, sol.choice) - cut_bytes(problem, sol.choice) \
            + cut_bytes(problem, sol.choice, recompute=True) + recompute_delta(problem, sol)
    return rows_bytes(problem, sol.choice)


def node_excess(tg: TracedGraph, problem: Problem, pricer: Pricer, choice: tuple[int, ...],
                held: dict[str, int]) -> dict[str, int]:
    """{op node: bytes its saved tensors hold on a rank (`held`, the replay) minus the row's per-strategy price of
    them (`Pricer.node_cost(...).saved_bytes`, what `problem.mem` sums)}, nonzero entries only."""
    out = {}
    for name, space in problem.spaces.items():
        if space.kind != "op":
            continue
        row = pricer.node_cost(tg, tg.nodes[name], space, layout_of(problem, name, choice)).saved_bytes
        if held.get(name, 0) != row:
            out[name] = held.get(name, 0) - row
    return out


def recompute_delta(problem: Problem, sol: Solution) -> float:
    """Saved-bytes change of the free recomputation regions `sol` recomputes (`ilp.recompute_cost`; forced regions
    are in `problem.mem` already)."""
    return recompute_cost(problem, sol.choice, decision_counts(problem, dict(sol.recompute)))[1]


def _deciders(tg: TracedGraph, problem: Problem, name: str) -> tuple[int, ...]:
    """The groups whose strategies decide which storages node `name` keeps on a rank (sorted): its own, the producers
    of its inputs and, through view ops (a storage seen through a view chain), theirs, and every reader of those
    values (a redistribution shared with another reader, or a storage an earlier saver owns)."""
    spaces, group_of = problem.spaces, problem.group_of
    groups, seen = {group_of[name]}, set()
    todo = [ti.producer for ti in spaces[name].inputs]
    while todo:
        p = todo.pop()
        if p in seen or p not in spaces or spaces[p].kind == "param":
            continue
        seen.add(p)
        groups.add(group_of[p])
        groups.update(group_of[u.name] for u in tg.nodes[p].node.users if u.name in spaces)
        target = tg.nodes[p].node.target
        if target is operator.getitem or (isinstance(target, torch._ops.OpOverload) and target.is_view):
            todo.extend(ti.producer for ti in spaces[p].inputs)
    return tuple(sorted(groups))


def _learn(tg: TracedGraph, problem: Problem, choice: tuple[int, ...], excess: dict[str, int]) -> bool:
    """Record the replay's excess at `choice` as corrections over the deciders' assignments (module docstring, 2):
    per assignment the sum over the op nodes that have it (block instances share groups), 0 included where a
    correction was learnt before. An assignment seen with two values (a dependency outside its deciders) keeps the
    larger. Each keeps its bytes per op position (`Problem.memory_cut_at`: a row at a moment of the step takes those
    of the nodes whose saved tensors are alive there). Returns whether a correction that lowers the row was added."""
    learnt: dict[tuple, float] = {}
    at: dict[tuple, dict[int, float]] = {}
    ops = [n for n, s in problem.spaces.items() if s.kind == "op"]
    for i, name in enumerate(ops):
        if name in excess or problem.memory_cuts:
            assign = tuple((g, choice[g]) for g in _deciders(tg, problem, name))
            learnt[assign] = learnt.get(assign, 0.0) + excess.get(name, 0)
            if excess.get(name, 0):
                at.setdefault(assign, {})[i] = float(excess[name])
    lowers = False
    for assign, b in learnt.items():
        if assign not in problem.memory_cuts and b:
            problem.memory_cuts[assign] = b
            problem.memory_cut_at[assign] = at.get(assign, {})
            lowers |= b < 0
        elif assign in problem.memory_cuts and b > problem.memory_cuts[assign]:
            problem.memory_cuts[assign] = b
            problem.memory_cut_at[assign] = at.get(assign, {})
    return lowers


def _exclude(tg: TracedGraph, problem: Problem, sol: Solution, nbytes: float, every: bool = False) -> None:
    """Add what `sol`'s replayed peak exceeds its rows by (`nbytes`: a forward moment, a correction the rows place
    at the wrong moment, the joint ILP's sum row) to the rows at the stored layouts it has (the parameters'
    groups: what those transients depend on most; every plan sharing them gets it too, so the pick cannot recur and
    its equally priced twins neither); `every`: to every plan (a pick over the budget at a moment where one was
    already: a margin, conservative, so that the loop ends). Without free recomputation in `Problem.exclusions`
    (the plain ILP only: recomputing may make those layouts fit), with it in the corrections of both ILPs."""
    params = {problem.group_of[ph] for p in tg.parameters.values() if not p.is_buffer for ph in p.placeholders}
    assign = () if every else tuple((g, sol.choice[g]) for g in sorted(params) if len(problem.lin[g]) > 1)
    if decision_counts(problem, dict(sol.recompute)):
        problem.memory_cuts[assign] = problem.memory_cuts.get(assign, 0.0) + nbytes
        return
    over_sum = nbytes + rows_bytes(problem, sol.choice) - (memory_bytes(problem, sol.choice) - cut_bytes(problem, sol.choice)
                                                           + cut_bytes(problem, sol.choice, recompute=True))
    rows, sums = problem.exclusions.get(assign, (0.0, 0.0))
    problem.exclusions[assign] = (rows + nbytes, max(sums, over_sum))


def _over_budget(tg: TracedGraph, problem: Problem, sol: Solution, excess: dict[str, int],
                 peak: StepPeak) -> InfeasiblePlanError:
    """The error when no pick fitted by its replay: where the last pick peaks, and the node held most above its row
    (op, output shape, strategy)."""
    worst = max(excess, key=lambda n: (excess[n], n)) if excess else None
    where = ""
    if worst is not None:
        info, s = tg.nodes[worst], layout_of(problem, worst, sol.choice)
        shapes = ", ".join(str(tuple(o.shape)) for o in info.outputs)
        where = (f"; the node held most above its per-strategy price is {info.node.format_node()} ({info.op_name}, "
                 f"output {shapes}, strategy {' '.join(str(L) for L in s.inputs)} -> {s.output}): "
                 f"{excess[worst]:+,} B per rank")
    total = peak.peak_bytes
    return InfeasiblePlanError(
        f"memory: no plan the solver found fits the budget {format_bytes(problem.budget_bytes)} on mesh "
        f"{problem.mesh} by its step peak replayed on the ranks' local storages (`planner.memory_fit`, "
        f"`planner.peak`); the last pick peaks at {format_bytes(total)} ({total:,} B, {peak.at}: "
        f"{peak.saved_bytes:,} B saved activations, {peak.grad_bytes:,} B gradients, {peak.transient_bytes:,} B "
        f"transient), {total - problem.budget_bytes:,} B over" + where + ". Remedies: "
        + _memory_remedies(problem, problem.config))
