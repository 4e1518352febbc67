"""Emit activation recomputation (`Plan.recompute`, vocabulary in `planner.recompute`) in a rank program.

The rewriter (`apply`) tags every node it emits for a traced node of a recomputed region with
`node.meta["recompute"] = <region id>`, the redistributions (collectives) it inserts for that node included,
so they belong to the region. `checkpoint_regions` then moves each region's nodes into a submodule of the
program and calls it through non-reentrant `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`:
its forward keeps no tensor the region's ops save for backward; backward reruns the region (the
collectives inside it too: every rank runs the same backward graph, so they run again in the same order on
every rank, as the planner prices them) before the region's own backward. `print(gm.code)` shows the
`torch.utils.checkpoint.checkpoint(self.recompute_<region>, ...)` calls.

Which traced nodes a region covers (`node_regions`):
  * "full": every op of the region: the block member's ops (`NodeInfo.block`), or the ops traced inside a
    user's own checkpoint call (`NodeInfo.checkpoint`, `TracedGraph.user_recompute`);
  * "selective": the attention core of the region (Korthikanti et al. 2022, Sec. 5: QK^T, softmax, dropout,
    attention x V): each fused SDPA op (aten.scaled_dot_product_attention and its flash/efficient/math
    variants) with its getitems, or, for eager attention, each softmax with the batched matmul that feeds it
    (the nearest aten.matmul/bmm/baddbmm/einsum before it in the block, of two activations) and the one it
    feeds (the nearest after it), plus every op on a path between the two (scale, mask, dtype cast,
    dropout). Each core is a region of its own, named "<region>#attention<k>".

Random ops replay their draws: `localize.seeded_per_shard` takes its seed from torch's
default CPU generator, whose state checkpoint saves at the region's entry and restores for the recomputation
(`preserve_rng_state=True`, torch's default, also covers the device generators of CUDA inputs), so the
recomputed masks equal the forward's. A region must not write in place into a value made outside it (the
write would be applied twice): `UnsupportedOpError`. Values made in a region and used after it are the
submodule's outputs; nodes between a region's first and last op that do not depend on it stay before the
call, those that depend on it without feeding it move after it, and those on a path from the region back
into it join it (they are recomputed too).
"""
from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping

import torch
import torch.fx
import torch.utils.checkpoint

from ..errors import PlanMismatchError, UnsupportedOpError
from ..planner.recompute import RECOMPUTE_MODES
from ..tracer.graph import NodeInfo, Role, TracedGraph, mutated_args

aten = torch.ops.aten

_SDPA = {aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention.default,
         aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_attention_math.default,
         aten._scaled_dot_product_flash_attention_for_cpu.default}
_SOFTMAX = {aten.softmax.int, aten._softmax.default, aten._safe_softmax.default}
_BATCHED_MATMUL = {aten.matmul.default, aten.bmm.default, aten.baddbmm.default, aten.einsum.default}


def regions_of(traced: TracedGraph, region: str) -> list[str]:
    """The call_function nodes (graph order) of `region`: a repeated-block member (`NodeInfo.block`) and/or a
    user checkpoint region (`NodeInfo.checkpoint`)."""
    return [n.name for n in traced.compute_nodes() if region in (n.block, n.checkpoint)]


def node_regions(traced: TracedGraph, recompute: Mapping[str, str]) -> dict[str, str]:
    """Traced node name -> the id of the recomputed region it belongs to (module docstring), for the
    decisions `recompute` (region -> "selective" | "full"). A node in two regions (a user region inside a
    fully recomputed block) belongs to the larger one.

    Raises:
        ValueError: a mode that is not "selective" or "full" ("none" regions are simply absent).
        PlanMismatchError: a region with no node in the graph (a plan made for another model).
        UnsupportedOpError: "selective" on a region without an attention core (remedy: "full" or none).
    """
    spans: list[tuple[str, list[str]]] = []
    for region, mode in sorted(recompute.items()):
        if mode not in RECOMPUTE_MODES or mode == "none":
            raise ValueError(f"recompute[{region!r}] = {mode!r}: use 'selective' or 'full' (absent = none)")
        names = regions_of(traced, region)
        if not names:
            known = sorted({n.block for n in traced.compute_nodes() if n.block} | set(traced.user_checkpoint_nodes))
            raise PlanMismatchError(f"recompute region {region!r} has no op in the traced graph (regions: "
                                    f"{known[:6]}{' ...' if len(known) > 6 else ''}); re-plan for this model")
        if mode == "full":
            spans.append((region, names))
        else:
            cores = attention_cores(traced, names)
            if not cores:
                raise UnsupportedOpError(
                    f"recompute[{region!r}] = 'selective', but the region has no attention core (no SDPA op, no "
                    "batched matmul -> softmax -> batched matmul chain). Remedy: recompute it 'full', or not at all")
            spans.extend((f"{region}#attention{k}", core) for k, core in enumerate(cores))
    out: dict[str, str] = {}
    for region, names in sorted(spans, key=lambda s: -len(s[1])):
        for name in names:
            out.setdefault(name, region)
    return out


def attention_cores(traced: TracedGraph, names: list[str]) -> list[list[str]]:
    """The attention cores among the nodes `names` of one region (module docstring), each in graph order."""
    inside = set(names)
    cores = []
    for name in names:
        info = traced.node(name)
        if info.target in _SDPA:
            getitems = [u.name for u in info.node.users if u.target is operator.getitem and u.name in inside]
            cores.append([name, *getitems])
        elif info.target in _SOFTMAX:
            before = _nearest(info.node, inside, lambda n: n.all_input_nodes, traced)
            after = _nearest(info.node, inside, lambda n: list(n.users), traced)
            if before and after:
                down = _reach(before, inside, lambda n: list(n.users))
                up = _reach(after, inside, lambda n: n.all_input_nodes)
                cores.append([n for n in names if n in down & up])
    return cores


def _nearest(start: torch.fx.Node, inside: set[str], step, traced: TracedGraph) -> list[torch.fx.Node]:
    """The batched matmuls of two activations first met walking from `start` by `step` within `inside`."""
    found, seen, todo = [], set(), step(start)
    while todo:
        node = todo.pop()
        if node.name in seen or node.name not in inside:
            continue
        seen.add(node.name)
        if node.target in _BATCHED_MATMUL and not any(_is_parameter(a, traced) for a in node.all_input_nodes):
            found.append(node)
        else:
            todo.extend(step(node))
    return found


def _is_parameter(node: torch.fx.Node, traced: TracedGraph) -> bool:
    """Whether `node` is a parameter, or a view chain of one."""
    while node.op == "call_function" and node.all_input_nodes and len(node.all_input_nodes) == 1:
        node = node.all_input_nodes[0]
    return traced.node(node.name).role is Role.PARAMETER


def _reach(starts: Iterable[torch.fx.Node], inside: set[str], step) -> set[str]:
    out, todo = set(), list(starts)
    while todo:
        node = todo.pop()
        if node.name in inside and node.name not in out:
            out.add(node.name)
            todo.extend(step(node))
    return out


def recompute_within(recompute: Mapping[str, str], names: Iterable[str], traced: TracedGraph) -> dict[str, str]:
    """The decisions of `recompute` whose region has an op among the nodes `names` of `traced`: a pipeline
    stage's ops, or a graph traced again in another train/eval mode (a model that checkpoints only in
    training, as transformers' layers do, has no user region in eval mode)."""
    infos: list[NodeInfo] = [traced.node(n) for n in names]
    present = {i.block for i in infos} | {i.checkpoint for i in infos}
    return {region: mode for region, mode in recompute.items() if region in present}


# -- the emitted program ------------------------------------------------------------------------------------

def checkpoint_regions(graph: torch.fx.Graph, root: torch.nn.Module) -> list[str]:
    """Move the nodes of each region (`node.meta["recompute"]`, set by the rewriter) into a submodule of
    `root` named "recompute_<region>" and call it with `torch.utils.checkpoint.checkpoint(submodule, *inputs,
    use_reentrant=False, preserve_rng_state=True)` (module docstring). Returns the region ids, graph order.

    Raises:
        UnsupportedOpError: an op of a region writes in place into a value made outside it, or two regions
            interleave (an op of one lies on a path from the other back into it).
    """
    regions: dict[str, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.meta.get("recompute"):
            regions.setdefault(node.meta["recompute"], []).append(node)
    for region, nodes in regions.items():
        _extract(graph, root, region, nodes)
    return list(regions)


def _extract(graph: torch.fx.Graph, root: torch.nn.Module, region: str, members: list[torch.fx.Node]) -> None:
    span, inside = [], False
    for node in graph.nodes:
        inside = inside or node is members[0]
        if inside:
            span.append(node)
        if node is members[-1]:
            break
    down, up = set(members), set(members)
    for node in span:
        if any(a in down for a in node.all_input_nodes):
            down.add(node)
    for node in reversed(span):
        if any(u in up for u in node.users):
            up.add(node)
    closure = [n for n in span if n in down and n in up]
    in_region = set(closure)
    other = next((n for n in closure if n.meta.get("recompute") not in (None, region)), None)
    if other is not None:
        raise UnsupportedOpError(
            f"cannot recompute region {region!r}: {other.format_node()} of region {other.meta['recompute']!r} lies "
            "on a path from the region back into it (the two regions interleave). Remedy: recompute one of them "
            "'full' so that it holds the other, or drop one from Plan.recompute")
    later = [n for n in span if n in down and n not in in_region]
    inputs = list(dict.fromkeys(a for n in closure for a in n.all_input_nodes if a not in in_region))
    for node in closure:
        written = [node.args[i] for i in mutated_args(node) if i < len(node.args)]
        if any(isinstance(w, torch.fx.Node) and w not in in_region for w in written):
            raise UnsupportedOpError(
                f"cannot recompute region {region!r}: {node.format_node()} writes in place into a value made "
                "outside the region, and recomputation would write it twice. Remedy: recompute this region "
                "'none' (drop it from Plan.recompute)")
    outputs = [n for n in closure if any(u not in in_region for u in n.users)]
    sub = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for value in inputs:
        env[value] = sub.placeholder(value.name)
        env[value].meta = dict(value.meta)
    for node in closure:
        env[node] = sub.node_copy(node, env.__getitem__)
    sub.output(tuple(env[n] for n in outputs))
    name = "recompute_" + re.sub(r"\W", "_", region)
    root.add_module(name, torch.fx.GraphModule(torch.nn.Module(), sub, class_name=name.title().replace("_", "")))
    with graph.inserting_after(closure[-1]):
        module = graph.get_attr(name)
    with graph.inserting_after(module):
        call = graph.call_function(torch.utils.checkpoint.checkpoint, (module, *inputs),
                                   {"use_reentrant": False, "preserve_rng_state": True})
    call.meta["recompute_region"] = region
    anchor = call
    for k, value in enumerate(outputs):
        with graph.inserting_after(anchor):
            anchor = graph.call_function(operator.getitem, (call, k))
        value.replace_all_uses_with(anchor, delete_user_cb=lambda user: user not in in_region)
    for node in later:  # depend on the region without feeding it: after the call, in their order
        anchor.append(node)
        anchor = node
    for node in reversed(closure):
        graph.erase_node(node)


def inline_regions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The program with every checkpoint call of `checkpoint_regions` replaced by its region's nodes again
    (their metadata kept): the flat program `verify` reads. Returns `gm` itself when it has none."""
    calls = [n for n in gm.graph.nodes if "recompute_region" in n.meta]
    if not calls:
        return gm
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, object] = {}
    for node in gm.graph.nodes:
        if node in calls:
            sub = getattr(gm, node.args[0].target).graph
            inner: dict[torch.fx.Node, object] = dict(zip(sub.find_nodes(op="placeholder"),
                                                          (env[a] for a in node.args[1:])))
            for n in sub.nodes:
                if n.op == "output":
                    env[node] = tuple(inner[v] for v in n.args[0])
                elif n.op != "placeholder":
                    inner[n] = graph.node_copy(n, inner.__getitem__)
        elif node.op == "get_attr" and all(u in calls for u in node.users):
            continue
        elif node.target is operator.getitem and node.args[0] in calls:
            env[node] = env[node.args[0]][node.args[1]]
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
