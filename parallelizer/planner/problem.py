"""The planning problem as numbers: variable groups, linear costs, pairwise (edge) cost matrices, memory.

A *group* is one set of one-hot strategy variables. Nodes share a group when
  * one follows the other (`strategies.py`), or
  * they sit at the same position of different instances of a repeated block (`PlanConfig.cluster_blocks`):
    the costs of all instances are summed into the shared variables, i.e. one block's variables are solved
    once and its cost counts `BlockGroup.count` times;
  * they are placeholders of the same (tied) parameter, or parameters at the same position of a block.

Costs (seconds) on group g, strategy i: `lin[g][i]` = compute of every member node + every edge whose two
ends are in g; `pair[(g, h)][i, j]` = every edge between g and h (forward + backward collective seconds,
including gradient synchronisation; inf where `PlanConfig.axis_roles` forbid the pair, `EdgeRoles`). A pair
matrix that is separable (C[i,j] = a_i + b_j) is folded into
`lin` exactly. Memory (bytes per device) `mem[g][i]` = training state of stored parameter shards + activation
bytes saved for backward; `const_mem_bytes` covers buffers and the values the program returns
(`output_mem_bytes`, `returned_bytes`: whole on every rank). `cut_rows`: the bytes at moments of the step
(`peak_rows.MemRow`: activations still saved + gradients made + activation gradients alive, per block boundary, and
what depends on pairs of strategies, DDP's kept buckets and FSDP's regathered parameters, as indicator terms; the end
of backward and the optimizer step), which the ILP bounds instead of the sum (`memory_rows`, `ilp.py`; round 26 r26d,
round 27 r27d); empty where the budget cannot bind or a forced recomputation is folded into `mem`.

Activation recomputation (`planner.recompute`, `recompute_terms`): a region's mode adds `RegionPrice` terms,
linear in the strategies of the groups of its nodes. Forced modes (a user's checkpoint regions; a
`PlanConfig.recompute` other than "auto"/"none" on every other region) are folded into `lin` (extra forward
seconds) and `mem` (saved-bytes change) and listed in `recompute_fixed`; under "auto" the free regions are
grouped into `RecomputeClass`es (regions whose nodes share the same groups, i.e. all instances of a block
with `cluster_blocks`), whose per-instance terms the ILP multiplies by how many instances take each mode
(`ilp.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch.fx

from ..config import PlanConfig
from ..core.layout import Shard, local_shape
from ..core.mesh import MeshSpec
from ..core.redistribute import grad_partial_axes
from ..tracer import TracedGraph
from ..tracer.graph import carries_grad
from .costs import Pricer
from .peak_rows import MemRow, cut_rows, step_rows
from .shared_uses import EdgeUse, SharedRedistribution, share, use_epochs
from .recompute import RECOMPUTE_MODES, forced_regions, price_region, region_recompute, regions, shared_inputs
from .edge_roles import EdgeRoles, mutation_edges, parameter_views, role_axes
from .strategies import NodeSpace, Strategy, TensorInput


@dataclass
class Problem:
    """See module docstring. `group_of[node]` -> group index; `groups[g]` -> member node names."""

    mesh: MeshSpec
    spaces: dict[str, NodeSpace]
    group_of: dict[str, int]
    groups: list[list[str]]
    keys: list[tuple]
    lin: list[np.ndarray]
    mem: list[np.ndarray]
    pairs: dict[tuple[int, int], np.ndarray]
    const_mem_bytes: int
    budget_bytes: int  # for the plan's tensors: the budget minus the reserve
    reserve_bytes: int = 0
    folded_pairs: int = 0
    lin_counts: list[np.ndarray] = field(default_factory=list)  # collectives launched (tie-break, `ilp.py`)
    pair_counts: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    graph: TracedGraph | None = None   # for diagnostics (`diagnose.binding_constraint`)
    config: PlanConfig | None = None
    recompute_fixed: dict[str, str] = field(default_factory=dict)  # region -> mode folded into lin / mem
    recompute_classes: list["RecomputeClass"] = field(default_factory=list)  # free regions ("auto")
    precision: str | None = None  # as priced (`Pricer.precision`): what the infeasible message need not suggest
    output_mem_bytes: int = 0  # of const_mem_bytes: the returned values (`returned_bytes`)
    state_mem: list[np.ndarray] = field(default_factory=list)  # the training-state part of `mem` (the rest: activations)
    shared: list[SharedRedistribution] = field(default_factory=list)  # keys priced once (`shared_uses`)
    # memory corrections learnt from replays of picked plans (`memory_fit`): ((group, strategy), ...) -> bytes added
    # to the memory row when every listed group takes its strategy (an AND of one-hot variables, `ilp._memory_cut_vars`)
    memory_cuts: dict[tuple[tuple[int, int], ...], float] = field(default_factory=dict)
    # what replayed picks without recomputation peaked above (`memory_fit`): assignment -> (bytes above the cut rows,
    # above the sum row); corrections as `memory_cuts` in the plain ILP, and in the joint one while no region
    # recomputes (`ilp._memory_cut_vars`: recomputing may make those layouts fit)
    exclusions: dict[tuple[tuple[int, int], ...], tuple[float, float]] = field(default_factory=dict)
    cut_rows: list[MemRow] = field(default_factory=list)  # memory at moments of the step (`peak_rows`)
    # of a correction learnt from nodes' saved bytes (`memory_fit._learn`): {op position: bytes}, so that a row at a
    # moment of the step counts only the nodes whose saved tensors are alive there (`correction_in`)
    memory_cut_at: dict[tuple[tuple[int, int], ...], dict[int, float]] = field(default_factory=dict)
    # bytes every memory row keeps below the budget: what the solver's feasibility tolerance let a pick's rows exceed
    # the budget by (`memory_fit`; rows in GB, HiGHS's tolerance 1e-7: ~100 B), so that the pick cannot recur
    memory_margin_bytes: float = 0.0
    node_saved: dict[str, np.ndarray] = field(default_factory=dict)  # op node -> saved bytes per strategy (cut rows)

    def sizes(self) -> list[int]:
        return [len(v) for v in self.lin]


@dataclass(frozen=True)
class RecomputeClass:
    """Free regions (`recompute.regions`) whose nodes share the same ILP groups, so one instance's terms hold
    for each: `terms[mode] = (extra seconds, saved-bytes change)`, each {group: array over its strategies}
    (`recompute.price_region` as linear forms; the extra seconds also hold pair terms {(g, h): matrix}: the
    forward collectives run again, `RegionPrice.rerun_comm_s`), for mode in ("selective", "full")."""

    regions: tuple[str, ...]
    terms: dict[str, tuple[dict[int, np.ndarray], dict[int, np.ndarray]]]

    @property
    def count(self) -> int:
        return len(self.regions)


def grad_axes(strategy: Strategy, k: int, mesh: MeshSpec) -> tuple[str, ...]:
    """Mesh axes where input k is Replicate but the node's output is Shard/Partial (partial-sum gradients)."""
    return grad_partial_axes(strategy.inputs[k], strategy.output, mesh)


def _group_key(tg: TracedGraph, name: str, space: NodeSpace, config: PlanConfig) -> tuple:
    info = tg.nodes[name]
    if space.kind == "param":
        p = tg.parameters[space.param_fqn]
        if config.cluster_blocks and p.block_group is not None and p.uses:
            use = tg.nodes[p.uses[0]]
            arg = next(i for i, t in enumerate(space_inputs(tg, use.name)) if t in p.placeholders)
            return ("param", p.block_group, use.position, arg)
        return ("param", p.fqn)
    if config.cluster_blocks and info.block_group is not None and info.position is not None:
        return ("block", info.block_group, info.position)
    return ("node", name)


def space_inputs(tg: TracedGraph, name: str) -> list[str]:
    """Names of the fx nodes a node reads, in argument order."""
    found: list[str] = []
    info = tg.nodes[name]
    torch.fx.node.map_arg((info.node.args, info.node.kwargs), lambda n: found.append(n.name) or n)
    return found


def build_problem(tg: TracedGraph, spaces: dict[str, NodeSpace], pricer: Pricer, config: PlanConfig,
                  budget_bytes: int, reserve_bytes: int = 0) -> Problem:
    """Groups, costs and memory of the ILP (module docstring). `budget_bytes`: what the plan's tensors may
    hold per device (the budget minus `reserve_bytes`, `planner.api.memory_budget`)."""
    mesh = pricer.mesh
    roles = role_axes(mesh, config)
    group_of: dict[str, int] = {}
    key_index: dict[tuple, int] = {}
    groups: list[list[str]] = []
    keys: list[tuple] = []
    for name, space in spaces.items():
        if space.leader is not None:
            g = group_of[space.leader]
        else:
            key = _group_key(tg, name, space, config)
            g = key_index.get(key)
            if g is not None and spaces[groups[g][0]].strategies != space.strategies:
                key = ("node", name)  # same block position, other strategies (e.g. fed by a user input): alone
                g = None
            g = key_index.setdefault(key, len(groups)) if g is None else g
            if g == len(groups):
                groups.append([])
                keys.append(key)
        group_of[name] = g
        groups[g].append(name)
    mutated = mutation_edges(tg)
    views = parameter_views(tg, spaces) if roles[0] else {}
    sizes = [len(spaces[m[0]].strategies) for m in groups]
    lin = [np.zeros(n) for n in sizes]
    lin_counts = [np.zeros(n) for n in sizes]
    mem = [np.zeros(n) for n in sizes]
    state_mem = [np.zeros(n) for n in sizes]
    pairs: dict[tuple[int, int], np.ndarray] = {}
    pair_counts: dict[tuple[int, int], np.ndarray] = {}
    uses: list[EdgeUse] = []
    const_mem = 0
    saved: dict[str, np.ndarray] = {}
    for p in tg.parameters.values():
        if p.is_buffer:
            const_mem += p.nbytes
            continue
        space = spaces[p.placeholders[0]]
        g = group_of[space.name]
        numels = [math.prod(local_shape(p.shape, s.output, mesh)) for s in space.strategies]
        state = [sum(pricer.param_state_bytes(n, p.requires_grad)) for n in numels]
        mem[g] += state
        state_mem[g] += state
        lin[g] += [pricer.zero1_broadcast_s(n, p.requires_grad) for n in numels]  # 0 without ZeRO-1
    for name, space in spaces.items():
        g = group_of[name]
        info = tg.nodes[name]
        if space.kind == "op":
            costs = pricer.node_costs(tg, info, space)
            lin[g] += [c.total_s for c in costs]
            saved[name] = np.array([c.saved_bytes for c in costs], dtype=float)
            mem[g] += saved[name]
        for k, ti in enumerate(space.inputs):
            prod = spaces[ti.producer]
            mat, count = _edge_matrix(pricer, prod, space, k, ti.shape, pricer.input_dtype(tg, ti),
                                      prod.requires_grad and carries_grad(ti.dtype), mesh, prod.kind == "param",
                                      _edge_roles(roles, prod, space, k, (name, k) in mutated, views),
                                      pricer.regathers(tg, ti.producer))
            uses.append(EdgeUse(ti.producer, name, k, group_of[ti.producer], g, mat, count,
                                [(s.inputs[k], grad_axes(s, k, mesh)) for s in space.strategies]))
    shared, keep = share(uses, use_epochs(tg))  # one redistribution per (value, target layout): `shared_uses`
    for u in uses:  # u.g: the producer's group, u.h: the consumer's; u.cost is (u.g strategies x u.h strategies)
        mat, count = u.cost, u.count
        if u.g == u.h:
            lin[u.g] += np.diag(mat)
            lin_counts[u.g] += np.diag(count)
        else:
            key, mat, count = ((u.g, u.h), mat, count) if u.g < u.h else ((u.h, u.g), mat.T, count.T)
            pairs[key] = pairs.get(key, 0) + mat
            pair_counts[key] = pair_counts.get(key, 0) + count
    folded = 0
    for (a, b), mat in list(pairs.items()):
        count = pair_counts[(a, b)]
        if (a, b) in keep and mat.shape[0] > 1 and mat.shape[1] > 1:
            continue  # a shared key's indicators read this pair's variables
        if mat.shape[0] == 1 or mat.shape[1] == 1:  # one side is fixed: the pair is linear in the other
            for m, target in ((mat, lin), (count, lin_counts)):
                if mat.shape[0] == 1:
                    target[b] += m[0, :]  # (inf where b's strategy is unreachable from a's only layout)
                else:
                    target[a] += m[:, 0]
        elif np.isfinite(mat).all() and _separable(mat) and _separable(count):
            for m, target in ((mat, lin), (count, lin_counts)):
                target[a] += m[:, 0]
                target[b] += m[0, :] - m[0, 0]
        else:
            continue
        del pairs[(a, b)], pair_counts[(a, b)]
        folded += 1
    returned = sum(returned_bytes(s.inputs, pricer, tg) for s in spaces.values() if s.kind == "output")
    problem = Problem(mesh, spaces, group_of, groups, keys, lin, mem, pairs, const_mem + returned, budget_bytes,
                      reserve_bytes, folded, lin_counts=lin_counts, pair_counts=pair_counts, graph=tg, config=config,
                      precision=pricer.precision, output_mem_bytes=returned, state_mem=state_mem, shared=shared)
    recompute_terms(problem, tg, pricer, config)
    if not any(m != "none" for m in problem.recompute_fixed.values()) and _rows_may_bind(problem, tg, pricer):
        problem.cut_rows = cut_rows(tg, spaces, group_of, sizes, saved, pricer, mesh) \
            + step_rows(tg, spaces, group_of, sizes, pricer, mesh, state_mem)  # a forced region: the sum
        problem.node_saved = saved
    return problem


def _rows_may_bind(problem: Problem, tg: TracedGraph, pricer: Pricer) -> bool:
    """Whether some row can exceed the budget: the sum row at every group's largest finite entry plus every op
    output's gradient whole (twice: a composite op's inner gradients) plus, per trained parameter whole, its
    gradient and per use a gathered copy with its gradient, and 3 of the largest (AdamW's temporaries): a bound of
    every row (`peak_rows`) does. A pipeline's stage ILPs run without a budget: no rows are built there."""
    most = problem.const_mem_bytes + sum(float(m[np.isfinite(c)].max(initial=0.0))
                                         for m, c in zip(problem.mem, problem.lin))
    most += 2 * sum(math.prod(o.shape) * pricer.value_dtype(tg, n, o.dtype).itemsize
                    for n, s in problem.spaces.items() if s.kind == "op" and s.requires_grad
                    for o in tg.nodes[n].outputs[:1] if carries_grad(o.dtype))
    whole = [pricer.param_state_bytes(math.prod(p.shape))[:2] + (len(p.uses),) for p in tg.parameters.values()
             if not p.is_buffer and p.requires_grad]
    most += sum(g + u * (b + g) for b, g, u in whole) + 3 * max((b for b, _, _ in whole), default=0)
    return most > problem.budget_bytes


def returned_bytes(returned: tuple[TensorInput, ...], pricer: Pricer, tg: TracedGraph) -> int:
    """Bytes per device of the values the program returns (the output node's tensor inputs), as priced
    (`Pricer.input_itemsize`: the dtypes as run). The output node takes every returned value replicated (`strategies.build_spaces`: the
    module returns the model's whole outputs), so each rank holds all of them, beside the activations saved for
    backward, until the caller lets go of them (a language model's logits returned beside its loss: batch x seq
    x vocab on every rank)."""
    return int(sum(math.prod(ti.shape) * pricer.input_itemsize(tg, ti) for ti in returned))


def recompute_terms(problem: Problem, tg: TracedGraph, pricer: Pricer, config: PlanConfig) -> None:
    """Fold forced recomputation into `problem.lin` / `problem.mem` and collect the free regions' classes
    (module docstring). Regions: `recompute.regions`; forced: `recompute.forced_regions` (the user's), then
    `config.recompute` when it names a mode other than "none"; "auto" leaves the rest free."""
    all_regions = regions(tg)
    if not all_regions:
        return
    forced = forced_regions(tg)
    mode = config.recompute
    if mode not in ("auto", "none"):
        forced = {r: forced.get(r, mode) for r in all_regions}
    shared = shared_inputs(tg)
    for region, m in forced.items():
        extra, delta = _linear_terms(problem, tg, pricer, region_recompute(tg, region, all_regions[region], m, shared))
        for g, arr in extra.items():
            if isinstance(g, int):
                problem.lin[g] = problem.lin[g] + arr
            else:  # a pair term (the collectives run again): into the pair's cost matrix
                problem.pairs[g] = problem.pairs.get(g, 0) + arr
                problem.pair_counts.setdefault(g, np.zeros(arr.shape))
        for g, arr in delta.items():
            problem.mem[g] = problem.mem[g] + arr
    problem.recompute_fixed = dict(forced)
    if mode != "auto":
        return
    classes: dict[tuple, list[str]] = {}
    for region, nodes in all_regions.items():
        if region not in forced:
            classes.setdefault(tuple(problem.group_of.get(n, -1) for n in nodes), []).append(region)
    for members in classes.values():
        rep = members[0]
        terms = {m: _linear_terms(problem, tg, pricer, region_recompute(tg, rep, all_regions[rep], m, shared))
                 for m in RECOMPUTE_MODES[1:]}
        problem.recompute_classes.append(RecomputeClass(tuple(members), terms))


def _linear_terms(problem: Problem, tg: TracedGraph, pricer: Pricer, rr) -> tuple[dict, dict]:
    """`recompute.price_region` of one region as linear forms over the strategies of the groups: ({group:
    extra forward seconds per strategy}, {group: saved-bytes change per strategy})."""
    spaces, group_of = problem.spaces, problem.group_of

    def per_group(name: str, values) -> _Linear:
        return _Linear({group_of[name]: np.asarray(values, dtype=float)}) if values else _Linear()

    def costs(name: str):
        space = spaces.get(name)
        return pricer.node_costs(tg, tg.nodes[name], space) if space is not None and space.kind == "op" else []

    def input_bytes(name: str, k: int) -> _Linear:
        ti = spaces[name].inputs[k]
        return per_group(name, [pricer.input_itemsize(tg, ti) * math.prod(local_shape(ti.shape, s.inputs[k], problem.mesh))
                                for s in spaces[name].strategies])

    def rerun_s(name: str, k: int) -> _Linear:
        """Forward seconds of the redistribution into input k of `name` per (producer strategy, consumer
        strategy): a pair form {(g, h): matrix} (g < h), or a group's form where both ends share a group or
        one end has one strategy. Paid per use: an upper bound where uses of one value share its copy."""
        dst, ti = spaces[name], spaces[name].inputs[k]
        src = spaces[ti.producer]
        dtype, req = pricer.input_dtype(tg, ti), src.requires_grad and carries_grad(ti.dtype)
        src_layouts, src_idx = _unique([s.output for s in src.strategies])
        dst_keys, dst_idx = _unique([(s.inputs[k], grad_axes(s, k, problem.mesh)) for s in dst.strategies])
        key = ("rerun", tuple(src_layouts), tuple(dst_keys), ti.shape, dtype, req)
        small = pricer.matrices.get(key)
        if small is None:
            small = pricer.matrices[key] = np.array([[pricer.forward_s(a, b, ti.shape, dtype, axes, req)
                                                      for b, axes in dst_keys] for a in src_layouts])
        mat = small[np.ix_(src_idx, dst_idx)]
        g, h = group_of[ti.producer], group_of[name]
        if not mat.any():
            return _Linear()
        if g == h:
            return _Linear({g: np.diag(mat).copy()})
        if mat.shape[0] == 1 or mat.shape[1] == 1:
            return _Linear({h: mat[0, :].copy()} if mat.shape[0] == 1 else {g: mat[:, 0].copy()})
        return _Linear({(g, h): mat} if g < h else {(h, g): mat.T.copy()})

    price = price_region(rr, lambda n: per_group(n, [c.fwd_s for c in costs(n)]),
                         lambda n: per_group(n, [c.saved_bytes for c in costs(n)]), input_bytes, rerun_s)
    return dict(_Linear() + price.extra_s), dict(_Linear() + price.saved_delta_bytes)


class _Linear(dict):
    """A linear form {group: array over its strategies}, and pair terms {(g, h): matrix over their strategy
    pairs} (g < h; the ILP linearises them, `ilp._recompute_vars`): `+` / `-` merge key by key; the number 0
    (the start of a sum in `recompute.price_region`) is neutral."""

    def _merge(self, other, sign: int) -> "_Linear":
        out = _Linear(self)
        if isinstance(other, dict):
            for g, a in other.items():
                out[g] = out[g] + sign * a if g in out else sign * a
        elif other != 0:
            raise TypeError(f"a linear form adds linear forms or 0, not {other!r}")
        return out

    def __add__(self, other) -> "_Linear":
        return self._merge(other, 1)

    __radd__ = __add__

    def __sub__(self, other) -> "_Linear":
        return self._merge(other, -1)

    def __rsub__(self, other) -> "_Linear":
        return _Linear({g: -a for g, a in self.items()})._merge(other, 1)


def _separable(mat: np.ndarray) -> bool:
    """C[i, j] == a_i + b_j (up to rounding): the pair cost can be folded into the two linear costs."""
    sep = mat - mat[:, :1] - mat[:1, :] + mat[0, 0]
    return bool(np.all(np.abs(sep) <= 1e-12 * max(1.0, float(np.abs(mat).max()))))


def _edge_roles(roles: tuple[tuple[int, ...], tuple[int, ...]], src: NodeSpace, dst: NodeSpace, k: int,
                mutated: bool = False, views: dict[str, tuple[int, ...]] | None = None) -> EdgeRoles:
    """The `EdgeRoles` of edge src -> input k of dst, from the (data axes, tp axes) of the axis roles, and
    whether dst mutates the value in place (`edge_roles.mutation_edges`). Activations are not gathered over a
    data axis, except into the graph output and into an input that no strategy of dst takes sharded over that
    axis (an op without a rule, or e.g. indexing by global positions): such a gather is unavoidable (and
    reported by `Plan.notes`). Out of a view of a parameter (`views`: `edge_roles.parameter_views`) the
    parameter's own dims stay whole over the data axes, as the parameter does (`EdgeRoles.whole_dims`)."""
    data, tp = roles
    if src.kind == "param":
        return EdgeRoles(used_replicated=data, keep_shard=tp, identity=mutated)
    whole = {} if views is None or src.name not in views else {"whole_on": data, "whole_dims": views[src.name]}
    if dst.kind == "output" or dst.fallback:
        return EdgeRoles(identity=mutated, **whole)
    takes_shard = [a for a in data if any(isinstance(s.inputs[k][a], Shard) for s in dst.strategies)]
    return EdgeRoles(no_gather=tuple(takes_shard), identity=mutated, **whole)


def _edge_matrix(pricer: Pricer, src: NodeSpace, dst: NodeSpace, k: int, shape, dtype: torch.dtype,
                 requires_grad: bool, mesh: MeshSpec, is_parameter: bool,
                 roles: EdgeRoles = EdgeRoles(), regather: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, collectives launched) of edge (src -> input k of dst) for every (src strategy, dst strategy)
    pair; seconds are inf (and the count 0) for a pair that is impossible or that `roles` forbid."""
    src_layouts, src_idx = _unique([s.output for s in src.strategies])
    dst_keys, dst_idx = _unique([(s.inputs[k], grad_axes(s, k, mesh)) for s in dst.strategies])
    key = (tuple(src_layouts), tuple(dst_keys), shape, dtype, requires_grad, is_parameter, roles, regather)
    small = pricer.matrices.get(key)
    if small is None:
        cells = [[(math.inf, 0) if roles.forbids(a, b, shape, mesh) else
                  pricer.edge_cost(a, b, shape, dtype, axes, requires_grad, is_parameter, regather)
                  for b, axes in dst_keys]
                 for a in src_layouts]
        small = pricer.matrices[key] = (np.array([[c[0] for c in row] for row in cells]),
                                        np.array([[c[1] for c in row] for row in cells], dtype=float))
    pick = np.ix_(src_idx, dst_idx)
    return small[0][pick], small[1][pick]


def _unique(items: list) -> tuple[list, np.ndarray]:
    index: dict = {}
    idx = [index.setdefault(x, len(index)) for x in items]
    return list(index), np.array(idx, dtype=int)


def memory_rows(problem: Problem, recompute: bool = False) -> list[MemRow]:
    """The memory rows the ILP bounds by the budget (`peak_rows.MemRow`; + const and the corrections
    `Problem.memory_cuts` in each): the rows at moments of the step (`Problem.cut_rows`, `planner.peak_rows`), or
    the one sum row `mem` when there are none or the recomputation variables are in (`recompute` with free classes:
    their savings are counted per instance, not per position)."""
    if (recompute and problem.recompute_classes) or not problem.cut_rows:
        return [MemRow("sum of kinds", problem.mem)]
    return problem.cut_rows


def min_memory_bytes(problem: Problem, recompute: bool = False) -> int:
    """A lower bound of the per-device memory any plan needs: per memory row (`memory_rows`) a sum of independent
    per-group choices, the largest of them (exact with one row); a memory correction that lowers the rows,
    `Problem.memory_cuts`, counted as if every one applied."""
    return int(problem.const_mem_bytes + max(row.const + sum(float(m.min()) for m in row.lin)
                                             for row in memory_rows(problem, recompute))
               + sum(_parts(problem, a, b)[0] for a, b in problem.memory_cuts.items()))


def corrections(problem: Problem, recompute: bool = False) -> dict[tuple[tuple[int, int], ...], float]:
    """The memory corrections of the ILP's rows: `Problem.memory_cuts`, and without recomputation variables also
    `Problem.exclusions` (assignment -> bytes)."""
    if recompute or not problem.exclusions:
        return problem.memory_cuts
    merged = dict(problem.memory_cuts)
    for assign, (b, _) in problem.exclusions.items():
        merged[assign] = merged.get(assign, 0.0) + b
    return merged


def correction_in(problem: Problem, assign: tuple[tuple[int, int], ...] | None, nbytes: float,
                  row: MemRow | None) -> float:
    """The bytes of correction `assign` (`nbytes` in all, `corrections`) in memory row `row`: where it was learnt from
    nodes' saved bytes (`Problem.memory_cut_at`), those of the nodes at or before the row's position (`MemRow.at`:
    their saved tensors are alive there; none in the step rows), plus any part without a position; all of it in the
    sum row (`row` None or without a position)."""
    spread = problem.memory_cut_at.get(assign)
    if spread is None or row is None or row.at is None:
        return nbytes
    return sum(b for p, b in spread.items() if p <= row.at) + (nbytes - sum(spread.values()))


def _parts(problem: Problem, assign: tuple[tuple[int, int], ...], nbytes: float) -> tuple[float, float]:
    """(the least, the most) correction `assign` (`nbytes` in all) can add to one row (`correction_in`): its negative
    parts, its positive parts."""
    spread = problem.memory_cut_at.get(assign)
    parts = [nbytes] if not spread else [*spread.values(), nbytes - sum(spread.values())]
    return sum(min(0.0, b) for b in parts), sum(max(0.0, b) for b in parts)


def cut_bytes(problem: Problem, choice: tuple[int, ...], recompute: bool = False, row: MemRow | None = None) -> float:
    """Bytes the memory corrections (`corrections`) add to the rows (`row`: to that row, `correction_in`) at `choice`:
    each one whose groups all take its strategies."""
    return float(sum(b if row is None else correction_in(problem, assign, b, row)
                     for assign, b in corrections(problem, recompute).items() if all(choice[g] == i for g, i in assign)))


def max_memory_bytes(problem: Problem) -> int:
    """The most per-device memory any plan without recomputation can take in the largest memory row
    (`problem.memory_rows`; per group its largest entry among the strategies it can take)."""
    return int(problem.const_mem_bytes + max(row.const + sum(b for _, b in row.terms)
                                             + sum(float(m[np.isfinite(c)].max(initial=0.0))
                                                   for m, c in zip(row.lin, problem.lin))
                                             for row in memory_rows(problem))
               + sum(_parts(problem, a, b)[1] for a, b in corrections(problem).items()))


def rows_bytes(problem: Problem, choice: tuple[int, ...]) -> int:
    """The largest memory row (`problem.memory_rows`) at a choice, with its corrections: what the ILP bounds."""
    return int(problem.const_mem_bytes + max(r.bytes_at(choice) + cut_bytes(problem, choice, row=r)
                                             for r in memory_rows(problem)))


def binding_row(problem: Problem, choice: tuple[int, ...]) -> tuple[int, str]:
    """(bytes, label) of the largest memory row at a choice (`rows_bytes`'s value and the moment it is at, e.g.
    "backward at mm_3", "end of backward", "optimizer step at w"; "sum of kinds" for the sum row)."""
    row = max(memory_rows(problem), key=lambda r: r.bytes_at(choice) + cut_bytes(problem, choice, row=r))
    return rows_bytes(problem, choice), row.label


def most_memory_bytes(problem: Problem) -> float:
    """The per-device memory of the heaviest placements of every group in the largest memory row (finite entries of
    `problem.memory_rows`; an upper bound over all plans, each row being a sum of per-group choices)."""
    return float(problem.const_mem_bytes + max(row.const + sum(b for _, b in row.terms)
                                               + sum(float(m[np.isfinite(m)].max(initial=0.0)) for m in row.lin)
                                               for row in memory_rows(problem))
                 + sum(_parts(problem, a, b)[1] for a, b in corrections(problem).items()))


def activation_rows(problem: Problem) -> list[np.ndarray]:
    """Per group, the activation part of `mem` (bytes saved for backward, forced recomputation folded in): `mem`
    less the training state of stored parameter shards (`state_mem`)."""
    return [m - s for m, s in zip(problem.mem, problem.state_mem)] if problem.state_mem else list(problem.mem)


def layout_of(problem: Problem, name: str, choice: list[int]) -> Strategy:
    """The chosen strategy of node `name`."""
    return problem.spaces[name].strategies[choice[problem.group_of[name]]]

