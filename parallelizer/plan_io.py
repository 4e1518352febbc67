"""Plan JSON validation and the plan's human views (text tables for `parallelizer show`, HTML for notebooks).

Validation: `parse_and_validate(text)` parses JSON (never pickle, never code) and checks it against the
versioned JSON Schema shipped with the package (`parallelizer/plan_schema.json`, draft 2020-12, read with
`importlib.resources`). A violation raises `PlanValidationError` naming the field's JSON path, e.g.
"plan.json: invalid at params/h.0.c_fc.weight/shape/0: 'x' is not of type 'integer'".

Views: `plan_tables(plan)` returns titled tables (mesh and cluster, cost breakdown, memory per device,
per-block placements grouped by block group and position, parameter layouts, collective steps, solver,
fallbacks); `plan_text` and `plan_html` render them.
"""
from __future__ import annotations

import functools
import html
import json
import math
import re
from importlib import resources

from .errors import PlanMismatchError, PlanValidationError, format_bytes
from .planner.plan_text import _MAIN_OPS, memory_rows, precision_text, search_rows
from .planner.stages import MEMORY_KINDS

SCHEMA_FILE = "plan_schema.json"
# The legend printed with every plan view; docs/architecture.md explains the notation and the pipeline.
NOTATION = ("Layouts give one placement per mesh axis, in mesh order: S(d) = sharded along tensor dim d, "
            "R = replicated, P = partial sum pending (P(avg): partial mean), e.g. \"S(0)R\" on (dp, tp). "
            "Parameters have a stored layout and, per use, a use layout. See docs/architecture.md.")


@functools.lru_cache(maxsize=1)
def plan_schema() -> dict:
    """The plan JSON Schema (a dict) shipped as package data."""
    return json.loads(resources.files("parallelizer").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def parse_and_validate(text: str, source: str = "plan JSON") -> dict:
    """Parse `text` as JSON and validate it against `plan_schema()`; return the dict.

    Raises:
        PlanValidationError: not JSON (line and column), another format_version (re-plan), or the first
            schema violation in a deterministic order (its JSON path, the message, and the remedy).
        PlanMismatchError: the mesh's device count differs from the recorded cluster's (a hand edit).
    """
    import jsonschema

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanValidationError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno}, column "
                                  f"{exc.colno}). Remedy: re-create it with `parallelizer plan` or Plan.save.")
    schema = plan_schema()
    readable = schema["properties"]["format_version"]["enum"]
    if isinstance(data, dict) and data.get("format_version") not in readable:
        raise PlanValidationError(
            f"{source}: format_version {data.get('format_version')!r}; this toolkit reads "
            f"{' and '.join(map(str, readable))}. Remedy: re-plan with this version.", "format_version")
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
    if errors:
        err = errors[0]
        path = "/".join(str(p) for p in err.absolute_path)
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise PlanValidationError(
            f"{source}: invalid at {path or '<document>'}: {_short(err.message)}{more}. Remedy: fix that field, "
            f"or re-create the plan with `parallelizer plan` (schema: parallelizer/{SCHEMA_FILE}).", path)
    cluster = data.get("cluster") or {}
    if cluster:
        mesh_devices = math.prod(data["mesh"]["shape"]) * (data["pipeline"]["pp"] if "pipeline" in data else 1)
        cluster_devices = cluster["num_nodes"] * cluster["devices_per_node"]
        if mesh_devices != cluster_devices:
            raise PlanMismatchError(
                f"{source}: the mesh {data['mesh']['shape']} has {mesh_devices} devices but the recorded cluster "
                f"({cluster['num_nodes']} x {cluster['devices_per_node']}) has {cluster_devices}. Remedy: re-create "
                "the plan with `parallelizer plan --mesh ... --cluster ...` of the same size")
    return data


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# ------------------------------------------------------------------------------------------ views
Table = tuple[str, list[str], list[list[str]]]  # (title, header, rows)


def plan_tables(plan, all_positions: bool = False) -> list[Table]:
    """The plan as titled tables (module docstring). Per-block rows show the main ops only unless
    `all_positions`; a block row says whether every member of the group has the same strategy."""
    c = plan.cost
    tables: list[Table] = []
    cl = plan.cluster
    full = plan.pipeline.mesh if plan.pipeline is not None else plan.mesh
    rows = [[name, str(size)] for name, size in zip(full.axis_names, full.shape)]
    rows.append(["devices", str(full.world_size) + (f" (each stage group: {plan.mesh})" if plan.pipeline else "")])
    if cl:
        rows.append(["cluster", f"{cl['spec'] or 'custom'}: {cl['num_nodes']} x {cl['devices_per_node']} {cl['device']}"])
        rows.append(["links", f"intra {cl['intra_node_link']['name']} {_gbps(cl['intra_node_link'])}, "
                              f"inter {cl['inter_node_link']['name']} {_gbps(cl['inter_node_link'])}"])
    batch = plan.model.get("batch")
    if batch:
        rows.append(["batch", ", ".join(f"{k} {v}" for k, v in batch.items() if v is not None)])
    rows.append(["precision", precision_text(plan.config, plan.trained_dtypes())])
    if plan.config.get("axis_roles"):
        rows.append(["axis roles", ", ".join(f"{a}={r}" for a, r in plan.config["axis_roles"])])
    if plan.config.get("zero1"):
        axis = plan.config["zero1"]
        rows.append(["zero1", f"optimizer state partitioned over {axis} (ZeRO-1), as priced: run "
                              f"ZeroRedundancyOptimizer(pm.parameters(), optimizer_class=..., "
                              f"process_group=pm.process_group({axis!r}))"])
    tables.append(("Mesh", ["axis", "size"], rows))
    notes = plan.notes()
    if notes:
        tables.insert(0, ("Notes", ["note"], [[note] for note in notes]))
    total = c.total_s or 1.0
    rows = [["compute", f"{c.compute_s * 1e3:.3f}", f"{c.compute_s / total:.1%}"]]
    rows += [[k, f"{v * 1e3:.3f}", f"{v / total:.1%}"] for k, v in c.comm_s.items() if v]
    rows.append(["total", f"{c.total_s * 1e3:.3f}", "100.0%"])
    title = ("Estimated step time" if plan.pipeline is None else
             "Estimated time of one microbatch, whole graph, one stage group (intra-stage ILP; the step: Search)")
    tables.append((title, ["part", "ms", "share"], rows))
    bound = ("peak = the step's priced peak; reserve = fragmentation, workspaces, communication buffers; peak + "
             "reserve <= budget" if "peak" in c.memory_bytes else  # what the budget binds on (round 26)
             "reserve = fragmentation, workspaces, communication buffers; total + reserve <= budget")
    tables.append((f"Memory per device (total = the plan's tensors; {bound})", ["category", "GB"],
                   [[k, f"{v / 1e9:.3f}"] for k, v in memory_rows(plan)]))
    if plan.pipeline is not None:
        tables.append(plan.pipeline.table())
        if plan.pipeline.compression is not None:
            tables.append(plan.pipeline.compression.table())
        if plan.pipeline.estimate is not None:
            ranks = plan.pipeline.estimate.rank_memory_bytes
            tables.append(("Pipeline memory per device by pp rank (GB; activations = in-flight microbatches)",
                           ["pp rank", *MEMORY_KINDS],
                           [[str(r), *(f"{m.get(k, 0) / 1e9:.3f}" for k in MEMORY_KINDS)] for r, m in enumerate(ranks)]))
    if search_rows(plan):
        tables.append(("Search (parallelizer.plan)", ["field", "value"], [list(r) for r in search_rows(plan)]))
    if plan.compression:
        c = plan.compression
        tables.append(("Data-parallel gradient compression (planner/compression.py)", ["field", "value"], [
            ["option", c["option"]], ["chosen", c["chosen"]], ["fidelity", c["fidelity"]],
            ["estimated step", f"{c['step_s'] * 1e3:.3f} ms"],
            ["best uncompressed step", f"{c['uncompressed_step_s'] * 1e3:.3f} ms"],
            ["estimated speedup", f"{c['speedup']:.2f}x"]]
            + ([["warm-up: exact steps first", str(c["warmup_steps"])],  # PowerSGD; the step above is after them
                ["warm-up step (uncompressed)", f"{c['warmup_step_s'] * 1e3:.3f} ms"]] if "warmup_steps" in c else [])))
    tables.append(("Activation recomputation (planner/recompute.py; regions not listed: none)", ["region", "mode"],
                   [[r, m] for r, m in sorted(plan.recompute.items())] or [["(all)", "none"]]))
    tables += _block_tables(plan, all_positions)
    tables.append(_param_table(plan))
    counts: dict[tuple[str, str], int] = {}
    for _, st in plan.steps():
        key = (st.kind, st.mesh_axis)
        counts[key] = counts.get(key, 0) + 1
    if plan.pipeline is None:
        program = plan.program_steps()
        tables.append(("Redistribution steps (plan edges: one per use of a value, as priced; in each rank's program: "
                       "one per value and target layout, user inputs sliced from whole, as emitted and as `rehearse` "
                       "counts them per kind; forward kinds, each with its backward conjugate; local_slice moves no "
                       "data; gradient all-reduces are bucketed at run time)",
                       ["kind", "mesh axis", "plan edges", "in each rank's program"],
                       [[k, a, str(counts.get((k, a), 0)), str(program.get((k, a), 0))]
                        for k, a in sorted(set(counts) | set(program))]))
    else:
        tables.append(("Redistribution steps (plan edges of the whole graph on one stage group, one per use of a "
                       "value; `rehearse` counts the steps emitted in rank 0's stage programs)",
                       ["kind", "mesh axis", "plan edges"], [[k, a, str(n)] for (k, a), n in sorted(counts.items())]))
    tables.append(_hierarchical_table(plan))
    s = plan.solver
    tables.append(("Solver", ["field", "value"], [
        ["solver", s.solver], ["status", s.status + (" (proven optimal)" if s.optimal else "")],
        ["gap", "n/a" if s.gap is None else f"{s.gap:.2e}"], ["variables", f"{s.num_variables} ({s.num_binary} binary)"],
        ["constraints", str(s.num_constraints)], ["groups", str(s.num_groups)],
        ["objective", f"{s.objective_s * 1e3:.3f} ms"]]))
    tables.append(("Fallbacks (replicated for lack of a sharding rule, or priced by bytes only)", ["node", "op", "reason"],
                   [[f.node, f.op, f.reason] for f in plan.fallbacks]))
    return tables


def _hierarchical_table(plan) -> Table:
    """Per mesh axis and collective kind with a two-level rule (`Plan.hierarchical`): the node layout, the
    message sizes run two-level, and how many of the plan's redistribution collectives (forward and backward)
    fall in them; the DDP gradient buckets follow the same rule at run time by their bytes."""
    rows = []
    for axis, h in sorted(plan.hierarchical.items()):
        for kind, ranges in sorted(h["bytes"].items()):
            sizes = ", ".join(f"({format_bytes(lo)}, {'inf)' if hi is None else format_bytes(hi) + ']'}"
                              for lo, hi in ranges)
            inside = lambda n: any(lo < n <= (math.inf if hi is None else hi) for lo, hi in ranges)  # noqa: E731
            hits = sum(inside(n) for _, st in plan.steps() if st.mesh_axis == axis
                       for k, n in ((st.fwd_collective, st.nbytes), (st.bwd_collective, st.bwd_nbytes)) if k == kind)
            rows.append([axis, kind, f"{h['num_nodes']} nodes x {h['ranks_per_node']}", sizes, str(hits)])
    return ("Hierarchical collectives (two-level: inside nodes, then across; cost_model/communication.py; "
            "not listed: flat)", ["mesh axis", "kind", "group", "bytes run two-level", "plan steps"],
            rows or [["(all)", "flat", "", "", ""]])


def _gbps(link: dict) -> str:
    return f"{link['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s, {link['latency_s'] * 1e6:.1f} us"


def _block_tables(plan, all_positions: bool) -> list[Table]:
    """Per block group: one row per position (member 0's node), its strategy, and how many members agree."""
    tables, in_blocks = [], set()
    for b in plan.model.get("blocks", []):
        rows = []
        for pos, name in enumerate(b["nodes"][0]):
            in_blocks.update(m[pos] for m in b["nodes"])
            node = plan.nodes.get(name)
            if node is None or node.op in ("placeholder", "output"):
                continue
            if not all_positions and not any(k in node.op for k in _MAIN_OPS):
                continue
            same = sum(plan.nodes[m[pos]].strategy == node.strategy for m in b["nodes"] if m[pos] in plan.nodes)
            rows.append([str(pos), name, node.op.removeprefix("aten.").removesuffix(".default"), node.strategy,
                         f"{same}/{len(b['nodes'])}"])
        tables.append((f"Block {b['name']} ({len(b['members'])} x {b['module_type']}), strategies of member 0",
                       ["pos", "node (member 0)", "op", "inputs -> output", "same in"], rows))
    rows = [[n, p.op.removeprefix("aten.").removesuffix(".default"), p.strategy] for n, p in plan.nodes.items()
            if n not in in_blocks and p.op not in ("placeholder", "output")
            and (all_positions or any(k in p.op for k in _MAIN_OPS))]
    tables.append(("Outside repeated blocks" if plan.model.get("blocks") else "Main ops",
                   ["node", "op", "inputs -> output"], rows))
    return tables


def _param_table(plan) -> Table:
    """Parameters with block indices folded ("h.*.attn.c_attn.weight") when every member agrees."""
    groups: dict[str, list] = {}
    for p in plan.params.values():
        groups.setdefault(re.sub(r"\.\d+\.", ".*.", p.fqn, count=1), []).append(p)
    rows = []
    for pattern, ps in groups.items():
        if len({(p.stored, p.local_shape) for p in ps}) == 1 and len(ps) > 1:
            rows.append(_param_row(pattern + f" (x{len(ps)})", ps[0]))
        else:
            rows += [_param_row(p.fqn, p) for p in ps]
    return ("Parameter stored layouts", ["parameter", "shape", "stored", "local shape"], rows)


def _param_row(name: str, p) -> list[str]:
    kind = " (buffer)" if p.is_buffer else ""
    return [name + kind, str(tuple(p.shape)), p.stored, str(tuple(p.local_shape))]


def headline(plan) -> str:
    """One line: the mesh, the estimated step (a pipeline plan's: the search's, on the full mesh) and memory: the
    step's priced peak, what a budget binds on (round 27; before, the sum of kinds, over the budget of plans whose
    peak fits), or the total where the plan records no peak."""
    est = plan.pipeline.estimate if plan.pipeline is not None else None
    head = (f"Pipeline plan on mesh {plan.pipeline.mesh}: estimated step {est.step_s * 1e3:.3f} ms (search)"
            if est is not None else f"Plan on mesh {plan.mesh}: estimated step {plan.cost.total_s * 1e3:.3f} ms")
    mem = plan.cost.memory_bytes
    kind = "peak" if "peak" in mem else "total"
    return f"{head}, {kind} {mem[kind] / 1e9:.2f} GB per device"


def plan_text(plan, all_positions: bool = False) -> str:
    """All `plan_tables` as aligned text tables."""
    out = [headline(plan), NOTATION]
    for title, header, rows in plan_tables(plan, all_positions):
        out.append("")
        out.append(f"## {title}")
        if not rows:
            out.append("(none)")
            continue
        out += text_table(header, rows)
    return "\n".join(out)


LAST_COLUMN_RULE_MAX = 60
"""The widest rule drawn under a table's last column: a longer cell there runs past it (the Mesh table's precision
line, ~300 characters, drew a 300-character rule before round 24; trials r23h, r24h)."""


def text_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """`header` and `rows` as aligned text lines (header, rule, rows; two spaces between columns). Every column is
    as wide as its widest cell, except that the last one's rule stops at `LAST_COLUMN_RULE_MAX` characters (or its
    header's width): nothing follows that column, so a long cell there needs no room reserved."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    widths[-1] = min(widths[-1], max(len(header[-1]), LAST_COLUMN_RULE_MAX))
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    return lines + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def plan_html(plan, max_rows: int = 60) -> str:
    """All `plan_tables` as HTML (the notebook display of `Plan`); long tables are cut at `max_rows`."""
    esc = html.escape
    parts = [f"<div><b>{esc(headline(plan))}</b>", f"<br><small>{esc(NOTATION)}</small>"]
    for title, header, rows in plan_tables(plan):
        parts.append(f"<details{' open' if len(rows) <= 12 else ''}><summary>{esc(title)} ({len(rows)})</summary>"
                     "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
        for r in rows[:max_rows]:
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>")
        if len(rows) > max_rows:
            parts.append(f"<tr><td colspan='{len(header)}'>... {len(rows) - max_rows} more</td></tr>")
        parts.append("</table></details>")
    parts.append("</div>")
    return "\n".join(parts)
