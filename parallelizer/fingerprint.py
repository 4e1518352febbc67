"""Fingerprint of a traced graph, and the check that a `Plan` was made for a given model and mesh.

A fingerprint (stored in `Plan.fingerprint`, JSON) has two sha256 digests of canonical strings and a
readable summary, so that a mismatch can say WHAT differs, not only that something does:

  * `sha256`: every node in graph order (name, op, output shapes and dtypes), every parameter/buffer
    (canonical FQN, shape, dtype), every user input (name, shape, dtype) and the value of every constant
    (non-tensor) input. Equal digests = same graph.
  * `structure_sha256`: the same without shapes and dtypes (node names, ops, parameter FQNs). Node names
    come from torch.export and depend only on the model's structure, so a plan made for a wide config
    applies to a narrow config of the same structure (used by `parallelizer rehearse` at reduced width).
  * `summary`: node count, op counts, input and parameter shapes/dtypes, how many node outputs have each
    dtype, the device type traced on ("meta" for the CLI), and (when there are any) the constant inputs' values
    as `repr` strings. Normalisation makes a model's graph the same on every device (`tracer/device_free.py`);
    what stays different is the model's own code branching on the device, which the dtype counts and devices
    then name.

`check_plan(plan, traced, mesh)` raises `PlanMismatchError` listing the differences, e.g.
"parameter h.0.c_fc.weight: plan has shape (2048, 8192), model has (1024, 4096)" or
"mesh: plan (dp=2, tp=4), requested (dp=8)".
"""
from __future__ import annotations

import hashlib
from collections import Counter

from .core.mesh import MeshSpec
from .errors import PlanMismatchError, PlanValidationError
from .tracer import TracedGraph

FINGERPRINT_VERSION = 2
"""2: traces made device-independent (`tracer/device_free.py`: views as reshapes, op nodes renamed in graph
order), summary with dtype counts and device. A version-1 plan names another spelling of the same graph."""
_MAX_LISTED = 12  # differences listed in one error message


def graph_fingerprint(traced: TracedGraph) -> dict:
    """The fingerprint dict of `traced` (module docstring); deterministic, JSON-ready."""
    full, structure = [], []
    for n in traced.nodes.values():
        full.append(f"node {n.name} {n.op_name} {' '.join(map(str, n.outputs))}")
        structure.append(f"node {n.name} {n.op_name}")
    params = {}
    for p in traced.parameters.values():
        params[p.fqn] = {"shape": list(p.shape), "dtype": dtype_name(p.dtype)}
        kind = "buffer" if p.is_buffer else "param"
        full.append(f"{kind} {p.fqn} {list(p.shape)} {dtype_name(p.dtype)}")
        structure.append(f"{kind} {p.fqn}")
    inputs = {}
    for name in traced.input_names:
        outs = traced.nodes[name].outputs
        if outs:
            inputs[name] = {"shape": list(outs[0].shape), "dtype": dtype_name(outs[0].dtype)}
            full.append(f"input {name} {list(outs[0].shape)} {dtype_name(outs[0].dtype)}")
        structure.append(f"input {name}")
    constants = {name: repr(value) for name, value in traced.constant_inputs.items()}
    full += [f"constant {name} {value}" for name, value in constants.items()]
    summary = {"num_nodes": len(traced.nodes), "ops": dict(sorted(traced.op_counts().items())),
               "inputs": inputs, "params": params, "dtypes": _dtype_counts(traced)}
    device = traced_device(traced)
    if device is not None:
        summary["device"] = device
    if constants:
        summary["constants"] = constants
    return {
        "version": FINGERPRINT_VERSION,
        "sha256": _sha("\n".join(full)),
        "structure_sha256": _sha("\n".join(structure)),
        "summary": summary,
    }


def check_plan(plan, traced: TracedGraph | None = None, mesh: MeshSpec | dict | None = None, *,
               structure_only: bool = False) -> None:
    """Check that `plan` was made for `traced` (and `mesh`); return None when it was.

    Args:
        plan: a `parallelizer.Plan`.
        traced: the model's `TracedGraph` (None: skip the graph check).
        mesh: the requested mesh, a `MeshSpec` or {"dp": 2, "tp": 4} (None: skip the mesh check).
        structure_only: compare node names, ops and parameter FQNs only, not shapes (a plan applied to a
            narrower config of the same structure).
    Raises:
        PlanMismatchError: listing each difference (mesh, parameters, inputs, op counts, nodes) and the
            remedy (re-plan for this model and mesh, or pass the matching model/mesh).
        PlanValidationError: a strategy or stored layout the planner could not have chosen (a hand edit).
        PipelineError: a pipeline plan's stages whose blocks are not the model's in order, or whose
            first / last nodes are not the ones their blocks give (`runtime.stage_cut.plan_cut`).
    """
    diffs: list[str] = []
    if mesh is not None:
        mesh = MeshSpec.of(mesh)
        if mesh != plan.mesh:
            diffs.append(f"mesh: plan {plan.mesh}, requested {mesh}")
    if traced is not None:
        diffs += _graph_diffs(plan, traced, structure_only)
    if diffs:
        listed = diffs[:_MAX_LISTED] + ([f"... {len(diffs) - _MAX_LISTED} more"] if len(diffs) > _MAX_LISTED else [])
        if any(d.startswith("device:") for d in diffs):
            remedy = ("plan the model as built on the device type it runs on (`parallelizer.plan(parallelizer."
                      "trace(model, inputs), mesh)`, then `plan.save(...)`); `parallelizer plan` traces on meta")
        else:
            remedy = ("re-plan for this model and mesh (`parallelizer.plan` / `parallelizer plan`), or apply the plan "
                      "to the model, inputs and mesh it was made for")
        raise PlanMismatchError("the plan was made for another model, input shapes or mesh:\n  " + "\n  ".join(listed)
                                + f"\nRemedy: {remedy}.")
    if traced is not None and not structure_only:
        _check_strategies(plan, traced)
        _check_edges(plan, traced)
    if traced is not None and plan.pipeline is not None:  # a hand-edited cut: its blocks and nodes against the model
        from .runtime.stage_cut import plan_cut  # (before round 23 only `rehearse` and the ranks checked it)
        plan_cut(traced, plan.pipeline.stages)


def _check_strategies(plan, traced: TracedGraph) -> None:
    """Raise `PlanValidationError` when a node's strategy or a stored layout is not one the planner could have
    chosen for `traced` (`planner.strategies.unplannable_strategies`: a hand-edited plan file)."""
    from .config import PlanConfig
    from .planner.strategies import unplannable_strategies

    config = PlanConfig.from_record(plan.config)
    problems = unplannable_strategies(traced, plan.mesh, config, plan.nodes)
    if problems:
        listed = problems[:_MAX_LISTED] + ([f"... {len(problems) - _MAX_LISTED} more"]
                                           if len(problems) > _MAX_LISTED else [])
        raise PlanValidationError(
            f"the plan gives layouts the planner could not have chosen for this model (no sharding rule, or the "
            f"plan's axis roles {dict(config.axis_roles)}, allows them: was it edited by hand?); run as written, its "
            "program may compute other numbers than the model on one device:\n  " + "\n  ".join(listed)
            + "\nRemedy: re-create the plan with `parallelizer plan` (or `parallelizer.plan` + Plan.save); to steer "
              "the planner, give axis roles (--roles) or a memory budget instead of editing layouts.")


def _check_edges(plan, traced: TracedGraph) -> None:
    """Raise `PlanValidationError` when an edge records another shape or dtype than the tensor `traced` carries
    there (`planner.strategies.tensor_inputs`, as the planner recorded it): a hand edit the op counts and strategies
    do not show. The rank programs read the traced graph, so such an edit changed only the step bytes `show`
    prints and the plan's own arithmetic over its edges (round 25 new-user trial: (8, 16, 64) edited to
    (9, 16, 64), float32 to float16, loaded silently)."""
    from .planner.strategies import tensor_inputs

    problems = []
    for e in plan.edges:
        info = traced.nodes.get(e.dst)
        carried = tensor_inputs(traced, info) if info is not None else ()
        if e.index >= len(carried) or carried[e.index].producer != e.src:
            continue  # another graph: `_graph_diffs` names it
        want = carried[e.index]
        dtype = dtype_name(want.dtype)
        if tuple(e.shape) != tuple(want.shape) or e.dtype != dtype:
            problems.append(f"edge {e.src} -> {e.dst} (input {e.index}): the plan records {tuple(e.shape)} {e.dtype}, "
                            f"the model carries {tuple(want.shape)} {dtype}")
    if problems:
        listed = problems[:_MAX_LISTED] + ([f"... {len(problems) - _MAX_LISTED} more"]
                                           if len(problems) > _MAX_LISTED else [])
        raise PlanValidationError("the plan's edges record tensors this model does not carry there (was it edited "
                                  "by hand?):\n  " + "\n  ".join(listed) + "\nRemedy: re-create the plan with "
                                  "`parallelizer plan` (or `parallelizer.plan` + Plan.save); a plan's shapes and dtypes "
                                  "are the traced model's, not settings")


def _graph_diffs(plan, traced: TracedGraph, structure_only: bool) -> list[str]:
    """Readable differences between the plan's recorded graph and `traced` (empty when they agree)."""
    mine = graph_fingerprint(traced)
    theirs = plan.fingerprint or _fingerprint_from_plan(plan)
    key = "structure_sha256" if structure_only else "sha256"
    if theirs.get(key) is not None and theirs[key] == mine[key]:
        return []
    diffs = []
    a, b = theirs.get("summary", {}), mine["summary"]
    for kind, pa, pb in (("parameter", a.get("params", {}), b["params"]), ("input", a.get("inputs", {}), b["inputs"])):
        if pa.keys() != pb.keys():
            diffs.append(f"{kind}s: {len(pa)} in the plan, {len(pb)} in the model, {len(pa.keys() & pb.keys())} shared")
        for name in sorted(pa.keys() - pb.keys()):
            diffs.append(f"{kind} {name}: in the plan, not in the model")
        for name in sorted(pb.keys() - pa.keys()):
            diffs.append(f"{kind} {name}: in the model, not in the plan")
        if not structure_only:
            for name in sorted(pa.keys() & pb.keys()):
                for field in ("shape", "dtype"):
                    x, y = pa[name].get(field), pb[name][field]
                    if x is not None and x != y:
                        show = (lambda v: str(tuple(v))) if field == "shape" else str
                        diffs.append(f"{kind} {name}: plan has {field} {show(x)}, model has {show(y)}")
    if not structure_only:
        consts_a, consts_b = a.get("constants", {}), b.get("constants", {})
        for name in sorted(consts_a.keys() | consts_b.keys()):
            if consts_a.get(name) != consts_b.get(name):
                diffs.append(f"constant input {name}: plan has {consts_a.get(name, 'none')}, model has "
                             f"{consts_b.get(name, 'none')}")
    ops_a, ops_b = Counter(a.get("ops", {})), Counter(b["ops"])
    for op in sorted(ops_a.keys() | ops_b.keys()):
        if ops_a[op] != ops_b[op]:
            diffs.append(f"op {op}: plan has {ops_a[op]} nodes, model has {ops_b[op]}")
    plan_nodes, model_nodes = set(plan.nodes), set(traced.nodes)
    only_plan, only_model = sorted(plan_nodes - model_nodes), sorted(model_nodes - plan_nodes)
    if only_plan:
        diffs.append(f"nodes only in the plan ({len(only_plan)}): {', '.join(only_plan[:5])}")
    if only_model and plan.fingerprint:
        diffs.append(f"nodes only in the model ({len(only_model)}): {', '.join(only_model[:5])}")
    for name in sorted(plan_nodes & model_nodes):
        if plan.nodes[name].op != traced.nodes[name].op_name:
            diffs.append(f"node {name}: plan has op {plan.nodes[name].op}, model has {traced.nodes[name].op_name}")
    if diffs and theirs.get("version", FINGERPRINT_VERSION) < FINGERPRINT_VERSION:
        diffs.insert(0, f"the plan was made by an earlier version of this toolkit (fingerprint version "
                        f"{theirs['version']}, now {FINGERPRINT_VERSION}: tracing now spells views, constants and "
                        "node names alike on every device); re-plan to apply it")
    if not diffs and theirs.get(key) is not None:
        diffs += _device_diffs(a, b)
    if not diffs and theirs.get(key) is not None:
        diffs.append(f"graph {key} differs (plan {theirs[key][:12]}..., model {mine[key][:12]}...): same "
                     "parameters, inputs and ops, so some intermediate shape or dtype differs")
    return diffs


def traced_device(traced: TracedGraph) -> str | None:
    """The device type ("meta", "cpu", "cuda") of the first parameter or input tensor the graph was traced
    with; None when it has no tensor placeholder."""
    for node in traced.graph_module.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if hasattr(val, "device"):
            return val.device.type
    return None


def _dtype_counts(traced: TracedGraph) -> dict[str, int]:
    """How many node outputs have each dtype, e.g. {"float32": 120, "int64": 4}."""
    counts = Counter(dtype_name(t.dtype) for n in traced.nodes.values() for t in n.outputs)
    return dict(sorted(counts.items()))


def _device_diffs(a: dict, b: dict) -> list[str]:
    """The dtype-count differences of two summaries, and the device types when they differ (graphs that agree
    on nodes, ops, parameters and inputs)."""
    diffs = []
    dtypes_a, dtypes_b = Counter(a.get("dtypes", {})), Counter(b.get("dtypes", {}))
    if dtypes_a:
        for dtype in sorted(dtypes_a.keys() | dtypes_b.keys()):
            if dtypes_a[dtype] != dtypes_b[dtype]:
                diffs.append(f"node outputs of dtype {dtype}: plan has {dtypes_a[dtype]}, model has {dtypes_b[dtype]}")
    if a.get("device") and b.get("device") and a["device"] != b["device"]:
        diffs.append(f"device: the plan's model was traced on {a['device']}, this one on {b['device']}; code that "
                     "branches on the device type traces another graph (transformers' MoE counts tokens per expert "
                     "with histc in float32 on CPU, int32 elsewhere)")
    return diffs


def _fingerprint_from_plan(plan) -> dict:
    """What a plan without a fingerprint (made by `parallelizer.planner.plan`) still tells: parameter and
    input shapes. No digests, so only these are compared."""
    params = {fqn: {"shape": list(p.shape)} for fqn, p in plan.params.items()}
    inputs = {n: {"shape": list(s)} for n, s in plan.model.get("inputs", {}).items()}
    ops = Counter(n.op for n in plan.nodes.values() if n.op not in ("placeholder", "output"))
    return {"summary": {"params": params, "inputs": inputs, "ops": dict(ops)}}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def dtype_name(dtype) -> str:
    """torch.float32 -> "float32", the form fingerprints and plans store (`getattr(torch, name)` reads it back)."""
    return str(dtype).removeprefix("torch.")
