"""Why a planning problem has no solution: name the node, its op and the constraint that binds
(issue: "never 'probably memory' when memory is not the cause").

`binding_constraint(problem, tg, config)` propagates which strategies remain possible (arc consistency over
the ILP's inf entries): a strategy of a group is dropped when its own cost is inf (no layout change reaches
it) or when, for some neighbouring group, every remaining strategy there is an impossible pair with it. A
group left with no strategy is a node that no plan can place; the edge that emptied it, and why that edge is
impossible (a Partial value that no collective makes, the axis roles, an in-place mutation that must not be
redistributed), name the constraint. Without such a group the structural constraints are satisfiable and
the memory budget (or the solver's time limit) is what binds.
"""
from __future__ import annotations

import numpy as np

from ..config import PlanConfig
from ..tracer import TracedGraph
from ..tracer.graph import is_view, mutated_args
from .problem import Problem, min_memory_bytes
from .strategies import mutation_edges, role_axes


def _alive_after_propagation(problem: Problem) -> tuple[list[np.ndarray], int | None, tuple | None]:
    """(alive masks per group, first group emptied or None, (group, neighbour) pair that emptied it)."""
    alive = [np.isfinite(lin) for lin in problem.lin]
    for g, mask in enumerate(alive):
        if not mask.any():
            return alive, g, None
    neighbours: dict[int, list[tuple[int, np.ndarray]]] = {}
    for (a, b), mat in problem.pairs.items():
        ok = np.isfinite(mat)
        neighbours.setdefault(a, []).append((b, ok))
        neighbours.setdefault(b, []).append((a, ok.T))
    changed = True
    while changed:
        changed = False
        for g in range(len(alive)):
            for h, ok in neighbours.get(g, ()):
                keep = alive[g] & (ok[:, alive[h]].any(axis=1) if alive[h].any() else False)
                if not np.array_equal(keep, alive[g]):
                    alive[g] = keep
                    changed = True
                    if not keep.any():
                        return alive, g, (g, h)
    return alive, None, None


def binding_constraint(problem: Problem, tg: TracedGraph, config: PlanConfig) -> str:
    """A sentence naming what makes the problem infeasible (module docstring)."""
    _, empty, pair = _alive_after_propagation(problem)
    if empty is None:
        need = min_memory_bytes(problem)
        from ..errors import format_bytes
        return (f"every node has a placement that its neighbours accept, so the binding constraint is the memory "
                f"budget {format_bytes(problem.budget_bytes)} (the leanest plan needs {format_bytes(need)}) together "
                "with the communication the lean placements force, or the solver's time limit")
    node = problem.groups[empty][0]
    info = tg.nodes[node]
    shape = info.outputs[0].shape if info.outputs else ()
    what = f"node {node} ({info.op_name}, output shape {tuple(shape)})"
    if pair is None:
        return f"{what}: none of its strategies can be reached from its inputs ({_why(problem, tg, config, node, None)})"
    other = problem.groups[pair[1]][0]
    return (f"{what}: no strategy of it is compatible with {other} ({tg.nodes[other].op_name}): "
            + _why(problem, tg, config, node, other))


def _writer_through(node) -> str | None:
    """For a view node (detach, view, ...): the in-place op that writes through it ("embedding_renorm_
    (aten.embedding_renorm_.default)"), else None (the node itself writes its input)."""
    if not is_view(node) or mutated_args(node):
        return None
    for user in node.users:
        if any(p < len(user.args) and user.args[p] is node for p in mutated_args(user)):
            return f"{user.name} ({user.target})"
        inner = _writer_through(user)
        if inner is not None:
            return inner
    return None


def _why(problem: Problem, tg: TracedGraph, config: PlanConfig, node: str, other: str | None) -> str:
    """Which constraint makes the edges between `node` and `other` (or into `node`) impossible."""
    members = set(problem.groups[problem.group_of[node]])
    if other is not None:
        members |= set(problem.groups[problem.group_of[other]])
    mutated = mutation_edges(tg)
    reasons = []
    for name in sorted(members):
        space = problem.spaces[name]
        for k, ti in enumerate(space.inputs):
            if (name, k) in mutated:
                writer = _writer_through(tg.nodes[name].node)
                reasons.append(f"{name} writes {ti.producer} in place, so that value may not be redistributed"
                               if writer is None else
                               f"{name} is a view of {ti.producer} that {writer} writes in place, so that value "
                               "may not be redistributed")
    data, tp = role_axes(problem.mesh, config)
    if data or tp:
        roles = dict(config.axis_roles)
        reasons.append(f"the axis roles {roles} forbid gathering activations over {[problem.mesh.axis_names[i] for i in data]}"
                       f" and parameters over {[problem.mesh.axis_names[i] for i in tp]}"
                       + (" (an op that pairs samples across the batch, as an in-batch contrastive or ranking loss "
                          "does with a @ b.T over it, needs every sample on each rank: compute such a loss outside "
                          "the model, on the ParallelModule's outputs, which are whole)" if data else ""))
    reasons.append("a Partial value cannot become what a consumer needs without a reduction, and a Shard cannot "
                   "become Partial")
    remedy = ("plan without axis_roles (or with 'auto' on an axis) to see whether they bind" if data or tp else
              "report this graph: a node no layout can reach is a planner bug")
    return "; or ".join(reasons[:2] if len(reasons) > 2 else reasons) + f". Remedy: {remedy}"
