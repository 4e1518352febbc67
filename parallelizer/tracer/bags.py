"""Normalisation 11 (`normalize`): an embedding bag of fixed-size bags becomes an embedding and a reduction.

`nn.EmbeddingBag` / `F.embedding_bag` called on a 2-D index tensor (N, L), every bag L ids, traces as
`aten.embedding_bag(weight (V, D), ids.reshape(-1) (N*L,), arange(0, N*L, L), ..., mode, ...,
per_sample_weights)`: one op with four outputs (the bags (N, D) and three index tensors of other ranks), whose
1-D indices and offsets address the whole batch, so it had no sharding rule and ran replicated (under
ddp / fsdp every rank gathered the batch for it). The same values are

    e = embedding(weight, ids.reshape(N, L))            # (N, L, D)
    e = e * per_sample_weights.reshape(N, L, 1)         # mode "sum" with per-sample weights
    out = e.sum(1) | e.mean(1) | e.amax(1)              # mode "sum" | "mean" | "max"

whose ops have rules (batch, embedding column and vocabulary shards). The weight's gradient is the same:
sum and mean scatter each bag's gradient (divided by L) to its rows; max sends each column's gradient to
the row holding the maximum (amax splits a tie evenly, and a tie inside one bag is one row seen twice, whose
halves add up to the whole). Rewritten only when the bags are that regular (offsets an `arange` of step L
over N*L ids, no include_last_offset), without padding_idx, scale_grad_by_freq or sparse, and when only
the bags output is used; other calls (offsets given by the caller: variable bags) keep the op, replicated
and noted. The cost: the (N, L, D) rows are materialised (the fused kernel sums them as it reads).
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from .graph import meta_like

aten = torch.ops.aten
_BAGS = (aten.embedding_bag.default, aten.embedding_bag.padding_idx)
_MODES = {0: (aten.sum.dim_IntList, "sum"), 1: (aten.mean.dim, "mean"), 2: (aten.amax.default, "max")}


def fixed_bags_as_embedding(gm: torch.fx.GraphModule, notes: list[str]) -> None:
    """Rewrite every regular embedding bag of `gm` (module docstring) in place; note how many."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        shape = _regular_bags(node)
        if shape is None:
            continue
        n, length = shape
        weight, ids, offsets, _, mode, _, psw = _args(node)[:7]
        fake = node.meta["val"][0].fake_mode
        out_user = next(u for u in node.users if u.args[1] == 0)
        with gm.graph.inserting_before(node):
            value = _add(gm, node, aten.reshape.default, (ids, [n, length]), fake)
            value = _add(gm, node, aten.embedding.default, (weight, value), fake)
            if psw is not None:
                scale = _add(gm, node, aten.reshape.default, (psw, [n, length, 1]), fake)
                value = _add(gm, node, aten.mul.Tensor, (value, scale), fake)
            value = _add(gm, node, _MODES[mode][0], (value, [1]), fake)
        out_user.replace_all_uses_with(value)
        for user in list(node.users):
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        if not offsets.users:
            gm.graph.erase_node(offsets)
        rewritten += 1
    if rewritten:
        notes.append(f"{rewritten} embedding bag(s) of fixed-size bags written as embedding + sum / mean / amax over "
                     "the bag dim (same values and weight gradient; those ops have sharding rules)")


def _args(node: torch.fx.Node) -> tuple:
    """embedding_bag's 9 arguments, defaults filled from its schema."""
    schema = node.target._schema.arguments
    return tuple(node.args[i] if i < len(node.args) else node.kwargs.get(a.name, a.default_value)
                 for i, a in enumerate(schema))


def _regular_bags(node: torch.fx.Node) -> tuple[int, int] | None:
    """(N, L) when `node` is an embedding bag of N bags of L ids that may be rewritten, else None."""
    if node.op != "call_function" or node.target not in _BAGS:
        return None
    weight, ids, offsets, freq, mode, sparse, psw, last, *pad = _args(node)
    if freq or sparse or last or (pad and pad[0] is not None) or mode not in _MODES:
        return None
    if not isinstance(offsets, torch.fx.Node) or offsets.target is not aten.arange.start_step:
        return None
    start, end, step = offsets.args[:3]
    if not all(isinstance(x, int) for x in (start, end, step)) or start != 0 or step < 1 or end % step:
        return None
    if tuple(ids.meta["val"].shape) != (end,) or (psw is not None and tuple(psw.meta["val"].shape) != (end,)):
        return None
    users = list(node.users)
    if any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in users):
        return None  # (an index output read: keep the op)
    if [u.args[1] for u in users].count(0) != 1:
        return None
    return end // step, step


def _add(gm: torch.fx.GraphModule, like: torch.fx.Node, target, args: tuple, fake) -> torch.fx.Node:
    """A call of `target` before `like`, with `like`'s source metadata and its value computed on fake tensors."""
    new = gm.graph.call_function(target, args)
    vals = torch.fx.node.map_arg(args, lambda a: a.meta["val"])
    with fake:
        val = target(*vals)
    new.meta = {**meta_like(like), "val": val}
    return new
