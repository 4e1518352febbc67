"""The ILP's memory rows at moments of the step, exact for a pick as `peak.step_peak` replays it (round 25 r25c,
round 26 r26d; round 27 r27d: the transients of pairs of strategies).

The sum of kinds (`problem.build_problem`'s `mem`: stored parameter state + every op's saved activations) is not a
moment of the step: backward frees an op's saved tensors when its backward has run and makes a parameter's gradient
at its last use's backward (`planner.peak`, which prices a chosen plan's peak). Per cut point c, a position in graph
order whose backward runs (nodes after c have run backward), a rank holds (`step_peak`'s live(c))

    row_c = sum_g sum_i x[g, i] (state[g][i] + grads_c[g][i] + saved_c[g][i] + act_grads_c[g][i] + scratch_c[g][i])
            + sum_t bytes_c[t] y[t] + const

    state[g][i]:     params + optimizer bytes of the parameters stored by group g (`Pricer.param_state_bytes`)
    grads_c[g][i]:   gradient bytes of those parameters whose last use is at or after c (made already; a bucketed
                     one's partial gradient before its bucket is flattened: `step_peak`'s pending, exact while the
                     bucketed gradients fit the first bucket, `FIRST_BUCKET_BYTES`, an upper bound beyond)
    saved_c[g][i]:   saved bytes of the op nodes of group g at or before c (their backward has not run)
    act_grads_c[g][i]: local bytes of every value of group g whose gradient is alive at c (`peak.grad_spans`)
    scratch_c[g][i]: the gradients inside a composite op's backward at c (`peak.backward_scratch_bytes`)
    y[t]:            an indicator of strategies of SEVERAL groups (`Indicator`: an OR of ANDs of "group g takes one
                     of the strategies S"), for what depends on a parameter's stored layout AND its uses' layouts
                     (`peak.use_transients`): DDP's kept bucket of a gradient (every row: it is kept from one step to
                     the next), the full copy FSDP gathers again for backward (rows from its last reader's backward
                     to its first's) and its unsharded gradient (rows from its last use's backward to its first's);
                     uses of one parameter that share a use layout share one copy, which the OR of pairs of uses
                     prices exactly (the copy lives over the hull of the uses that take it)

each linear in x and y (block instances share a group: each member counts in the rows its position reaches). The
cuts: the last node of every repeated-block instance whose backward runs (the backward about to enter it) and the
last such op node (the loss's backward); plus the step rows (`step_rows`): the end of backward (every gradient, DDP's
buckets flattened) and the optimizer step (every gradient, AdamW's temporaries: one row per pair of parameters
adjacent in the optimizer's order, `peak.adamw_temporary_bytes`). The ILP bounds y[t] >= each AND of the indicator
(`memory_ilp.memory_constraints`): exact for binary x, since every y has a positive coefficient in a <= row. Left to the
chosen plan's replay (`memory_fit.solve_fitting`): the saved bytes replayed on the local storages (corrections
`Problem.memory_cuts`), the forward's moments and the flushed buckets of more than `FIRST_BUCKET_BYTES` of bucketed
gradients (the rows count them as pending: sound, not exact).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.layout import local_shape
from ..core.mesh import MeshSpec
from ..core.redistribute import ImpossibleRedistributionError
from ..rewriter.grad_sync import DEFAULT_BUCKET_BYTES
from ..tracer import TracedGraph
from .costs import Pricer
from .peak import backward_scratch_bytes, gather_readers, grad_spans, use_transients
from .strategies import NodeSpace

__all__ = ["Indicator", "MemRow", "cut_rows", "holds", "step_rows"]

Indicator = tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]
"""An OR of alternatives, each an AND of (group, the strategies it may take), sorted: 1 when some alternative holds."""


@dataclass(frozen=True)
class MemRow:
    """One memory row (module docstring): `lin` per group the bytes of each strategy; `terms` (indicator, bytes);
    `const` bytes every plan holds there (beyond `Problem.const_mem_bytes`); `at` the op position of its moment (the
    saved tensors of the op nodes at or before it are alive: -1 for the step rows, None for the sum of kinds)."""

    label: str
    lin: list[np.ndarray]
    terms: tuple[tuple[Indicator, float], ...] = ()
    const: float = 0.0
    at: int | None = None

    def bytes_at(self, choice: tuple[int, ...]) -> float:
        """The row's bytes at a choice (one strategy index per group), without `Problem.const_mem_bytes`."""
        return self.const + sum(float(a[c]) for a, c in zip(self.lin, choice)) \
            + sum(b for ind, b in self.terms if holds(ind, choice))


def holds(ind: Indicator, choice: tuple[int, ...]) -> bool:
    """Whether indicator `ind` is 1 at `choice`."""
    return any(all(choice[g] in s for g, s in alt) for alt in ind)


def cut_rows(tg: TracedGraph, spaces: dict[str, NodeSpace], group_of: dict[str, int], sizes: list[int],
             saved: dict[str, np.ndarray], pricer: Pricer, mesh: MeshSpec,
             at: set[str] | None = None) -> list[MemRow]:
    """The backward rows of the module docstring (the step rows: `step_rows`).

    Args:
        tg, spaces, group_of, sizes: the graph, its NodeSpaces (graph order), node -> group, strategies per group.
        saved: op node -> bytes it saves for backward per strategy (`NodeCost.saved_bytes`), as `Problem.mem` adds.
        pricer: for the bytes per parameter (`Pricer.param_state_bytes`), the dtypes as run and the steps of a use.
        mesh: the mesh the local shards are cut on.
        at: op nodes to cut at instead of the block boundaries (`memory_fit`: the moment a replayed pick peaks at).
    Returns:
        One `MemRow` per cut, in backward order (the loss's first); [] when the graph has no op node.
    """
    order = [n for n, s in spaces.items() if s.kind == "op"]
    if not order:
        return []
    pos = {n: i for i, n in enumerate(order)}
    live = pricer.backward_nodes(tg)
    runs = [i for i, n in enumerate(order) if n in live] or [len(order) - 1]
    if at is None:
        cuts = {max(pos[n] for n in nodes if n in pos and n in live) for group in tg.blocks for nodes in group.nodes
                if any(n in pos and n in live for n in nodes)} | {runs[-1]}
    else:
        cuts = {pos[n] for n in at if n in pos}
    consumers = _consumers(spaces)
    held: list[tuple[int, int, int, np.ndarray]] = []  # (group, first, last position it counts at, bytes)
    for p in tg.parameters.values():
        if p.is_buffer:
            continue
        space = spaces[p.placeholders[0]]
        g = group_of[space.name]
        numels = [math.prod(local_shape(p.shape, s.output, mesh)) for s in space.strategies]
        parts = np.array([pricer.param_state_bytes(n, p.requires_grad) for n in numels], dtype=float)
        held.append((g, 0, len(order), parts[:, 0] + parts[:, 2]))  # params + optimizer: in every row
        uses = [pos[c] for ph in p.placeholders for c, _ in consumers.get(ph, ()) if c in pos]
        if uses:
            held.append((g, 0, max(uses), parts[:, 1]))  # the gradient: rows at or below its last use
    for n, lo, hi, shape, dtype in grad_spans(tg, spaces, pricer, pos, consumers):
        nbytes = [math.prod(local_shape(shape, s.output, mesh)) * dtype.itemsize if s.output is not None else 0
                  for s in spaces[n].strategies]
        held.append((group_of[n], lo, hi, np.array(nbytes, dtype=float)))
    for n in order:
        scratch = [backward_scratch_bytes(tg, pricer, spaces[n], s) for s in spaces[n].strategies]
        if any(scratch):
            held.append((group_of[n], pos[n], pos[n], np.array(scratch, dtype=float)))
    spans = _transient_spans(tg, spaces, group_of, sizes, pricer, pos, consumers)
    rows, acts, done = [], [np.zeros(n) for n in sizes], 0
    for c in sorted(cuts):  # saved activations accumulate along graph order
        for n in order[done:c + 1]:
            if n in saved:
                acts[group_of[n]] += saved[n]
        done = c + 1
        row = [a.copy() for a in acts]
        for g, lo, hi, arr in held:
            if lo <= c <= hi:
                row[g] += arr
        rows.append(_row(f"backward at {order[c]}", row, [(nbytes, _at(uses, c)) for nbytes, uses in spans], c))
    return rows[::-1]


def step_rows(tg: TracedGraph, spaces: dict[str, NodeSpace], group_of: dict[str, int], sizes: list[int],
              pricer: Pricer, mesh: MeshSpec, state: list[np.ndarray]) -> list[MemRow]:
    """The rows after the backward (module docstring): "end of backward" (`state`, `Problem.state_mem`: params,
    gradients and optimizer state, plus DDP's kept buckets, the flattened open bucket being their second copy) and
    one "optimizer step" row per pair of adjacent trained parameters (`state` + the previous one's param bytes + 2 x
    this one's: `peak.adamw_temporary_bytes`), identical rows once. Same arguments as `cut_rows`; `state` per group."""
    order = [n for n, s in spaces.items() if s.kind == "op"]
    pos = {n: i for i, n in enumerate(order)}
    spans = _transient_spans(tg, spaces, group_of, sizes, pricer, pos, _consumers(spaces), kept_only=True)
    rows = [_row("end of backward", [a.copy() for a in state], [(nbytes, _at(uses, 0)) for nbytes, uses in spans], -1)]
    prev, extras = None, []  # per trained parameter: (its fqn, {group: AdamW's temporaries there})
    for p in tg.parameters.values():
        if p.is_buffer or not p.requires_grad:
            continue
        space = spaces[p.placeholders[0]]
        now = (group_of[space.name], np.array([pricer.param_state_bytes(
            math.prod(local_shape(p.shape, s.output, mesh)))[0] for s in space.strategies], dtype=float))
        extra = {now[0]: 2 * now[1]}
        if prev is not None:
            extra[prev[0]] = extra.get(prev[0], 0) + prev[1]
        extras.append((p.fqn, extra))
        prev = now
    kept = [(fqn, e) for k, (fqn, e) in enumerate(extras)
            if not any(_dominates(o, e) and (j < k or not _dominates(e, o)) for j, (_, o) in enumerate(extras) if j != k)]
    for fqn, extra in kept:
        row = [a.copy() for a in state]
        for g, arr in extra.items():
            row[g] += arr
        rows.append(MemRow(f"optimizer step at {fqn}", row, at=-1))
    return rows if len(rows) > 1 else rows + [MemRow("optimizer step", [a.copy() for a in state], at=-1)]


def _dominates(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> bool:
    """Whether the row with extra bytes `a` ({group: per strategy}) is at least the one with `b` at every choice: the
    groups take their strategies independently, so the least of a - b is the sum of its per-group minima."""
    return sum(float(np.min(a.get(g, 0) - b.get(g, 0))) for g in set(a) | set(b)) >= 0


def _consumers(spaces: dict[str, NodeSpace]) -> dict[str, list[tuple[str, int]]]:
    consumers: dict[str, list[tuple[str, int]]] = {}
    for n, s in spaces.items():
        for k, ti in enumerate(s.inputs):
            consumers.setdefault(ti.producer, []).append((n, k))
    return consumers


_Use = tuple[dict[int, set[int]], int, int]  # (AND of group -> strategies, first, last position it counts at)


def _transient_spans(tg: TracedGraph, spaces: dict[str, NodeSpace], group_of: dict[str, int], sizes: list[int],
                     pricer: Pricer, pos: dict[str, int], consumers: dict, kept_only: bool = False
                     ) -> list[tuple[float, list[_Use]]]:
    """[(bytes, the uses that hold them)] of the pair-dependent transients of the module docstring, per parameter and
    stored strategy: DDP's kept bucket of its gradient (over every position), and per gathered value (one per key of
    `peak.use_transients`) its full copy (from its readers' last to first) and its unsharded gradient (its uses')."""
    out: list[tuple[float, list[_Use]]] = []
    end = len(pos)
    live = pricer.backward_nodes(tg)
    readers_of: dict[str, dict[str, list[str]]] = {}
    for p in tg.parameters.values():
        if p.is_buffer:
            continue
        space = spaces[p.placeholders[0]]
        g = group_of[space.name]
        uses = [(c, k) for ph in p.placeholders for c, k in consumers.get(ph, ()) if c in pos]
        for i, st in enumerate(space.strategies):
            numel = math.prod(local_shape(p.shape, st.output, pricer.mesh))
            param_b, grad_b, _ = pricer.param_state_bytes(numel, p.requires_grad)
            if not grad_b or not uses:
                continue
            kept: list[_Use] = []
            gathers: dict[tuple, tuple[int, list[tuple[dict, list[int], int]]]] = {}
            for c, k in uses:
                ti, h = spaces[c].inputs[k], group_of[c]
                bucketed, by_key = set(), {}
                for j, s in enumerate(spaces[c].strategies):
                    try:
                        b, full, key = use_transients(pricer, st.output, s, k, ti, DEFAULT_BUCKET_BYTES)
                    except ImpossibleRedistributionError:
                        continue  # no plan takes this pair (the ILP prices it inf)
                    if b:
                        bucketed.add(j)
                    if full is not None:
                        by_key.setdefault((key, full), set()).add(j)
                if bucketed and (alt := _and({g: {i}}, {h: bucketed}, sizes)) is not None:
                    kept.append((alt, 0, end))
                if kept_only or not by_key:
                    continue
                if ti.producer not in readers_of:
                    readers_of[ti.producer] = gather_readers(tg, ti.producer, live)
                rs = [pos[r] for r in readers_of[ti.producer].get(c, ()) if r in pos]
                for (key, full), js in by_key.items():
                    if (alt := _and({g: {i}}, {h: js}, sizes)) is not None:
                        gathers.setdefault(key, (full, []))[1].append((alt, rs, pos[c]))
            if kept:
                out.append((float(grad_b), kept))
            for full, users in gathers.values():
                copy = [(alt, min(rs), max(rs)) for alt, rs, _ in users if rs]
                if copy:
                    out.append((float(full * param_b // max(numel, 1)), copy))
                out.append((float(full * grad_b // max(numel, 1)), [(alt, u, u) for alt, _, u in users]))
    return out


def _and(a: dict[int, set[int]], b: dict[int, set[int]], sizes: list[int] | None = None
         ) -> dict[int, set[int]] | None:
    """The AND of two alternatives (group -> allowed strategies); None when no choice satisfies both. With `sizes`
    (strategies per group) a group that may take every strategy it has is dropped (always true)."""
    out = {g: set(s) for g, s in a.items()}
    for g, s in b.items():
        out[g] = out[g] & s if g in out else set(s)
    if any(not s for s in out.values()):
        return None
    return out if sizes is None else {g: s for g, s in out.items() if len(s) < sizes[g]}


def _at(uses: list[_Use], c: int) -> list[dict[int, set[int]]]:
    """The alternatives under which a value held by `uses` is alive at position c: one use whose span holds c, or
    two uses (taking the value's key together: one copy over the hull of their spans) with c between them."""
    alts = [alt for alt, lo, hi in uses if lo <= c <= hi]
    for a, lo, a_hi in uses:
        for b, b_lo, hi in uses:
            if lo <= c <= hi and c > a_hi and c < b_lo and (both := _and(a, b)) is not None:
                alts.append(both)  # (where a's or b's own span holds c, its single alternative implies this one)
    return alts


def _row(label: str, lin: list[np.ndarray], terms: list[tuple[float, list[dict[int, set[int]]]]], at: int) -> MemRow:
    """A `MemRow` with its indicator terms simplified: an alternative over no group is a constant, alternatives over
    one group only are linear in it, the rest an `Indicator` (terms with one indicator merged)."""
    const, merged = 0.0, {}
    for nbytes, alts in terms:
        if not alts or not nbytes:
            continue
        if any(not alt for alt in alts):
            const += nbytes
            continue
        groups = {g for alt in alts for g in alt}
        if len(groups) == 1 and all(len(alt) == 1 for alt in alts):
            (g,) = groups
            for j in set().union(*(alt[g] for alt in alts)):
                lin[g][j] += nbytes
            continue
        ind = tuple(sorted({tuple(sorted((g, tuple(sorted(s))) for g, s in alt.items())) for alt in alts}))
        merged[ind] = merged.get(ind, 0.0) + nbytes
    return MemRow(label, lin, tuple(sorted(merged.items())), const, at)
