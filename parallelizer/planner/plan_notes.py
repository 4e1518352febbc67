"""The notes a `Plan` shows first (`Plan.notes`): derived from the plan, never stored.

A plan on several devices that uses no parallelism at all (`shards_nothing`) gets one note saying why (batch
smaller than the axes, ops without a sharding rule, axis roles, the cost model) and the remedies that apply; else
one note per idle mesh axis (`idle_axes`), ops without a sharding rule, axis roles a parameter could not honour,
blocks that could not be recomputed, activations gathered over a data-parallel axis, and values of at least
`LARGE_GATHER_BYTES` gathered whole to be returned or to feed a loss (the bytes per step and the remedy).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..core.layout import Layout, local_shape, placement_str
from ..errors import format_bytes
from .stages import step_reads

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["LARGE_GATHER_BYTES", "idle_axes", "shards_nothing", "notes"]

# A gathered value at least this large gets a note (`_large_gather_notes`): a GPT-2 small batch of 8 x 1024
# tokens has 1.6 GB of fp32 logits.
LARGE_GATHER_BYTES = 64 * 2**20
_LOSS_OPS = ("cross_entropy", "nll_loss", "log_softmax", "_softmax", "kl_div", "binary_cross_entropy")


def idle_axes(plan: Plan) -> list[str]:
    """Mesh axes of more than one device over which no floating value (an op's input or output, carried by an
    edge) and no floating parameter or buffer is sharded or Partial: the ranks along such an axis all compute
    the same thing (the whole plan, when every such axis is idle). Integer and boolean values (token ids, a
    label shift's `new_zeros`, index arithmetic, masks) are left out: sharding them alone divides no work
    (round 16, r16e: Speech2Text's default plan on dp=2 x tp=4 replicated every op but the labels' int64
    `new_zeros` (8, 32), S(1)S(1), and no "no parallelism" note was given)."""
    def floating(dtype: str) -> bool:
        t = getattr(torch, str(dtype).removeprefix("torch."), None)
        return not isinstance(t, torch.dtype) or t.is_floating_point or t.is_complex
    layouts = {L for e in plan.edges if floating(e.dtype) for L in (e.src_layout, e.dst_layout)}
    layouts |= {p.stored for p in plan.params.values() if floating(p.dtype)}
    used = set()
    for text in layouts:
        for axis, pl in zip(plan.mesh.axis_names, Layout.parse(text).placements):
            if placement_str(pl) != "R":
                used.add(axis)
    return [a for a, n in zip(plan.mesh.axis_names, plan.mesh.shape) if n > 1 and a not in used]


def shards_nothing(plan: Plan) -> bool:
    """Whether the mesh has devices to share the work but every axis of more than one device is idle
    (`idle_axes`): each device computes the whole step."""
    idle = idle_axes(plan)
    return bool(idle) and len(idle) == sum(n > 1 for n in plan.mesh.shape)


def _idle_axis_note(plan: Plan, axis: str, idle: list[str]) -> str:
    """The note of one idle axis of a plan that uses another axis: its devices folded into the first axis
    in use is the mesh to try instead."""
    n = plan.mesh.size(axis)
    busy = next(a for a, k in zip(plan.mesh.axis_names, plan.mesh.shape) if k > 1 and a not in idle)
    other = {a: k * (n if a == busy else 1) for a, k in zip(plan.mesh.axis_names, plan.mesh.shape)
             if a not in idle}
    return (f"axis {axis} ({n} devices) is unused: nothing is sharded over it, so the {n} ranks along it "
            f"compute the same values (each repeats the others' work). Remedies: a mesh without it (e.g. "
            f"{other}), or a role that shards over it (axis_roles={{'{axis}': 'ddp'}}, or 'tp')")


def _no_parallelism_note(plan: Plan, roles: dict) -> str:
    """The note of a plan that uses no parallelism on a mesh of several devices, naming why (batch smaller
    than the axes, ops without a sharding rule, axis roles, the cost model) and the remedies that apply."""
    big = [(a, n) for a, n in zip(plan.mesh.axis_names, plan.mesh.shape) if n > 1]
    bd = dict(tuple(x) for x in plan.config.get("batch_dims") or [])
    default_dim = plan.config.get("default_batch_dim", 0)
    batch = 0
    for name, shape in (plan.model.get("inputs") or {}).items():
        dim = bd.get(name, default_dim)
        if dim is not None and shape and -len(shape) <= dim < len(shape):
            batch = max(batch, shape[dim])
    why, remedies = [], []
    if batch and batch < min(n for _, n in big):
        what = "microbatch" if plan.pipeline is not None else "batch"
        why.append(f"the {what} ({batch} sample(s) along the batch dim of the inputs) has fewer samples than "
                   f"any axis has devices ({', '.join(f'{a}={n}' for a, n in big)}), so it cannot be split, "
                   "and no other sharding paid for its communication under the cost model")
        remedies.append(f"fewer, larger microbatches (--microbatches; at least {min(n for _, n in big)} samples "
                        "each)" if plan.pipeline is not None else
                        f"a batch of at least {min(n for _, n in big)} samples per step")
    weights = any(len(q.shape) >= 2 and not q.is_buffer for q in plan.params.values())
    tp_axis = next((a for a, _ in big if a not in ("dp", "pp")), None)
    if weights and tp_axis is not None and not roles:  # Megatron's remedy needs no samples along the axis
        remedies.append(f"axis_roles={{'{tp_axis}': 'tp'}} (CLI: --roles {tp_axis}=tp) to force tensor "
                        "parallelism (weights sharded over the axis, the batch not split there)")
    ops = [n for n in plan.nodes.values() if n.op not in ("placeholder", "output", "get_attr")]
    no_rule = [f for f in plan.fallbacks if f.reason.startswith("no sharding rule")]
    if ops and len(no_rule) * 2 >= len(ops):
        why.append(f"{len(no_rule)} of its {len(ops)} ops have no sharding rule and run replicated "
                   f"({', '.join(sorted({f.op for f in no_rule})[:6])}{', ...' if len({f.op for f in no_rule}) > 6 else ''})")
    if roles:
        why.append(f"the axis roles {roles} shard nothing here")
        remedies.append("check the batch and hidden sizes against the mesh")
    device = (plan.cluster or {}).get("device")
    if not why or (not roles and not remedies):
        why.append(f"under the cost model ({'the ' + device if device else 'its devices'}"
                   f"{', the default cluster' if (plan.cluster or {}).get('spec', '').startswith('h100') else ''}) "
                   f"no sharding pays for its communication at this size (compute {plan.cost.compute_s * 1e3:.3g} ms "
                   "per step)")
        axis = next((a for a, n in big if not batch or batch >= n), None)
        if axis is not None and not roles:
            remedies.append(f"axis_roles={{'{axis}': 'ddp'}} (CLI: --roles {axis}=ddp) to force data parallelism "
                            "(not for a forward that pairs samples across the batch, e.g. an in-batch contrastive "
                            "loss: compute that loss outside the model)")
        if not (plan.cluster or {}).get("spec", "").endswith(".json"):  # not already a calibration profile
            remedies.append("a cluster that describes the devices you run on (CPU ranks: cluster='profile.json' "
                            "from `parallelizer calibrate`)")
    return (f"no parallelism: every op and parameter is Replicate on all {plan.mesh.world_size} devices of "
            f"mesh {plan.mesh}, so each device computes the whole step (the ranks repeat the same work; the "
            f"estimated time is one device's). Why: {'; '.join(why)}. Remedies: fewer devices, "
            f"{', '.join(remedies)}.".replace(", .", "."))


def notes(plan: Plan) -> list[str]:
    """What a reader should see first, derived from the plan (not stored): a plan on several devices that
    uses no parallelism at all; ops without a sharding rule (run replicated), axis roles a parameter could
    not honour and blocks that could not be recomputed (`fallbacks`); activations gathered over a
    "ddp"/"fsdp" axis because the op reading them has no strategy that keeps them sharded there (it runs on
    the whole batch); values gathered whole that are large; a solve stopped by its time limit."""
    idle = idle_axes(plan)
    roles = {a: r for a, r in plan.config.get("axis_roles") or []}
    if shards_nothing(plan):
        return [_no_parallelism_note(plan, roles)]
    notes = [_idle_axis_note(plan, a, idle) for a in idle]
    no_rule = sorted({f.op for f in plan.fallbacks if f.reason.startswith("no sharding rule")})
    if no_rule:
        notes.append(f"{len([f for f in plan.fallbacks if f.reason.startswith('no sharding rule')])} op(s) have "
                     f"no sharding rule and run replicated: {', '.join(no_rule)} (see fallbacks)")
    role_fallbacks = [f for f in plan.fallbacks if f.reason.startswith("axis roles")]
    if role_fallbacks:
        notes.append(f"the axis roles could not be honoured for {len(role_fallbacks)} parameter(s) (see fallbacks)")
    kept = [f for f in plan.fallbacks if f.reason.startswith("recompute:")]
    if kept:
        notes.append(f"{len(kept)} block(s) are not recomputed: their forward writes state in place "
                     "(see fallbacks)")
    data = [a for a, r in roles.items() if r in ("ddp", "fsdp")]
    params = {ph for p in plan.params.values() for ph in p.placeholders}
    moved = sorted({plan.nodes[e.dst].op for e in plan.edges if e.src not in params and e.dst != "output"
                    for s in e.steps if s.kind in ("all_gather", "all_to_all") and s.mesh_axis in data})
    if moved:
        notes.append(f"under the axis roles {roles} these ops gather or re-shard their input over {', '.join(data)} "
                     f"(no strategy of theirs keeps it sharded along the batch there): {', '.join(moved)}")
    notes += _large_gather_notes(plan)
    if not plan.solver.optimal:
        notes.append(_unproven_note(plan))
    return notes


def _unproven_note(plan: Plan) -> str:
    """The note of a plan the solver did not prove optimal: it stopped at its wall-clock limit (`time_limit_s`)
    with the best plan found so far, which depends on how fast the machine was at the time (round 17: a tight
    budget's plan of a 4-layer GPT on dp=2 x tp=2 came out with every block alike under a load of 20 on 2 cores
    and with blocks differing idle), so the same inputs can give another plan elsewhere (DESIGN.md rule 6
    holds for proven optima only)."""
    s = plan.solver
    gap = "" if s.gap is None else f" {s.gap:.2%} from the solver's bound"
    spent = "" if s.time_s is None else f" after {s.time_s:.0f} s"
    return (f"not proven optimal: the {s.solver} solver stopped at its time limit{spent} with the best plan found "
            f"so far{gap}; a plan cut off by a wall-clock limit depends on the machine's speed and load, so the "
            "same model and options can give another plan on another run. Remedy: a larger time_limit_s (CLI "
            "--time-limit) until the solver reports optimal")


def _large_gather_notes(plan: Plan) -> list[str]:
    """Values of at least LARGE_GATHER_BYTES gathered (or all-reduced from a Partial) whole over a mesh axis to
    be returned by the model or to feed a loss op (a language model's logits, vocab-sharded by a column-parallel lm_head): the bytes per
    step and how to avoid it. The loss fused into the traced graph runs vocab-parallel (no gather); a loss
    computed outside the model on returned logits needs them whole on every rank."""
    losses = {n for n, x in plan.nodes.items() if any(k in x.op for k in _LOSS_OPS)}
    has_loss = any(any(k in x.op for k in ("cross_entropy", "nll_loss")) and x.inputs
                   and any(placement_str(pl) != "R" for pl in Layout.parse(x.inputs[0]).placements)
                   for x in plan.nodes.values())  # a loss in the graph that runs on the shards
    notes = []
    m = plan.pipeline.microbatches if plan.pipeline is not None else 0
    per = f"per microbatch, {m} per step" if m else "per step"  # a pipeline plan's graph is one microbatch
    where = "of the last stage " if m else ""
    returned = sorted((e for e in plan.edges if e.dst == "output"), key=lambda e: e.index)
    read = set(step_reads([(e.src, tuple(e.shape), getattr(torch, e.dtype, torch.float32)) for e in returned])
               if m else (e.src for e in returned))  # a pipeline's last stage returns only what the step reads
    for e in plan.edges:
        if (e.dst != "output" or e.src not in read) and e.dst not in losses:
            continue
        moved = [s for s in e.steps if s.kind in ("all_gather", "all_to_all", "all_reduce") and s.mesh_axis in
                 plan.mesh.axis_names and plan.mesh.size(s.mesh_axis) > 1]
        nbytes = sum(s.nbytes or 0 for s in moved)
        if nbytes < LARGE_GATHER_BYTES:
            continue
        how = "summed (all-reduce of a Partial)" if all(s.kind == "all_reduce" for s in moved) else "gathered"
        held = local_shape(tuple(e.shape), Layout.parse(e.dst_layout), plan.mesh)  # what a rank then holds
        part = "all of it" if held == tuple(e.shape) else f"its {e.dst_layout} shard {held}"
        what = (f"{e.src} {tuple(e.shape)} {e.dtype} ({e.src_layout}) is {how} whole over "
                f"{', '.join(sorted({s.mesh_axis for s in moved}))} ({format_bytes(nbytes)} {per}, forward; "
                f"every rank {where}then holds {part}: {_whole_text(plan, held, e.dtype, e.dst)})")
        if e.dst == "output" and has_loss:
            hint = ("because the model returns it beside its loss, which the traced graph already computes on "
                    "the shards (e.g. vocab-parallel cross-entropy). Remedy: if you do not read it, return only the "
                    "loss (a wrapper module whose forward returns `out.loss`)")
        elif e.dst == "output":
            hint = ("to be returned: a loss computed outside the model on it needs it whole. Remedy: put the "
                    "loss into the traced graph (transformers: pass labels= in example_kwargs and to pm(...)), "
                    "which runs vocab-parallel cross-entropy on the shards, and return only the loss")
        else:
            hint = (f"to feed {plan.nodes[e.dst].op}, whose strategy here needs it whole (vocab-parallel "
                    "cross-entropy applies to a cross-entropy / nll loss over the sharded dim)")
        notes.append(f"large gather: {what} {hint}")
    return notes


def _whole_text(plan: Plan, shape, dtype: str, dst: str) -> str:
    """The bytes a rank holds of a gathered value (`shape`: its local shape there; before round 16 the global
    one, so a value gathered over tp but still sharded over dp was said to be held whole, 8x its bytes). A returned one is counted in the memory per device ("outputs",
    `problem.returned_bytes`); in a plan made before that was counted (no "outputs" kind) it was not, and the
    text says what a device then needs against the budget. A value fed to a loss is priced as that op's
    input in its layout (what the loss saves for backward is in "activations"): its bytes only."""
    itemsize = getattr(torch, str(dtype).removeprefix("torch."), torch.float32).itemsize
    whole = math.prod(shape) * itemsize
    mem, budget = plan.cost.memory_bytes, plan.config.get("memory_budget_bytes")
    if dst != "output":
        return format_bytes(whole)
    if "outputs" in mem:
        return (f"{format_bytes(whole)}, counted in the plan's memory per device as outputs"
                + (" on the last stage's ranks" if plan.pipeline is not None else ""))
    text = f"{format_bytes(whole)}, not counted in this plan's memory per device (made before outputs were)"
    if "total" in mem:
        need = mem["total"] + mem.get("reserve", 0) + whole
        text += f" (with it {format_bytes(need)} per device, reserve included"
        text += (f", over the budget of {format_bytes(budget)})" if budget and need > budget else ")")
    return text
