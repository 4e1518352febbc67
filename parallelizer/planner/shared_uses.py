"""One redistribution per (value, target layout): the uses of a value that share the rewriter's copy.

The rewriter (`rewriter.apply`, `_Rewriter._redistribute`) emits the steps that bring a value to a consumer's
input layout once per key (value, target layout, gradient Partial axes) and hands that copy to every later use
with the same key; it forgets its copies after each in-place op (copies made before a mutation are stale), so
the key also holds the *epoch*: how many in-place ops precede the consumer in graph order (`use_epochs`). The
copy's backward conjugate runs once as well, on the gradient autograd accumulates over its uses. An RMSNorm
output read by q, k and v projections that all want it Replicate from a Shard(seq) layout is one all-gather
in the program (and one reduce-scatter of the summed gradient), not three.

So the planner prices a redistribution once per key:
  * for a fixed choice (`api.to_plan`'s collective seconds, `steptime.estimate_step_time`,
    `segments.price_segments`): `FirstUses.first` says whether a use is the first of its key; later ones are
    free;
  * in the ILP (`problem.build_problem`, `ilp.py`): for a value p with uses u = 1..n in one epoch, a key K is
    *shared* when at least two uses can ask for it at a positive cost. Each use's cost entries (p's strategy a,
    u's strategy b) with key_u(b) = K shared leave the pair matrix, and the key's cost is paid through

        y[a, K] in [0, 1] (continuous),   objective += C(a, K) y[a, K],   y[a, K] >= ind_u(a, K) for every u

    where C(a, K) is one use's forward + backward seconds from p's layout a to K (`Pricer.edge_cost`, the same
    for every use) and ind_u(a, K) = sum over b with key_u(b) = K of e[p, u, a, b] (the exact pair product
    of `ilp.py`; x[p, a] or x[u, b] alone where a side has one strategy or both sides share a group). With
    binary x the pair products are 0/1, so the cheapest y is max_u ind_u(a, K): the key is paid once when any
    use takes it, never when none does. The pairs the indicators read keep their variables (`keep`), even when
    what is left of their matrices would fold.

The instances of a repeated block (`PlanConfig.cluster_blocks`) share their groups, so their shared keys have
one signature; their costs add onto the same y (`SharedRedistribution.cost`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.layout import Layout
from ..tracer import TracedGraph
from ..tracer.graph import mutated_args


def use_epochs(tg: TracedGraph) -> dict[str, int]:
    """node name -> how many in-place ops (`tracer.graph.mutated_args`) precede it in graph order: the
    rewriter's cache of redistributed values is cleared after each of them (module docstring)."""
    epochs, count = {}, 0
    for name, info in tg.nodes.items():
        epochs[name] = count
        if info.node.op == "call_function" and mutated_args(info.node):
            count += 1
    epochs["output"] = count
    return epochs


class FirstUses:
    """For a fixed choice: is this use the first of its key (value, target layout, gradient axes, epoch)?"""

    def __init__(self, tg: TracedGraph):
        self._epochs = use_epochs(tg)
        self._seen: set[tuple] = set()

    def first(self, producer: str, consumer: str, dst: Layout | str, grad_axes: tuple[str, ...]) -> bool:
        key = (producer, str(dst), tuple(grad_axes), self._epochs.get(consumer, 0))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


@dataclass
class EdgeUse:
    """One use of a value in the planning problem: consumer `consumer` input `k`, its group `h`, the producer's
    group `g`; `cost` / `count`: the full (g strategies x h strategies) matrices of `problem._edge_matrix`;
    `keys[b]`: the target key (layout, gradient axes) of the consumer's strategy b."""

    producer: str
    consumer: str
    k: int
    g: int
    h: int
    cost: np.ndarray
    count: np.ndarray
    keys: list
    key_of: tuple[int, ...] = ()  # set by `share`: the shared key index of each of h's strategies, or -1


@dataclass
class SharedRedistribution:
    """The shared keys of one value (module docstring): producer group `g`; `cost[a, K]` / `count[a, K]`: the
    seconds and collectives of key K from g's strategy a (summed over the instances with this signature);
    `uses`: (consumer group h, key index of each of h's strategies or -1)."""

    g: int
    cost: np.ndarray
    count: np.ndarray
    uses: tuple[tuple[int, tuple[int, ...]], ...]

    def seconds(self, choice: tuple[int, ...]) -> tuple[float, float]:
        """(seconds, collectives) of the keys some use takes at `choice`."""
        a = choice[self.g]
        taken = {key_of[a if h == self.g else choice[h]] for h, key_of in self.uses} - {-1}
        return (float(sum(self.cost[a, K] for K in taken)), float(sum(self.count[a, K] for K in taken)))


def share(uses: list[EdgeUse], epochs: dict[str, int]) -> tuple[list[SharedRedistribution], set[tuple[int, int]]]:
    """Move the shared keys' cost entries out of the uses' matrices (in place) into `SharedRedistribution`s
    (module docstring). Returns them and the group pairs whose variables their indicators read."""
    by_value: dict[tuple[str, int], list[EdgeUse]] = {}
    for u in uses:
        by_value.setdefault((u.producer, epochs.get(u.consumer, 0)), []).append(u)
    merged: dict[tuple, SharedRedistribution] = {}
    keep: set[tuple[int, int]] = set()
    for group in by_value.values():
        if len(group) < 2:
            continue
        shared = _shared_keys(group)
        if not shared:
            continue
        index = {key: i for i, key in enumerate(shared)}
        g = group[0].g
        cost = np.zeros((group[0].cost.shape[0], len(shared)))
        count = np.zeros_like(cost)
        for u in group:
            key_of = np.array([index.get(key, -1) for key in u.keys])
            for K in range(len(shared)):
                cols = key_of == K
                if not cols.any():
                    continue
                block = u.cost[:, cols]
                finite = np.isfinite(block)
                rows = finite.any(axis=1)
                cost[rows, K] = np.where(finite, block, -np.inf).max(axis=1)[rows]
                count[rows, K] = np.where(finite, u.count[:, cols], -np.inf).max(axis=1)[rows]
                u.cost[:, cols] = np.where(finite, 0.0, np.inf)
                u.count[:, cols] = np.where(finite, 0.0, u.count[:, cols])
            u.key_of = tuple(int(i) for i in key_of)
            if u.h != g:
                keep.add((min(g, u.h), max(g, u.h)))
        sig_uses = tuple(sorted((u.h, u.key_of) for u in group if any(i >= 0 for i in u.key_of)))
        sig = (g, tuple(shared), sig_uses)
        held = merged.get(sig)
        if held is None:
            merged[sig] = SharedRedistribution(g, cost, count, sig_uses)
        else:
            held.cost += cost
            held.count += count
    return list(merged.values()), keep


def _shared_keys(group: list[EdgeUse]) -> list:
    """Keys that at least two uses of one value can ask for at a positive cost, in first-seen order."""
    seen: dict = {}
    for u in group:
        mine = set()
        for b, key in enumerate(u.keys):
            col = u.cost[:, b]
            if np.any(np.isfinite(col) & (col > 0)):
                mine.add(key)
        for key in sorted(mine, key=repr):
            seen[key] = seen.get(key, 0) + 1
    return [key for key, n in seen.items() if n >= 2]
