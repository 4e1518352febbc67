"""A `Plan` as text: `summary` (what `parallelizer show` and `Plan.summary` print) and the rows the notebook
tables share with it (`parallelizer.plan_io`): the precision and what runs, memory per device by kind, and how a
searched plan was chosen.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .plan_notes import notes

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["summary", "precision_text", "memory_rows", "search_rows", "stage_scale_text"]


_MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "outputs", "buffers", "total", "peak", "reserve")
_MAIN_OPS = ("linear", "addmm", "matmul", "mm.", "bmm", "embedding", "attention", "layer_norm", "rms_norm",
             "cross_entropy", "conv")
_PRECISION_TEXT = {"bf16": "bf16 compute (an fp32 model's activations in the dtypes torch.autocast gives them), "
                           "fp32 main weights and gradients (18 B/param with Adam)",
                   "fp32": "fp32 params, activations and gradients (16 B/param with Adam)"}


def precision_text(config: dict, param_dtypes: tuple[str, ...] = ()) -> str:
    """The recorded precision with what it means (`cost_model.memory.BYTES_PER_PARAM`) and what the runtime will
    run: the autocast recipe when the plan records one (`runtime.precision`), else the traced dtypes of the
    trained parameters (`param_dtypes`, e.g. ("float32",)). Before, a defaulted bf16 (a GPU preset, the default
    cluster of `auto_parallelize` and of `plan` without `--cluster`) printed "bf16" while the program ran in
    float32; plans made before precision was recorded say so."""
    precision = config.get("precision")
    if not precision:
        return "not recorded"
    text = f"{precision}: {_PRECISION_TEXT.get(precision, '')}".rstrip(": ")
    if config.get("mixed_precision") == "autocast_bf16":
        return f"{text}; runs: torch.autocast(bfloat16) forward, fp32 weights and gradients (runtime/precision.py)"
    dtypes = sorted(set(param_dtypes))
    if not dtypes:
        return text
    runs = "/".join(dtypes)
    if precision == "bf16" and any(d != "bfloat16" for d in dtypes):
        return (f"{text}, as priced; runs: {runs} (the traced dtypes: a defaulted bf16 is a pricing assumption, "
                f"no autocast; plan with precision='bf16' / --precision bf16 to run bf16 autocast, or "
                f"precision='fp32' to price what runs)")
    return f"{text}; runs: {runs} (the traced dtypes)"


def memory_rows(plan: Plan) -> list[tuple[str, int]]:
    """Per-device memory by kind, in reading order: params, grads, optimizer, activations, outputs, buffers, total (the
    plan's tensors), peak (the step's priced peak, a timeline of its backward: `planner.peak`), reserve (kept out of
    the plan: fragmentation, workspaces, communication buffers), then the budget the PEAK plus reserve must fit in
    (round 26: the budget binds on the peak; the total, every kind summed, may exceed it).
    Kinds the plan does not record are left out."""
    mem = plan.cost.memory_bytes
    rows = [(k, mem[k]) for k in _MEMORY_KINDS if k in mem]
    rows += [(k, v) for k, v in mem.items() if k not in _MEMORY_KINDS]
    if plan.config.get("memory_budget_bytes"):
        rows.append(("budget", plan.config["memory_budget_bytes"]))
    return rows


def search_rows(plan: Plan) -> list[tuple[str, str]]:
    """(field, text) rows on how a searched plan was chosen (`parallelizer.plan` without a mesh or with pp): the
    winner and how much was priced, the search's step estimate, and the final ILP's estimate beside it (the two
    are priced differently: the search sums per-segment prices of a tp-only ILP and adds the dp gradient sync
    once per step; the final ILP prices the whole graph on the (dp, tp) mesh for one traced step). Empty for
    plans made on a mesh without pp."""
    found = plan.model.get("search")
    if not found:
        return []
    mesh = ", ".join(f"{a}={n}" for a, n in zip(found["mesh"]["axis_names"], found["mesh"]["shape"]))
    ms = lambda s: f"{s * 1e3:.3f} ms"  # noqa: E731
    rows = [("chosen", f"({mesh}), {found['schedule'] if plan.pipeline is not None else 'no pipeline'}, "
                       f"{found['microbatches']} microbatch(es) of {found['microbatch_size']} per replica, "
                       f"global batch {found['global_batch']}"),
            ("searched", f"{found['candidates']} candidates: {found['priced']} priced ({found['infeasible_memory']} "
                         f"over memory), {found['pruned']} pruned by the lower bound"),
            ("search estimate", f"{ms(found['step_s'])} per optimizer step")]
    if plan.pipeline is not None and (ran := _runs_otherwise(plan.pipeline, found)):
        rows.insert(1, ("runs", ran))
    if "mfu" in found:  # plans made before round 17 did not record it
        rows.append(("throughput", f"{found['tflops_per_device']:.1f} TFLOP/s per "
                                   f"device = {found['mfu']:.1%} MFU of {found['device']} "
                                   f"({found['peak_flops_per_s'] / 1e12:.0f} TFLOP/s peak) at the search estimate; "
                                   f"{found['global_batch'] / found['step_s']:.1f} samples/s"))
    if found.get("alternatives") and plan.pipeline is not None:  # schedules compared: only with stages
        from .pipeline import alternative_line
        rows += [("why " + a["schedule"] if k == 0 else "vs " + a["schedule"], alternative_line(a))
                 for k, a in enumerate(found["alternatives"])]
    m = found["microbatches"]
    if plan.pipeline is None and plan.shards_nothing():
        rows.append(("but", f"the final ILP on {plan.mesh} sharded nothing (see the note on no parallelism): the "
                            "search priced these axes as data parallelism, the whole-graph ILP found replication "
                            "cheaper, so each device runs the whole step"))
    if plan.pipeline is None:
        rows.append(("final ILP estimate", f"{ms(plan.cost.total_s * m)} per optimizer step ({m} x "
                                           f"{ms(plan.cost.total_s)} per traced step) on mesh {plan.mesh}"))
    else:
        est = plan.pipeline.estimate
        rows += [("pipeline", f"{ms(est.pipeline_s)} (bubble {ms(est.bubble_s)}) + dp grad sync "
                              f"{ms(est.dp_grad_sync_s)} + tied grad sync {ms(est.tied_grad_sync_s)}"),
                 ("per microbatch", f"search: stages sum to {ms(sum(est.stage_s))}; final ILP (whole graph, one "
                                    f"stage group {plan.mesh}, dp gradient sync included): {ms(plan.cost.total_s)}")]
        if found.get("stage_scale", 1.0) != 1.0:
            rows.append(("stage times", stage_scale_text(sum(est.stage_s), found["stage_scale"], found["mesh"])))
    return rows


def _runs_otherwise(pipe, found: dict) -> str | None:
    """What the plan's pipeline section runs when it is not the search's choice recorded in `model.search`
    (the file was edited: the section is what loads and runs, the record only reports the search); None when
    they agree. Round 23 new-user trial: a GPT-3-13B plan whose `model.search.schedule` was edited to zbv (the
    first "schedule" field a reader meets after the alternatives) showed "chosen ... zbv" above a stage table
    that ran dualpipev, and an edit of `pipeline.schedule` showed the search's dualpipev as chosen."""
    mesh = ", ".join(f"{a}={n}" for a, n in zip(pipe.mesh.axis_names, pipe.mesh.shape))
    sizes = lambda names, shape: {a: n for a, n in zip(names, shape) if n > 1}  # noqa: E731  (pp=2 == pp=2, dp=1)
    if (pipe.schedule, pipe.microbatches, sizes(pipe.mesh.axis_names, pipe.mesh.shape)) == (
            found["schedule"], found["microbatches"], sizes(found["mesh"]["axis_names"], found["mesh"]["shape"])):
        return None
    return (f"({mesh}), {pipe.schedule}, {pipe.microbatches} microbatch(es): the plan's pipeline section, which "
            "loads and runs, differs from the search's choice recorded in model.search (edited by hand?); the "
            "search's figures below are for its choice: price the edit with "
            "planner.steptime.estimate_step_time")


def stage_scale_text(stage_sum_s: float, scale: float, mesh: dict) -> str:
    """What the stage column's seconds are and what the simulation ran (r21g finding 10: on 4 CPU ranks the
    stages summed to 88.4 ms per microbatch while one microbatch through the 4 stages in turn was simulated at
    57.5 ms, and nothing said why): on a cluster whose processes share a CPU's cores (`Cluster.sharing`) each
    stage is priced at the device's rate with every process computing (the calibrated slowdown of all of them),
    and the simulation runs a stage alone at `scale` times that, slowed again only while other pipeline ranks
    compute (`planner.sharing.pipeline_cores`)."""
    n = 1
    for size in mesh["shape"]:
        n *= size
    return (f"the stage column is priced with all {n} processes computing at once (the cluster device's "
            f"calibrated slowdown); the simulation runs a stage computing alone at x{scale:.3g} of that (ranks "
            f"sharing the CPU's cores: planner/sharing.pipeline_cores), so the compute of one microbatch through the stages takes about "
            f"{stage_sum_s * scale * 1e3:.3f} ms in turn with no other rank computing, plus sends and per-action "
            "costs, and longer while other pipeline ranks compute")


def summary(plan: Plan, max_nodes: int = 40) -> str:
    """Text summary: notes, cost, memory, solver, parameter layouts, the main ops' strategies, fallbacks."""
    c, s = plan.cost, plan.solver
    gb = 1e9
    gap = "n/a" if s.gap is None else f"{s.gap:.2e}"
    lines = [f"NOTE: {note}" for note in notes(plan)]
    if plan.pipeline is not None and plan.pipeline.estimate is not None:
        lines.append(f"Pipeline plan on mesh {plan.pipeline.mesh}: " + plan.pipeline.estimate.lines()[0])
    lines += [f"{'Intra-stage plan (one microbatch, whole graph)' if plan.pipeline else 'Plan'} on mesh "
              f"{plan.mesh}: estimated step {c.total_s * 1e3:.3f} ms "
             f"(compute {c.compute_s * 1e3:.3f} ms"
             + "".join(f", {k} {v * 1e3:.3f} ms" for k, v in c.comm_s.items() if v) + ")",
             f"precision: {precision_text(plan.config, plan.trained_dtypes())}",
             "memory per device: " + ", ".join(f"{k} {v / gb:.2f} GB" for k, v in memory_rows(plan)),
             f"solver: {s.solver} {s.status} (gap {gap}), {s.num_variables} variables "
             f"({s.num_binary} binary), {s.num_constraints} constraints, {s.num_groups} groups"
             + (f", {s.time_s:.2f} s" if s.time_s is not None else "")]
    if plan.recompute:
        by_mode: dict[str, list[str]] = {}
        for region, mode in sorted(plan.recompute.items()):
            by_mode.setdefault(mode, []).append(region)
        lines.append("recomputation: " + "; ".join(
            f"{mode} on {len(rs)} blocks ({', '.join(rs[:3])}{', ...' if len(rs) > 3 else ''})"
            for mode, rs in sorted(by_mode.items())))
    else:
        lines.append("recomputation: none")
    if plan.compression:
        from .compression import compression_line
        lines.append(compression_line(plan.compression))
    by_layout: dict[str, int] = {}
    for p in plan.params.values():
        if not p.is_buffer:
            by_layout[p.stored] = by_layout.get(p.stored, 0) + 1
    lines.append("parameters stored as: " + ", ".join(f"{k} x{v}" for k, v in sorted(by_layout.items())))
    counts: dict[str, int] = {}
    for _, st in plan.steps():
        counts[st.kind] = counts.get(st.kind, 0) + 1
    lines.append("steps: " + (", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"))
    main = [(n, p) for n, p in plan.nodes.items() if any(k in p.op for k in _MAIN_OPS)]
    lines.append(f"main ops ({len(main)}):")
    for n, p in main[:max_nodes]:
        lines.append(f"  {n:32s} {p.op:45s} {p.strategy}")
    if len(main) > max_nodes:
        lines.append(f"  ... {len(main) - max_nodes} more")
    for f in plan.fallbacks:
        lines.append(f"fallback: {f.node} ({f.op}): {f.reason}")
    if plan.pipeline is not None:
        title, header, rows = plan.pipeline.table()
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines.append(title + ":")
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
        if plan.pipeline.estimate is not None:
            lines += plan.pipeline.estimate.lines()[1:]
        if plan.pipeline.compression is not None:
            lines += plan.pipeline.compression.lines()
    rows = search_rows(plan)
    if rows:
        lines.append("search (parallelizer.plan):")
        lines += [f"  {k}: {v}" for k, v in rows]
    return "\n".join(lines)
