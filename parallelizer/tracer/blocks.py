"""Repeated-block detection: find structurally identical module instances in a traced graph.

A planner solves one block of a group and reuses the answer for every instance, so detection must be
exact: instances are grouped by module class and a Weisfeiler-Lehman hash (networkx) of their induced
subgraph, whose node labels are op and output shapes/dtypes and whose inputs from outside the instance
are labelled by their kind (parameter, buffer, or a value flowing through the model) and shapes. Where
that value comes from (a user input for the first block, an activation or a returned value for the others)
is not compared, nor are names. Candidate groups are then verified position by
position (same op, same shapes) and nested groups are dropped in favour of the outermost ones (the
LayerNorms inside GPT-2 layers are not blocks of their own; the layers are). Instances that read no parameter
(Dropout, activations) are not blocks.
"""
from __future__ import annotations

import warnings
from collections import defaultdict

import networkx as nx
import torch.fx

from .graph import BlockGroup, NodeInfo, ParamInfo, Role


def find_repeated_blocks(nodes: dict[str, NodeInfo], module_types: dict[str, str]) -> list[BlockGroup]:
    """Group identical module instances of the graph into `BlockGroup`s, outermost groups first.

    Args:
        nodes: the graph's `NodeInfo`s in graph order (module_fqn filled in).
        module_types: module FQN -> qualified class name, for every module seen on a node's module stack.
    Returns:
        Groups with at least two instances, ordered by the graph position of their first instance; a module
        that sits inside an instance of a selected group is never an instance of another group.
    """
    members = _nodes_per_module(nodes, module_types)
    candidates: dict[tuple[str, str], list[str]] = defaultdict(list)
    for fqn, names in members.items():
        if fqn and len(names) > 1:
            candidates[(module_types[fqn], _structure_hash(names, nodes))].append(fqn)

    groups = []
    for (mtype, _), fqns in candidates.items():
        for same in _split_verified(fqns, members, nodes):
            if len(same) > 1 and _reads_parameters(members[same[0]], nodes) and not _interleaved(same, members, nodes):
                groups.append((mtype, same))
    # Outermost first: a group whose instances lie inside a kept group's instances loses those instances. A
    # module holds at least the nodes of any module inside it, so larger instances come first (the depth of a
    # name does not tell: ResNet's BatchNorms {stem.1, blocks.0.bn1, ...} would shadow the blocks.* group).
    order = {name: i for i, name in enumerate(nodes)}
    first = {fqn: order[names[0]] for fqn, names in members.items()}
    groups.sort(key=lambda g: (-len(members[g[1][0]]), first[g[1][0]]))
    kept: list[BlockGroup] = []
    taken: list[str] = []
    for mtype, fqns in groups:
        free = [f for f in fqns if not any(_inside(f, t) or _inside(t, f) for t in taken)]
        if len(free) < 2:
            continue
        taken.extend(free)
        name = _group_name(free)
        if any(k.name == name for k in kept):  # two groups whose members' names fold alike (root-level q, o and
            name = "{" + ",".join(free) + "}"  # k, v of a cross-attention: both "*"): a plan names blocks uniquely
        kept.append(BlockGroup(name=name, module_type=mtype, members=tuple(free),
                               nodes=tuple(tuple(members[f]) for f in free)))
    kept.sort(key=lambda b: first[b.members[0]])
    return kept


def _interleaved(fqns: list[str], members: dict[str, list[str]], nodes: dict[str, NodeInfo]) -> bool:
    """Whether the instances' node ranges overlap in graph order: modules each called several times in turn
    (ALBERT's one layer called N times: its query/key/value/dense Linears, its two LayerNorms). Such
    instances are no run of blocks (a stage cut between them would split every call), so they are no group."""
    order = {name: i for i, name in enumerate(nodes)}
    spans = sorted((min(order[n] for n in members[f]), max(order[n] for n in members[f])) for f in fqns)
    return any(a[1] > b[0] for a, b in zip(spans, spans[1:]))


def shared_weight_calls(params: dict[str, ParamInfo], nodes: dict[str, NodeInfo]) -> tuple[str, int] | None:
    """(module, calls) when the graph's trained parameters that several ops of ONE module read (a module called
    several times) all live under one module, the most read ones `calls` times: one block called `calls` times
    with shared weights (ALBERT), which is not a repeated block (there is one instance, so nothing to cut
    between). None when no trained parameter is read twice by one module: a weight tied between two modules (an
    embedding and its output head, pytorch/examples' word_language_model `tie_weights`) is no block called
    twice (trial r16b: the message named the embedding as such a block). Used for the message of a pipeline
    mesh on a graph without repeated blocks."""
    reused = {fqn: len(p.uses) for fqn, p in params.items() if p.requires_grad and len(p.uses) > 1
              and len({nodes[u].module_fqn for u in p.uses if u in nodes}) == 1}
    if not reused:
        return None
    parts = [fqn.split(".")[:-1] for fqn in reused]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return ".".join(common) or "<the model>", max(reused.values())


def _reads_parameters(names: list[str], nodes: dict[str, NodeInfo]) -> bool:
    """Whether an instance's ops read a parameter. Stateless modules (Dropout, activations, pooling) repeated
    around the real blocks (T5Stack's encoder and decoder `dropout`) are not blocks: they hold nothing to place
    on a pipeline stage, and as a group of their own they would hide the layers from the cutter."""
    return any(nodes[a.name].role is Role.PARAMETER for n in names for a in _node_args(nodes[n].node)
               if a.name in nodes)


def _nodes_per_module(nodes: dict[str, NodeInfo], module_types: dict[str, str]) -> dict[str, list[str]]:
    """Module FQN -> names of the call_function nodes created inside it (at any depth), in graph order."""
    out: dict[str, list[str]] = defaultdict(list)
    for info in nodes.values():
        if info.op != "call_function":
            continue
        for fqn in _ancestors(info.module_fqn):
            if fqn in module_types:
                out[fqn].append(info.name)
    return out


def _ancestors(fqn: str) -> list[str]:
    """"a.b.c" -> ["a", "a.b", "a.b.c"]."""
    parts = fqn.split(".") if fqn else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _label(info: NodeInfo) -> str:
    return f"{info.op_name}|{';'.join(map(str, info.outputs))}"


_STATE_ROLES = (Role.PARAMETER, Role.BUFFER)


def _external_label(info: NodeInfo | None) -> str:
    """Label of a value entering a block from outside: parameter, buffer or "value" (a user input, an activation
    and a model output are alike: the first block reads the model's input where the others read the previous
    block's output), and its shapes; never the producing op."""
    if info is None:
        return "ext|?"
    kind = info.role.value if info.role in _STATE_ROLES else "value"
    return f"ext|{kind}|{';'.join(map(str, info.outputs))}"


def _structure_hash(names: list[str], nodes: dict[str, NodeInfo]) -> str:
    """Weisfeiler-Lehman hash of the induced subgraph of `names` plus labelled external inputs."""
    inside = set(names)
    g = nx.DiGraph()
    for name in names:
        info = nodes[name]
        g.add_node(name, label=_label(info))
        for pos, arg in enumerate(_node_args(info.node)):
            if arg.name in inside:
                g.add_edge(arg.name, name, label=str(pos))
            else:
                ext = f"ext:{arg.name}->{name}"
                g.add_node(ext, label=_external_label(nodes.get(arg.name)))
                g.add_edge(ext, name, label=str(pos))
    with warnings.catch_warnings():  # networkx >= 3.5 warns that directed hashes changed in 3.5
        warnings.simplefilter("ignore", UserWarning)
        return nx.weisfeiler_lehman_graph_hash(g, node_attr="label", edge_attr="label", iterations=3)


def _node_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The fx nodes among a node's (flattened) args and kwargs, in order."""
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


def _signature(names: list[str], nodes: dict[str, NodeInfo]) -> tuple:
    """Exact per-position structure: labels, plus each arg as (internal position) or (external label)."""
    index = {n: i for i, n in enumerate(names)}
    sig = []
    for name in names:
        info = nodes[name]
        args = tuple(("in", index[a.name]) if a.name in index else ("ext", _external_label(nodes.get(a.name)))
                     for a in _node_args(info.node))
        sig.append((_label(info), args))
    return tuple(sig)


def _split_verified(fqns: list[str], members: dict[str, list[str]], nodes: dict[str, NodeInfo]) -> list[list[str]]:
    """Split a hash group into classes whose exact per-position signatures agree (hash collisions)."""
    classes: dict[tuple, list[str]] = {}
    for fqn in fqns:
        classes.setdefault(_signature(members[fqn], nodes), []).append(fqn)
    return list(classes.values())


def _inside(child: str, parent: str) -> bool:
    return child.startswith(parent + ".")


def _group_name(fqns: list[str]) -> str:
    """Common name of instances: "transformer.h.0", "transformer.h.1" -> "transformer.h.*"."""
    split = [f.split(".") for f in fqns]
    if len({len(s) for s in split}) == 1:
        parts = [p[0] if len(set(p)) == 1 else "*" for p in zip(*split)]
        return ".".join(parts)
    return "{" + ",".join(fqns) + "}"


def layer_stack(traced) -> BlockGroup | None:
    """The run of consecutive layers a pipeline cuts between when the model's layers are NOT all identical
    (hybrid models: Jamba, Bamba, Qwen3-Next; dense and MoE layers alternating: Qwen3-MoE's
    `decoder_sparse_step`, DeepSeek's `first_k_dense_replace`, Llama 4's `interleave_moe_layer_step`;
    x-transformers' attention and feed-forward entries), else None.

    A stack is the numbered children `P.0, P.1, ...` of one module path P (a ModuleList or Sequential, called or
    not) whose calls run one after another in graph order, each reading a parameter, that together hold every
    member of the graph's first repeated-block group (`_first_run`) and of its largest one (so a homogeneous
    model, whose layers ARE that group, and an encoder-decoder, whose two stacks each hold one group, keep their
    rule). A
    member's nodes are its run before the next member starts; later calls of a member's modules (a DiT head
    calling `transformer_blocks[0].norm1.emb`) must come after the last member, where they join the head's
    stage, and a parameter they read is held by both stages as a tied one. Returned as a `BlockGroup` named
    "P.<first>-<last>" whose members may differ in structure; None when the first group's members already are
    the whole stack (the identical-layer rule applies) or when no such stack exists. A model without repeated
    blocks (two layers of different kinds: no two alike) has the largest such stack, if any (round 16, r16e:
    before, no pipeline unit, so pp=2 over a 2-layer hybrid was refused).
    """
    first = _first_run(traced) if traced.blocks else None
    largest = largest_group(traced) if traced.blocks else None
    order = {name: i for i, name in enumerate(traced.nodes)}
    under: dict[str, list[str]] = defaultdict(list)  # every module path (called or not) -> its nodes
    for info in traced.nodes.values():
        if info.op == "call_function":
            for fqn in _ancestors(info.module_fqn):
                under[fqn].append(info.name)
    children: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for fqn in under:
        parent, _, last = fqn.rpartition(".")
        if last.isdigit():
            children[parent].append((int(last), fqn))
    best: tuple[int, BlockGroup] | None = None
    for parent, kids in children.items():
        fqns = [f for _, f in sorted(kids)]
        runs = _runs(fqns, under, order)
        covers = lambda g: all(any(m == f or _inside(m, f) for f in fqns) for m in g.members)  # noqa: E731
        if runs is None or (first is not None and (not (covers(first) and covers(largest))
                                                   or list(first.members) == fqns)):
            continue
        if not all(_reads_parameters(run, traced.nodes) for run in runs):
            continue
        size = sum(map(len, runs))
        if best is None or size > best[0]:
            idx = [i for i, _ in sorted(kids)]
            best = (size, BlockGroup(name=f"{parent}.{idx[0]}-{idx[-1]}", module_type="(layers of several kinds)",
                                     members=tuple(fqns), nodes=tuple(tuple(r) for r in runs)))
    return best[1] if best else None


def _runs(fqns: list[str], under: dict[str, list[str]], order: dict[str, int]) -> list[list[str]] | None:
    """Each member's nodes before the next member's first node, or None when the members do not run one after
    another (a member starting before the previous one, fewer than two members, or a member's later nodes
    before the end of the last member: calls in turn, not a stack)."""
    if len(fqns) < 2:
        return None
    starts = [order[under[f][0]] for f in fqns]
    if starts != sorted(starts) or len(set(starts)) != len(starts):
        return None
    runs = [[n for n in under[f] if order[n] < nxt] for f, nxt in zip(fqns, starts[1:] + [len(order)])]
    end = order[runs[-1][-1]]
    late = [n for f, run in zip(fqns, runs) for n in under[f][len(run):]]
    if any(order[n] < end for n in late):
        return None
    return runs


def pipeline_unit(traced) -> BlockGroup | None:
    """The members a pipeline cuts between: the layer stack (`layer_stack`) when the layers differ, else the
    first repeated-block group that is a run of blocks (`_first_run`; None: no repeated blocks)."""
    return layer_stack(traced) or (_first_run(traced) if traced.blocks else None)


def largest_group(traced) -> BlockGroup:
    """The repeated-block group with the most nodes (count x nodes per block; the first such on a tie): the
    group the pipeline search cuts at (`planner.segments.segment_graph`)."""
    return max(traced.blocks, key=lambda b: (b.count * b.nodes_per_block, -traced.blocks.index(b)))


def _first_run(traced) -> BlockGroup:
    """The first repeated-block group in graph order whose members enclose no member of another group, else the
    first group. Two equal root-level modules around the layers (an input projection and an output head, both
    Linear(D, D)) are a group of the ILP (one block solved, the answer reused), but no run of layers a pipeline
    can cut between; taking them as its unit refused every pipeline plan of such a model, blaming layers of
    several kinds (round 16, r16a).

    Groups of single modules (their members' nodes all created by the member itself: an embedder's two Linears
    of equal shape, PixArt's caption projection, Wan's time / text embedders at small widths) that all end
    before the largest group starts are no layers either: when the largest group is itself a run, it is the
    unit. Before, the search cut at the largest group and the runtime at the embedder's, and every pipeline
    plan of such a model was refused (round 17, r17b). Groups of modules with children ahead of the largest
    (T5's encoder blocks before its decoder blocks) keep the first group, and with it the refusal."""
    order = {name: i for i, name in enumerate(traced.nodes)}
    starts = {g.name: [order[m[0]] for m in g.nodes] for g in traced.blocks}

    def is_run(g: BlockGroup) -> bool:
        lo, hi = order[g.nodes[0][0]], order[g.nodes[-1][-1]]
        return not any(lo < s < hi for h in traced.blocks if h is not g for s in starts[h.name])

    first = next((g for g in traced.blocks if is_run(g)), traced.blocks[0])
    largest = largest_group(traced)
    begin = order[largest.nodes[0][0]]
    ahead = [g for g in traced.blocks if order[g.nodes[-1][-1]] < begin]
    if first is not largest and first in ahead and is_run(largest) and all(
            traced.nodes[n].module_fqn == member for g in ahead for member, nodes in zip(g.members, g.nodes)
            for n in nodes):
        return largest
    return first
