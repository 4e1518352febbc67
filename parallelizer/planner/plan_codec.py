"""Plan JSON format 4: store what was decided, once; derive the rest on load and check it.

The document holds mesh, config, cost, solver, fallbacks and cluster as they are in memory, and:

  "graph"   the nodes outside repeated blocks in graph order, one row per line:
                [name, op, strategy, inputs]   e.g. ["add_1", "aten.add.Tensor", "S(0)R S(0)R -> S(0)R", [...]]
            or  [block name, member index]     where that member's nodes sit, e.g. ["transformer.h.*", 3].
            `strategy` is `NodePlan.strategy` ("IN IN -> OUT"); each input is [ref, dtype, shape,
            requires_grad]: the producer, the tensor it passes (global shape, torch dtype name) and whether
            a gradient flows back through this use. Parameter placeholders are not listed: each one's
            strategy is "-> stored" of its parameter.
  "blocks"  per repeated-block group: name ("transformer.h.*"), module_type, members, per member the node
            names by position ("nodes") and the outside tensors it reads ("args"), one line per member; per
            position one row [op, strategy, inputs] shared by every member ("positions", one line each), and
            "exceptions" {member: {position: row}} where a member differs. A ref inside a block is "@q"
            (position q of the same member), "~rel" (the placeholder of parameter `member.rel`) or "$k" (the
            member's k-th arg); outside blocks it is the producer's name. In a pipeline plan whose stages use
            different intra-stage layouts (`pipeline.stages[k].layout`, `planner.stage_layouts`), "positions"
            are the rows of the layout of the group's first member and "layouts" {layout: {position: row}} holds,
            once per other layout, the positions where its common row differs; a member's exceptions are
            relative to its own stage's layout.
  "params"  per parameter FQN, or per block pattern ("transformer.h.*.mlp.c_fc.weight") when every member
            agrees: aliases, placeholders, shape, dtype, stored layout, is_buffer. Local shapes are derived.
  "model"   as in memory, without "blocks" (see above); "fingerprint": as in memory, without
            summary.params (derived from "params": shape and dtype).

`decode` derives every NodePlan, the edges and their steps (`plan.derive_edge`, i.e.
`core.redistribute.edge_steps`) and local shapes, and checks them: refs resolve, a strategy has one layout
per input, every member of a block appears once in "graph", the node count equals model.num_nodes, the op
counts equal fingerprint.summary.ops, every layout change has a collective, every stored layout fits its
parameter. A violation raises `PlanValidationError` naming the JSON path and the remedy. A loaded plan lists
the parameter placeholders first, then the nodes in graph order with each block member's nodes where its
first node was (the planner's order whenever a member's nodes are contiguous, as torch.export emits them).

`dumps` lays the document out for review: dict keys sorted, one per line, except that a small flat dict (a
parameter entry, a fallback, memory by category: at most 8 fields of scalars or lists of scalars) is one
line; a list of scalars is one line; a list of lists or of dicts has one element per line. One changed
decision is then one changed line that names it (a position's row, a parameter's entry).

Format 3 (before per-stage layouts) is read as format 4 with every stage on layout 0 and no "layouts".
"""
from __future__ import annotations

import json
from collections import Counter

from ..core.layout import Layout, local_shape
from ..core.mesh import MeshSpec
from ..core.redistribute import ImpossibleRedistributionError
from ..errors import PlanValidationError
from .plan import EdgePlan, NodePlan, ParamPlan, derive_edge

_REMEDY = "Remedy: re-create the plan with `parallelizer plan` (or Plan.save) instead of editing it by hand."


# ----------------------------------------------------------------------------------------------- encode
def encode(plan) -> dict:
    """The compact fields of `plan` (module docstring): graph, blocks, params, model, fingerprint.

    Raises:
        PlanValidationError: the plan's parts disagree so the compact form would not load back equal: a node
            of a block missing from `plan.nodes`, or a parameter placeholder whose strategy is not "-> stored".
    """
    blocks = plan.model.get("blocks") or []
    member_of = {n: (bi, m) for bi, b in enumerate(blocks) for m, names in enumerate(b["nodes"]) for n in names}
    missing = sorted(n for n in member_of if n not in plan.nodes)
    if missing:
        raise PlanValidationError(f"plan: block nodes {missing[:5]} are not nodes of the plan. {_REMEDY}", "blocks")
    into: dict[str, list[EdgePlan]] = {}
    for e in plan.edges:
        into.setdefault(e.dst, []).append(e)
    owner = _placeholder_owners(plan)
    graph, placed = [], set()
    for name, node in plan.nodes.items():
        if name in member_of:
            if member_of[name] not in placed:
                placed.add(member_of[name])
                bi, m = member_of[name]
                graph.append([blocks[bi]["name"], m])
        elif name not in owner:
            graph.append([name, node.op, node.strategy, [_input(e, e.src) for e in _sorted(into.get(name, []))]])
    model = {k: v for k, v in plan.model.items() if k != "blocks"}
    fingerprint = plan.fingerprint
    if fingerprint:
        _check_fingerprint_params(plan)
        fingerprint = {**fingerprint, "summary": {k: v for k, v in fingerprint["summary"].items() if k != "params"}}
    variant = _member_layouts(plan.pipeline.to_dict() if plan.pipeline is not None else None)
    return {"graph": graph, "blocks": [_encode_block(plan, b, into, owner, variant) for b in blocks],
            "params": _encode_params(plan, blocks), "model": model, "fingerprint": fingerprint}


def _placeholder_owners(plan) -> dict[str, ParamPlan]:
    """Placeholder name -> its parameter, for every parameter placeholder (left out of "graph")."""
    owner = {}
    for p in plan.params.values():
        for ph in p.placeholders:
            node = plan.nodes.get(ph)
            if node != NodePlan("placeholder", (), p.stored):
                raise PlanValidationError(
                    f"plan: placeholder {ph!r} of parameter {p.fqn} has {node} but the parameter is stored as "
                    f"{p.stored}; a parameter placeholder's strategy is its stored layout. {_REMEDY}", f"params/{p.fqn}")
            owner[ph] = p
    return owner


def _check_fingerprint_params(plan) -> None:
    recorded = plan.fingerprint["summary"]["params"]
    if recorded != _fingerprint_params(plan.params):
        raise PlanValidationError("plan: fingerprint.summary.params disagree with params (shape, dtype). "
                                  + _REMEDY, "fingerprint/summary/params")


def _fingerprint_params(params: dict[str, ParamPlan]) -> dict:
    return {p.fqn: {"shape": list(p.shape), "dtype": p.dtype} for p in params.values()}


def _sorted(edges: list[EdgePlan]) -> list[EdgePlan]:
    edges = sorted(edges, key=lambda e: e.index)
    if [e.index for e in edges] != list(range(len(edges))):
        raise PlanValidationError(f"plan: the inputs of node {edges[0].dst} are numbered "
                                  f"{[e.index for e in edges]}, not 0..{len(edges) - 1}. {_REMEDY}", "edges")
    return edges


def _input(e: EdgePlan, ref: str) -> list:
    return [ref, e.dtype, list(e.shape), e.requires_grad]


def _member_layouts(pipeline: dict | None) -> dict[str, int]:
    """Block member -> the intra-stage layout of its stage (JSON form of `Plan.pipeline`; none: layout 0)."""
    return {m: s.get("layout", 0) for s in (pipeline or {}).get("stages", []) for m in s["blocks"]}


def _encode_block(plan, b: dict, into: dict, owner: dict, variant: dict[str, int]) -> dict:
    """One block group: per-member names and args, per position the most common row among the members of the
    first member's layout, per other layout the positions whose common row differs, and per member the rows
    that differ from its layout's (exceptions)."""
    rows, args = [], []
    for member, names in zip(b["members"], b["nodes"]):
        position = {n: q for q, n in enumerate(names)}
        member_args: list[str] = []

        def ref(src: str) -> str:
            if src in position:
                return f"@{position[src]}"
            p = owner.get(src)
            if p is not None and p.fqn.startswith(member + ".") and len(p.placeholders) == 1:
                return "~" + p.fqn[len(member) + 1:]
            if src not in member_args:
                member_args.append(src)
            return f"${member_args.index(src)}"

        rows.append([[plan.nodes[n].op, plan.nodes[n].strategy, [_input(e, ref(e.src)) for e in _sorted(into.get(n, []))]]
                     for n in names])
        args.append(member_args)
    of = [variant.get(m, 0) for m in b["members"]]
    positions, layouts, exceptions = [], {}, {}
    for q in range(len(b["nodes"][0])):
        forms = [json.dumps(r[q]) for r in rows]
        common = {}
        for v in dict.fromkeys(of):  # each layout's most common row (ties: the first member's)
            mine = [f for f, w in zip(forms, of) if w == v]
            common[v] = max(mine, key=lambda f: (mine.count(f), -mine.index(f)))
        positions.append(json.loads(common[of[0]]))
        for v, f in common.items():
            if f != common[of[0]]:
                layouts.setdefault(str(v), {})[str(q)] = json.loads(f)
        for m, f in enumerate(forms):
            if f != common[of[m]]:
                exceptions.setdefault(str(m), {})[str(q)] = rows[m][q]
    return {"name": b["name"], "module_type": b["module_type"], "members": list(b["members"]),
            "nodes": [list(n) for n in b["nodes"]], "args": args, "positions": positions, "exceptions": exceptions,
            **({"layouts": layouts} if layouts else {})}


def _encode_params(plan, blocks: list[dict]) -> dict:
    """Parameters, folded to one entry per block pattern where every member's entry agrees (verified by
    unfolding), else one entry per FQN."""
    out, groups = {}, {}
    for p in plan.params.values():
        entry = {"aliases": list(p.aliases), "placeholders": list(p.placeholders), "shape": list(p.shape),
                 "dtype": p.dtype, "stored": p.stored, "is_buffer": p.is_buffer}
        folded = next(((b, m) for b in blocks if "*" in b["name"]
                       for m in b["members"] if p.fqn.startswith(m + ".")), None)
        if folded is None:
            out[p.fqn] = entry
            continue
        b, member = folded
        key = _fold(p.fqn, member, b["name"])
        if _block_of_key(key, blocks) is not b:  # the key would unfold under another group whose name folds alike
            out[p.fqn] = entry  # (Llama 4: "model.layers.*" and "model.layers.*.feed_forward"): kept whole
            continue
        groups.setdefault((b["name"], key), []).append((p.fqn, member, entry, _fold(entry, member, b["name"])))
    for (name, key), items in groups.items():
        members = next(b["members"] for b in blocks if b["name"] == name)
        agree = (len(items) == len(members) and [m for _, m, _, _ in items] == list(members)
                 and all(f == items[0][3] for _, _, _, f in items)
                 and all(_unfold(items[0][3], m, name) == e and _unfold(key, m, name) == fqn for fqn, m, e, _ in items))
        if agree:
            out[key] = items[0][3]
        else:
            out.update({fqn: e for fqn, _, e, _ in items})
    return out


def _block_of_key(key: str, blocks: list[dict]) -> dict | None:
    """The block group a folded parameter key unfolds under: the longest group name ending where a dot follows in
    `key` (two groups' names may fold alike, one a prefix of the other: Llama 4's "model.layers.*" (dense layers)
    and "model.layers.*.feed_forward" (its MoE layers' feed-forwards); before, the first one took every key of the
    other, and the plan JSON the planner wrote did not load: PlanValidationError "ref '~router.weight' resolves
    to nothing")."""
    return max((b for b in blocks if "*" in b["name"] and key.startswith(b["name"] + ".")),
               key=lambda b: len(b["name"]), default=None)


def _fold(x, member: str, pattern: str):
    """Replace `member` ("transformer.h.3") by `pattern` ("transformer.h.*") in strings, also in their
    underscore forms (placeholder names "p_transformer_h_3_...")."""
    if isinstance(x, str):
        return x.replace(member, pattern).replace(member.replace(".", "_"), pattern.replace(".", "_"))
    if isinstance(x, list):
        return [_fold(v, member, pattern) for v in x]
    if isinstance(x, dict):
        return {k: _fold(v, member, pattern) for k, v in x.items()}
    return x


def _unfold(x, member: str, pattern: str):
    return _fold(x, pattern, member)


# ----------------------------------------------------------------------------------------------- decode
def decode(d: dict, mesh: MeshSpec, source: str = "plan JSON"):
    """(nodes, params, edges, model, fingerprint) of a schema-valid format-3 document (module docstring).

    Raises:
        PlanValidationError: a derived part is inconsistent (names the JSON path and the remedy).
    """
    def fail(path: str, what: str):
        raise PlanValidationError(f"{source}: invalid at {path}: {what}. {_REMEDY}", path)

    blocks = d["blocks"]
    if d.get("pipeline"):  # its own checks first (a hand-edited cut or schedule: `stages.check_section` names it)
        from .stages import PipelineSection
        PipelineSection.from_dict(d["pipeline"])
    variant = _member_layouts(d.get("pipeline"))
    params = _decode_params(d["params"], blocks, mesh, fail)
    owner = {ph: p for p in params.values() for ph in p.placeholders}
    nodes: dict[str, NodePlan] = {ph: NodePlan("placeholder", (), p.stored) for ph, p in owner.items()}
    inputs: dict[str, tuple[str, list]] = {}  # node -> (JSON path of its row, [producer, dtype, shape, grad]...)

    def add(name: str, op: str, strategy: str, ins: list, path: str, resolve) -> None:
        if name in nodes:
            fail(path, f"node {name!r} appears twice")
        try:
            node = NodePlan.from_strategy(op, strategy)
            for layout in (*node.inputs, *([node.output] if node.output is not None else [])):
                Layout.parse(layout)
        except ValueError as exc:
            fail(path, str(exc))
        if len(node.inputs) != len(ins):
            fail(path, f"strategy {strategy!r} of {name} has {len(node.inputs)} input layouts for {len(ins)} inputs")
        nodes[name] = node
        inputs[name] = (path, [[resolve(i[0]), *i[1:]] for i in ins])

    placed = set()
    for i, row in enumerate(d["graph"]):
        if len(row) == 2:
            bi = next((k for k, b in enumerate(blocks) if b["name"] == row[0]), None)
            if bi is None or not 0 <= row[1] < len(blocks[bi]["members"]) or (bi, row[1]) in placed:
                fail(f"graph/{i}", f"{row} names no block member, or one placed twice")
            placed.add((bi, row[1]))
            _decode_member(blocks[bi], bi, row[1], params, add, fail, variant)
        else:
            add(row[0], row[1], row[2], row[3], f"graph/{i}", lambda ref: ref)
    unplaced = [f"{b['name']}[{m}]" for bi, b in enumerate(blocks) for m in range(len(b["members"]))
                if (bi, m) not in placed]
    if unplaced:
        fail("graph", f"block members {unplaced[:5]} have no [block, member] row")
    edges = _derive_edges(nodes, inputs, owner, mesh, fail)
    _check_counts(d, nodes, fail)
    model = dict(d["model"])
    if blocks:
        model["blocks"] = [{k: b[k] for k in ("name", "module_type", "members", "nodes")} for b in blocks]
    fingerprint = d["fingerprint"]
    if fingerprint:
        fingerprint = {**fingerprint, "summary": {**fingerprint["summary"], "params": _fingerprint_params(params)}}
    return nodes, params, edges, model, fingerprint


def _decode_params(entries: dict, blocks: list[dict], mesh: MeshSpec, fail) -> dict[str, ParamPlan]:
    params = {}
    for key, e in entries.items():
        block = _block_of_key(key, blocks)
        for member in (block["members"] if block else [None]):
            fqn, entry = (key, e) if member is None else (_unfold(key, member, block["name"]),
                                                          _unfold(e, member, block["name"]))
            try:
                local = local_shape(tuple(entry["shape"]), Layout.parse(entry["stored"]), mesh)
            except ValueError as exc:
                fail(f"params/{key}/stored", f"{entry['stored']!r} does not place shape {tuple(entry['shape'])} on "
                                             f"mesh {mesh}: {exc}")
            if fqn in params:
                fail(f"params/{key}", f"parameter {fqn} is listed twice")
            params[fqn] = ParamPlan(fqn, tuple(entry["aliases"]), tuple(entry["placeholders"]), tuple(entry["shape"]),
                                    entry["stored"], local, entry["is_buffer"], entry["dtype"])
    return params


def _decode_member(b: dict, bi: int, m: int, params: dict, add, fail, variant: dict[str, int]) -> None:
    """Add the nodes of member `m` of block `b`: its position rows (its stage's layout's where they differ,
    or its exceptions) with refs resolved."""
    names, args, member = b["nodes"][m], b["args"][m], b["members"][m]
    if len(names) != len(b["positions"]):
        fail(f"blocks/{bi}/nodes/{m}", f"{len(names)} node names for {len(b['positions'])} positions")
    layout = str(variant.get(member, 0))
    if layout in b.get("layouts", {}) and layout == str(variant.get(b["members"][0], 0)):
        fail(f"blocks/{bi}/layouts/{layout}", "the first member's layout is stored in positions, not in layouts"
             + (f" (member {member} runs its pipeline stage's `layout` {layout}, the first member's too: a block moved "
                "to a stage of another layout, or a stage's layout index edited, has no strategies stored for it; "
                "intra-stage layouts are the planner's, re-plan to change them)" if variant else ""))
    for q, name in enumerate(names):
        override = b["exceptions"].get(str(m), {}).get(str(q))
        shared = b.get("layouts", {}).get(layout, {}).get(str(q))
        path = (f"blocks/{bi}/exceptions/{m}/{q}" if override is not None else f"blocks/{bi}/layouts/{layout}/{q}"
                if shared is not None else f"blocks/{bi}/positions/{q}")
        op, strategy, ins = override if override is not None else shared if shared is not None else b["positions"][q]

        def resolve(ref: str, path=path) -> str:
            kind, rest = ref[0], ref[1:]
            if kind == "@" and rest.isdigit() and int(rest) < len(names):
                return names[int(rest)]
            if kind == "$" and rest.isdigit() and int(rest) < len(args):
                return args[int(rest)]
            p = params.get(f"{member}.{rest}")
            if kind == "~" and p is not None and len(p.placeholders) == 1:
                return p.placeholders[0]
            fail(path, f"ref {ref!r} resolves to nothing in member {member} ({len(names)} positions, "
                       f"{len(args)} args)")
        add(name, op, strategy, ins, path, resolve)


def _derive_edges(nodes: dict, inputs: dict, owner: dict, mesh: MeshSpec, fail) -> tuple[EdgePlan, ...]:
    edges = []
    for name, node in nodes.items():
        if name not in inputs:
            continue
        path, ins = inputs[name]
        for k, (src, dtype, shape, grad) in enumerate(ins):
            producer = nodes.get(src)
            if producer is None or producer.output is None:
                fail(path, f"input {k} of {name} names {src!r}, which is no node with an output")
            try:
                edges.append(derive_edge(mesh, src, name, k, producer.output, node, tuple(shape), dtype, grad,
                                         src in owner and not owner[src].is_buffer))
            except (ImpossibleRedistributionError, ValueError) as exc:
                fail(path, f"input {k} of {name} ({src} {producer.output} -> {node.inputs[k]}, {dtype}{shape}): {exc}")
    return tuple(edges)


def _check_counts(d: dict, nodes: dict, fail) -> None:
    if len(nodes) != d["model"]["num_nodes"]:
        fail("model/num_nodes", f"{d['model']['num_nodes']} recorded, {len(nodes)} nodes in graph, blocks and params")
    if d["fingerprint"]:
        ops = Counter(n.op for n in nodes.values() if n.op not in ("placeholder", "output"))
        recorded = Counter(d["fingerprint"]["summary"]["ops"])
        if ops != recorded:
            diff = sorted(set(ops.items()) ^ set(recorded.items()))
            fail("fingerprint/summary/ops", f"op counts of the stored nodes differ from the fingerprint: {diff[:6]}")


# ----------------------------------------------------------------------------------------------- layout
def dumps(obj, indent: str = " ", _depth: int = 0) -> str:
    """JSON text laid out for review (module docstring); `json.loads` reads it back."""
    pad, inner = indent * _depth, indent * (_depth + 1)
    if isinstance(obj, dict):
        if not obj or _is_record(obj):
            return json.dumps(obj, sort_keys=True, separators=(", ", ": "))
        items = [f"{inner}{json.dumps(str(k))}: {dumps(obj[k], indent, _depth + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)) and obj and (
            all(isinstance(v, (list, tuple)) for v in obj) or any(isinstance(v, dict) for v in obj)):
        return "[\n" + ",\n".join(inner + dumps(v, indent, _depth + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj, sort_keys=True, separators=(", ", ": "))


_RECORD_KEYS = 8  # a dict of at most this many scalar (or list-of-scalar) fields is written on one line


def _is_record(d: dict) -> bool:
    """A small flat dict (a parameter entry, a fallback, memory by category): one line, so a diff of a changed
    field shows the whole record, its name included."""
    scalar = (str, int, float, bool, type(None))
    return len(d) <= _RECORD_KEYS and all(
        isinstance(v, scalar) or (isinstance(v, (list, tuple)) and all(isinstance(x, scalar) for x in v))
        for v in d.values())
