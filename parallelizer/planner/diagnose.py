"""Why a planning problem has no solution: name the node, its op and the constraint that binds
(issue: "never 'probably memory' when memory is not the cause").

`binding_constraint(problem, tg, config)` propagates which strategies remain possible (arc consistency over
the ILP's inf entries): a strategy of a group is dropped when its own cost is inf (no layout change reaches
it) or when, for some neighbouring group, every remaining strategy there is an impossible pair with it. A
group left with no strategy is a node that no plan can place; the edge that emptied it, and why that edge is
impossible (a Partial value that no collective makes, the axis roles, an in-place mutation that must not be
redistributed), name the constraint. Without such a group the structural constraints are satisfiable and
the memory budget (or the solver's time limit) is what binds.

The group that propagation empties first is often not the cause: a conflict at an op that reads across the
batch (`F.normalize(h, dim=0)` under forced ddp) propagates back and empties the linear before it, which is
then blamed. So the node named is the first one in program order whose group makes the problem infeasible:
the smallest prefix of groups (in the order of their first node) that propagation proves infeasible, found by
bisection (adding groups only adds constraints, so infeasibility is monotone in the prefix).
"""
from __future__ import annotations

import numpy as np

from ..config import PlanConfig
from ..tracer import TracedGraph
from ..tracer.graph import alias_source, mutated_args
from .problem import Problem, min_memory_bytes
from .edge_roles import mutation_edges, role_axes


def _alive_after_propagation(problem: Problem, prefix: int | None = None) -> tuple[list[np.ndarray], int | None, tuple | None]:
    """(alive masks per group, first group emptied or None, (group, neighbour) pair that emptied it), over the
    groups with index < `prefix` and the pairs between them (all groups when None)."""
    count = len(problem.lin) if prefix is None else prefix
    alive = [np.isfinite(lin) for lin in problem.lin[:count]]
    for g, mask in enumerate(alive):
        if not mask.any():
            return alive, g, None
    neighbours: dict[int, list[tuple[int, np.ndarray]]] = {}
    for (a, b), mat in problem.pairs.items():
        if a >= count or b >= count:
            continue
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


def structurally_open(problem: Problem) -> bool:
    """Whether propagation leaves every group a strategy (no node that no plan can place)."""
    return _alive_after_propagation(problem)[1] is None


def _first_conflict(problem: Problem) -> int:
    """The group whose addition first makes propagation prove infeasibility: the smallest k such that the groups
    0..k (and the pairs among them) are infeasible (module docstring). Call only when all groups are."""
    low, high = 0, len(problem.lin) - 1  # the answer lies in [low, high]; prefix high + 1 is infeasible
    while low < high:
        mid = (low + high) // 2
        if _alive_after_propagation(problem, mid + 1)[1] is None:
            low = mid + 1
        else:
            high = mid
    return low


def _conflicting_neighbour(problem: Problem, g: int) -> int | None:
    """A neighbour group (earlier than `g`) none of whose strategies still possible before `g` was added is
    compatible with any strategy of `g`, or None when the conflict needs several neighbours together."""
    alive, _, _ = _alive_after_propagation(problem, g)
    own = np.isfinite(problem.lin[g])
    for (a, b), mat in sorted(problem.pairs.items()):
        if g not in (a, b) or max(a, b) > g or a == b:
            continue
        h, ok = (b, np.isfinite(mat)) if a == g else (a, np.isfinite(mat).T)
        if not ok[np.ix_(own, alive[h])].any():
            return h
    return None


def binding_constraint(problem: Problem, tg: TracedGraph, config: PlanConfig) -> str:
    """A sentence naming what makes the problem infeasible (module docstring)."""
    _, empty, _ = _alive_after_propagation(problem)
    if empty is not None:
        empty = _first_conflict(problem)
        neighbour = _conflicting_neighbour(problem, empty)
        pair = None if neighbour is None else (empty, neighbour)
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
    mates = [m for m in problem.groups[empty][1:] if m in tg.nodes]
    if mates:  # placed as one ILP variable: the op that binds may be any of them (e.g. a norm over the batch)
        what += (" placed together with " + ", ".join(f"{m} ({tg.nodes[m].op_name})" for m in mates[:4])
                 + (f" and {len(mates) - 4} more" if len(mates) > 4 else ""))
    if pair is None:
        return (f"{what}: none of its strategies fits what the nodes before it allow (the first node in program "
                f"order that no plan can place): {_why(problem, tg, config, node, None)}")
    other = problem.groups[pair[1]][0]
    return (f"{what}: no strategy of it is compatible with {other} ({tg.nodes[other].op_name}) (the first node in "
            "program order that no plan can place): " + _why(problem, tg, config, node, other))


def _writer_through(node) -> str | None:
    """For a view node (detach, view, ...): the in-place op that writes through it ("embedding_renorm_
    (aten.embedding_renorm_.default)"), else None (the node itself writes its input)."""
    if alias_source(node) is None or mutated_args(node):
        return None
    for user in node.users:
        if any(p < len(user.args) and user.args[p] is node for p in mutated_args(user)):
            return f"{user.name} ({user.target})"
        inner = _writer_through(user)
        if inner is not None:
            return inner
    return None


def _no_rule_writer(problem: Problem, writer: str) -> str:
    """A prefix naming in-place op `writer` when it has no sharding rule: it runs replicated, so the value it
    writes must be replicated where it lives, which data-parallel axis roles forbid (round 17: `F.elu(h[..., :4],
    inplace=True)` on ddp was blamed on ops pairing samples); "" when it has a rule."""
    space = problem.spaces.get(writer)
    if space is None or not space.fallback or not space.fallback.startswith("no sharding rule"):
        return ""
    return (f"{writer} has {space.fallback} and writes in place, so it runs replicated on a replicated value: "
            "write it out of place (e.g. `h = torch.cat([f(h[..., :k]), h[..., k:]], -1)`) or plan without "
            "axis_roles; ")


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
                written_param = problem.spaces[ti.producer].kind == "param"
                reasons.append(("" if written_param else
                                _no_rule_writer(problem, name if writer is None else writer.split(" ")[0]))
                               + (f"{name} writes {ti.producer} in place, so that value may not be redistributed"
                                  if writer is None else
                                  f"{name} is a view of {ti.producer} that {writer} writes in place, so that value "
                                  "may not be redistributed"))
    data, tp = role_axes(problem.mesh, config)
    experts = _sorted_token_experts(tg, members) if data else None
    if experts is not None:
        reasons.append(experts)
    if data or tp:
        roles = dict(config.axis_roles)
        reasons.append(f"the axis roles {roles} forbid gathering activations over {[problem.mesh.axis_names[i] for i in data]}"
                       f" and parameters over {[problem.mesh.axis_names[i] for i in tp]}"
                       + (" (an op that pairs samples across the batch, as an in-batch contrastive or ranking loss "
                          "does with a @ b.T over it, or a graph network's message passing does when it gathers node "
                          "features by edge index (the nodes are the batch), needs every sample on each rank: compute "
                          "such a loss outside the model, on the ParallelModule's outputs, which are whole; leave a "
                          "graph network's data axis free)" if data else ""))
    reasons.append("a Partial value cannot become what a consumer needs without a reduction, and a Shard cannot "
                   "become Partial")
    remedy = ("plan without axis_roles (or with 'auto' on an axis) to see whether they bind" if data or tp else
              "report this graph: a node no layout can reach is a planner bug")
    if experts is not None:
        remedy = (f"{GROUPED_EXPERTS_REMEDY}, or {remedy}")
    return "; or ".join(reasons[:2] if len(reasons) > 2 else reasons) + f". Remedy: {remedy}"


GROUPED_EXPERTS_REMEDY = ("switch the experts to transformers' per-token path before tracing: "
                          "model.set_experts_implementation(\"batched_mm\") (each token gathers its own experts' weights: "
                          "no sort over the whole batch; GPT-OSS on ddp / fsdp dp=2 plans with it and matches one "
                          "device, ratio 0.031, round 18)")
"""The remedy `_why` gives when a data-parallel role meets transformers' grouped_mm experts (`_sorted_token_experts`)."""


def _sorted_token_experts(tg: TracedGraph, members: set[str]) -> str | None:
    """A reason naming transformers' grouped_mm experts (`transformers::grouped_mm_fallback`, the MoE path of the
    transformers 5 families on CPU) among `members` or their inputs, else None. Its rows are the tokens of the
    WHOLE batch sorted by expert (an `aten.sort` over batch x tokens) and its `offs` are global row positions, so
    no rule lets a rank keep only its own samples' rows (`rules.linalg.grouped_mm`): under a "ddp" / "fsdp" role
    the sorted tokens would have to be gathered, which the role forbids. The model is per-token (each rank could
    sort its own tokens), but an op-by-op plan cannot express a sort of local rows (round 18, GPT-OSS: its expert
    biases, gathered by the sorted expert ids, need the rows replicated)."""
    near = set(members)
    for name in members:
        node = tg.nodes[name].node if name in tg.nodes else None
        if node is not None:
            near |= {a.name for a in node.all_input_nodes} | {u.name for u in node.users}
    found = sorted(n for n in near if n in tg.nodes and "grouped_mm" in str(tg.nodes[n].node.target))
    if not found:
        return None
    return (f"{found[0]} ({tg.nodes[found[0]].op_name}) runs transformers' grouped_mm experts: their rows are the "
            "tokens of the whole batch sorted by expert, with group offsets that are global row positions, so no rank "
            "can keep only its own samples' rows, and the data-parallel axis roles forbid gathering them")
