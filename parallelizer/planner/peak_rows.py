"""The ILP's memory rows at cut points of the step, linear in the strategy variables (round 25 r25c, round 26 r26d).

The sum of kinds (`problem.build_problem`'s `mem`: stored parameter state + every op's saved activations) is not a
moment of the step: backward frees an op's saved tensors when its backward has run and makes a parameter's gradient
at its last use's backward (`planner.peak`, which prices a chosen plan's peak). Per cut point c, a position in graph
order that the backward reaches (nodes after c have run backward), a rank holds

    row_c = sum_g sum_i x[g, i] (state[g][i] + grads_c[g][i] + saved_c[g][i] + act_grads_c[g][i]) + const

    state[g][i]:     params + optimizer bytes of the parameters stored by group g (`Pricer.param_state_bytes`)
    grads_c[g][i]:   gradient bytes of those parameters whose last use is at or after c (made already)
    saved_c[g][i]:   saved bytes of the op nodes of group g at or before c (their backward has not run)
    act_grads_c[g][i]: local bytes of every value of group g whose gradient is alive at c (`peak.grad_spans`: its
                     producer at or before c, a consumer at or after c; the residual stream's, the logits')

each linear in x (block instances share a group: each member counts in the rows its position reaches). The cuts: the
last node of every repeated-block instance (the backward about to enter it: all of its activations alive, none of its
gradients made) and the last op node (the loss's backward); and the optimizer step (every gradient, no activation:
`Problem.state_mem`). Without the activation gradients each row is at most the sum row. Left to the chosen plan's
replay (`memory_fit.solve_fitting`, `peak.step_peak`): what depends on pairs of strategies or on no single cut (the
regathered FSDP parameters, DDP's buckets, a composite op's inner gradients, AdamW's temporaries, the forward's
transients), which the fitting loop adds as corrections of the pick it replays.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.layout import local_shape
from ..core.mesh import MeshSpec
from ..tracer import TracedGraph
from .costs import Pricer
from .peak import grad_spans
from .strategies import NodeSpace

__all__ = ["cut_rows"]


def cut_rows(tg: TracedGraph, spaces: dict[str, NodeSpace], group_of: dict[str, int], sizes: list[int],
             saved: dict[str, np.ndarray], pricer: Pricer, mesh: MeshSpec,
             at: set[str] | None = None) -> list[tuple[str, list[np.ndarray]]]:
    """[(cut label, per group the bytes of each strategy)] of the module docstring, without the optimizer-step row
    (the state row `Problem.state_mem`, which the caller adds).

    Args:
        tg, spaces, group_of, sizes: the graph, its NodeSpaces (graph order), node -> group, strategies per group.
        saved: op node -> bytes it saves for backward per strategy (`NodeCost.saved_bytes`), as `Problem.mem` adds.
        pricer: for the bytes per parameter (`Pricer.param_state_bytes`) and the dtypes as run.
        mesh: the mesh the local shards are cut on.
        at: op nodes to cut at instead of the block boundaries (`memory_fit`: the moment a replayed pick peaks at).
    Returns:
        One (label, arrays) per cut, in backward order (the loss's first); [] when the graph has no op node.
    """
    order = [n for n, s in spaces.items() if s.kind == "op"]
    if not order:
        return []
    pos = {n: i for i, n in enumerate(order)}
    cuts = {max(pos[n] for n in nodes if n in pos) for group in tg.blocks for nodes in group.nodes
            if any(n in pos for n in nodes)} | {len(order) - 1} if at is None else {pos[n] for n in at if n in pos}
    consumers: dict[str, list[tuple[str, int]]] = {}
    for n, s in spaces.items():
        for k, ti in enumerate(s.inputs):
            consumers.setdefault(ti.producer, []).append((n, k))
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
        rows.append((f"backward at {order[c]}", row))
    return rows[::-1]
