"""The ILP's memory row checked against the replay of the plan it picks (round 25, r25d; RESULTS.md "Round 25 (r25d)").

The memory row (`problem.build_problem`) prices each op's saved bytes per strategy on the GLOBAL graph's storages
(`Pricer.node_cost`); a chosen plan's activations are priced by replaying it on each rank's LOCAL shapes and strides
(`local_storage.local_saved_bytes`: view or copy by the local strides, a redistributed input its own storage, the
first saver of a storage charged it). The two differ by a term that depends on the strategies of several nodes at once
(the view chain feeding a saver, the producer of a redistributed input, the other readers of its value), so the row
alone let the solver pick a plan that the replay then put over the budget, or reject one that fits.

`solve_fitting` makes the row agree with the replay where the solver looks:

    1. solve (`ilp.solve` / `ilp.solve_lean`); replay the pick; per op node n, d_n = replayed - row bytes;
    2. each d_n != 0 becomes a memory correction of the problem (`Problem.memory_cuts`): d_n bytes added to the row
       whenever the groups that decide n's storages (`_deciders`: n, the producers of its inputs through view chains,
       and every reader of those values) take the strategies they have in this pick (an AND of one-hot variables,
       `ilp._memory_cut_vars`: linear, exact for that assignment in either sign);
    3. the pick is returned when its replayed memory fits the budget and no correction that LOWERS the row was new
       (one could admit a faster plan the row rejected) or the row cannot exclude any plan (`ilp.max_memory_bytes`);
       otherwise re-solve with the corrections, up to `MAX_FIT_ROUNDS` solves. A pick over the budget whose
       corrections were all known already (its storages depend on a group outside the deciders) gets the excess on
       its whole assignment (it cannot be picked again).

Never reported as fitting: a plan whose replayed memory (`replayed_memory_bytes`, = `api.to_plan`'s
`memory_bytes["total"]`) exceeds the budget. After the last round the fastest pick that fitted is kept; when none did,
`InfeasiblePlanError` names the node the replay holds most above its row, the excess and the remedies.
"""
from __future__ import annotations

import dataclasses
import operator

import torch

from ..config import PlanConfig
from ..errors import InfeasiblePlanError, format_bytes
from ..tracer import TracedGraph
from .costs import Pricer
from .ilp import (Solution, _memory_remedies, decision_counts, max_memory_bytes, memory_bytes, recompute_cost, solve,
                  solve_lean)
from .local_storage import local_saved_bytes
from .problem import Problem, cut_bytes, layout_of

__all__ = ["MAX_FIT_ROUNDS", "node_excess", "replayed_memory_bytes", "solve_fitting"]

MAX_FIT_ROUNDS = 5  # solves at most; each learns the corrections of one pick (a pick is never repeated over budget)


def solve_fitting(tg: TracedGraph, problem: Problem, pricer: Pricer, config: PlanConfig,
                  lean: bool = False) -> tuple[Problem, Solution, dict[str, int]]:
    """(the problem with the corrections learnt, the solution, its replayed saved bytes per op node: `local_saved_bytes`)
    of the fastest plan whose memory replayed on the ranks' local storages fits `problem.budget_bytes` (module
    docstring). `problem` is not changed (the corrections go into a copy). `lean`: `ilp.solve_lean` instead of
    `ilp.solve`. The returned `Solution.time_s` sums the solver's time of every solve.

    Raises:
        InfeasiblePlanError: as `ilp.solve`, or no pick of `MAX_FIT_ROUNDS` solves fits the budget by its replay
            (names the node held most above its row, its op, output shape and strategy, the excess and the mesh).
    """
    run = solve_lean if lean else solve
    problem = dataclasses.replace(problem, memory_cuts=dict(problem.memory_cuts))
    best: tuple[Solution, dict[str, int]] | None = None
    spent, last = 0.0, None
    for _ in range(MAX_FIT_ROUNDS):
        try:
            sol = run(problem, config)
        except InfeasiblePlanError as exc:
            if best is None and last is not None:  # every plan left is over the budget by its replay
                raise _over_budget(tg, problem, *last) from exc
            if best is None:
                raise
            break  # the corrections exclude every other plan: the fitting pick stands
        spent += sol.time_s
        held = local_saved_bytes(tg, {n: layout_of(problem, n, sol.choice) for n in problem.spaces}, problem.spaces,
                                 pricer)
        excess = node_excess(tg, problem, pricer, sol.choice, held)
        total = replayed_memory_bytes(problem, sol, excess)
        fits = total <= problem.budget_bytes
        last = (sol, excess, total)
        if fits and (best is None or sol.objective_s < best[0].objective_s):
            best = (sol, held)
        lowers = _learn(tg, problem, sol.choice, excess)
        if fits and (not lowers or max_memory_bytes(problem) <= problem.budget_bytes):
            break
        corrected = memory_bytes(problem, sol.choice) + recompute_delta(problem, sol)
        if not fits and corrected < total:  # the deciders missed a dependency: this very pick is excluded
            _exclude(problem, sol.choice, total - corrected)
    if best is None:
        raise _over_budget(tg, problem, *last)
    return problem, dataclasses.replace(best[0], time_s=spent), best[1]


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


def replayed_memory_bytes(problem: Problem, sol: Solution, excess: dict[str, int]) -> int:
    """Bytes per device of the plan of `sol` with its activations as replayed (`api.to_plan`'s
    `memory_bytes["total"]`): the row without corrections, the recomputation's saved-bytes change, and the replay's
    excess over the row per node (`node_excess`)."""
    row = memory_bytes(problem, sol.choice) - cut_bytes(problem, sol.choice)
    return int(row + recompute_delta(problem, sol) + sum(excess.values()))


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
    larger. Returns whether a correction that lowers the row was added."""
    learnt: dict[tuple, float] = {}
    for name, space in problem.spaces.items():
        if space.kind == "op" and (name in excess or problem.memory_cuts):
            assign = tuple((g, choice[g]) for g in _deciders(tg, problem, name))
            learnt[assign] = learnt.get(assign, 0.0) + excess.get(name, 0)
    lowers = False
    for assign, b in learnt.items():
        if assign not in problem.memory_cuts and b:
            problem.memory_cuts[assign] = b
            lowers |= b < 0
        elif assign in problem.memory_cuts:
            problem.memory_cuts[assign] = max(problem.memory_cuts[assign], b)
    return lowers


def _exclude(problem: Problem, choice: tuple[int, ...], nbytes: float) -> None:
    """Add `nbytes` to the row at exactly `choice` (every group with a choice): the corrections learnt did not
    reproduce the replay there."""
    assign = tuple((g, c) for g, c in enumerate(choice) if len(problem.lin[g]) > 1)
    problem.memory_cuts[assign] = problem.memory_cuts.get(assign, 0.0) + nbytes


def _over_budget(tg: TracedGraph, problem: Problem, sol: Solution, excess: dict[str, int],
                 total: int) -> InfeasiblePlanError:
    """The error when no pick fitted by its replay: the node held most above its row (op, output shape, strategy)."""
    worst = max(excess, key=lambda n: (excess[n], n)) if excess else None
    where = ""
    if worst is not None:
        info, s = tg.nodes[worst], layout_of(problem, worst, sol.choice)
        shapes = ", ".join(str(tuple(o.shape)) for o in info.outputs)
        where = (f"; the node held most above its per-strategy price is {info.node.format_node()} ({info.op_name}, "
                 f"output {shapes}, strategy {' '.join(str(L) for L in s.inputs)} -> {s.output}): "
                 f"{excess[worst]:+,} B per rank")
    return InfeasiblePlanError(
        f"memory: no plan the solver found fits the budget {format_bytes(problem.budget_bytes)} on mesh "
        f"{problem.mesh} by its replay on the ranks' local storages (`planner.memory_fit`); the last pick holds "
        f"{format_bytes(total)} ({total:,} B), {total - problem.budget_bytes:,} B over" + where
        + ". Remedies: " + _memory_remedies(problem, problem.config))
