"""`Plan`: the planner's answer, read by the rewriter, the CLI, notebooks and the JSON export.

Contents: the mesh; per node its strategy (input layouts and output layout as strings, "S(0)R"); per
parameter its stored layout; per edge (producer -> input k of consumer) the tensor it carries (shape, dtype,
whether it has a gradient) and the redistribution steps from `core.redistribute.edge_steps` (the rewriter
emits exactly these; `derive_edge` is the one place a plan's steps are made); the estimated cost breakdown
(compute seconds, seconds per collective kind, memory bytes per device by category); the solver report;
fallbacks (nodes replicated for lack of a rule; ops priced by bytes only because their FLOPs could not be
counted on meta tensors).

A pipeline plan (a mesh with a "pp" axis) has `pipeline` (`planner.stages.PipelineSection`: pp, schedule,
microbatches, stages) and its `mesh` is the intra-stage mesh (the full mesh without pp) that every stage's
program is sharded over; the full mesh is `pipeline.mesh`. Its nodes' strategies come from one intra-stage
solve per distinct stage (`planner.stage_layouts`; `pipeline.stages[k].layout` numbers the one stage k uses).

In memory every node, parameter and edge is spelled out. The JSON (format 4, `planner/plan_codec.py`)
stores what was decided once: per repeated-block position its strategy (with per-member exceptions),
parameter stored layouts folded per block, the nodes outside blocks and the tensors each node reads; edges,
steps, local shapes and parameter placeholders are derived on load and checked. `to_json()` is
deterministic: sorted keys, one decision per line, floats rounded to 10 significant digits, and wall-clock
times left out unless asked for, so the same inputs give byte-identical JSON (DESIGN.md rule 6).
`save`/`load` write and read that JSON; `load` (and `from_json`) validate it against the versioned JSON
Schema shipped as `parallelizer/plan_schema.json` and never execute code (no pickle).
`fingerprint` (from `parallelizer.fingerprint`) identifies the traced graph the plan was made for, and
`cluster` describes the hardware it was priced on; `parallelizer.plan` fills both.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

import torch

from ..core.layout import Layout, local_shape, placement_str
from ..core.mesh import MeshSpec
from ..errors import format_bytes
from ..core.redistribute import COLLECTIVE_KINDS, Step, edge_steps, grad_partial_axes
from .stages import PipelineSection

# 2: + fingerprint, cluster; 3: compact (blocks folded, edges derived on load); 4: per-stage layouts (pipeline
# stages' "layout", blocks' "layouts"; format 3 is still read). Schema: parallelizer/plan_schema.json
PLAN_FORMAT_VERSION = 4


@dataclass(frozen=True, slots=True)
class NodePlan:
    """Strategy of one node: op name, layouts of its tensor inputs (in `EdgePlan.index` order), output layout
    (None for the graph output). For parameter placeholders the output is the stored layout."""

    op: str
    inputs: tuple[str, ...]
    output: str | None

    @property
    def strategy(self) -> str:
        """"inputs -> output", e.g. "S(0)R RS(0) -> S(0)S(2)" ("RR -> None" for the graph output)."""
        return f"{' '.join(self.inputs)} -> {self.output}".lstrip()

    @classmethod
    def from_strategy(cls, op: str, strategy: str) -> "NodePlan":
        """Inverse of `strategy`. Raises ValueError when `strategy` has no " -> "."""
        inputs, sep, output = strategy.partition("->")
        if not sep:
            raise ValueError(f"strategy {strategy!r} of op {op} has no '->'; write it as 'IN IN -> OUT'")
        output = output.strip()
        return cls(op, tuple(inputs.split()), None if output == "None" else output)


@dataclass(frozen=True, slots=True)
class EdgePlan:
    """One use of a tensor: producer `src`, consumer `dst` (its tensor input number `index`), the layouts at
    both ends, and the steps between them (empty when the layouts agree and no gradient sync is needed).
    `shape` (global, elements per dim), `dtype` ("float32") and `requires_grad` describe the tensor carried;
    with the layouts they determine `steps` (`derive_edge`)."""

    src: str
    dst: str
    index: int
    src_layout: str
    dst_layout: str
    steps: tuple[Step, ...]
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool


def derive_edge(mesh: MeshSpec, src: str, dst: str, index: int, src_layout: str, consumer: NodePlan,
                shape: tuple[int, ...], dtype: str, requires_grad: bool, is_parameter: bool) -> EdgePlan:
    """The edge into input `index` of `consumer` (node `dst`) with its steps from `core.redistribute.edge_steps`:
    the one place the planner and `Plan.from_json` make a plan's steps (DESIGN.md rule 1).

    Args:
        src_layout: the producer's output layout; consumer: the consumer's strategy (its input `index` layout
            and its output layout decide the gradient-sync axes, `grad_partial_axes`).
        shape, dtype: the tensor's global shape and torch dtype name ("float32"); requires_grad: whether a
            gradient flows back through this use; is_parameter: the producer is a stored parameter (FSDP
            all-gathers are `regather` steps).
    Raises:
        ImpossibleRedistributionError: the layout change has no collective (e.g. Replicate -> Partial).
        ValueError: a layout string does not parse, or `dtype` is not a torch dtype name.
    """
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"{dtype!r} is not a torch dtype name (e.g. 'float32', 'bfloat16', 'int64')")
    steps = _derived_steps(mesh, src_layout, consumer.inputs[index], consumer.output, tuple(shape),
                           torch_dtype.itemsize, requires_grad, is_parameter)
    return EdgePlan(src, dst, index, src_layout, consumer.inputs[index], steps, tuple(shape), dtype, requires_grad)


# Distinct edges (layouts, shape, dtype size, gradient facts, mesh) whose steps are kept: a plan has a few hundred
# (the instances of a repeated block share theirs); the bound only keeps a long-lived process from growing.
_STEPS_CACHE = 16384


@functools.lru_cache(maxsize=_STEPS_CACHE)
def _derived_steps(mesh: MeshSpec, src_layout: str, dst_layout: str, out_layout: str | None, shape: tuple[int, ...],
                   itemsize: int, requires_grad: bool, is_parameter: bool) -> tuple[Step, ...]:
    """`derive_edge`'s steps, memoised on everything they depend on (its arguments; Steps are immutable)."""
    dst = Layout.parse(dst_layout)
    out = None if out_layout is None else Layout.parse(out_layout)
    return edge_steps(Layout.parse(src_layout), dst, shape, mesh, itemsize=itemsize,
                      grad_partial_axes=grad_partial_axes(dst, out, mesh), requires_grad=requires_grad,
                      is_parameter=is_parameter)


@dataclass(frozen=True, slots=True)
class ParamPlan:
    """Stored layout of one parameter (tied aliases share it); `local_shape` is each rank's shard (the
    largest, `core.layout.local_shape`); `dtype` is the torch dtype name ("float32")."""

    fqn: str
    aliases: tuple[str, ...]
    placeholders: tuple[str, ...]
    shape: tuple[int, ...]
    stored: str
    local_shape: tuple[int, ...]
    is_buffer: bool
    dtype: str


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """Estimated step time (seconds) and per-device memory (bytes).

    comm_s: seconds per collective kind, forward and backward together (keys: COLLECTIVE_KINDS).
    memory_bytes: "params", "grads", "optimizer", "activations", "outputs" (the returned values, whole on every
        rank; absent in plans made before it was counted), "buffers", "total".
    """

    compute_s: float
    comm_s: dict[str, float]
    memory_bytes: dict[str, int]

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.comm_s.values())


_MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "outputs", "buffers", "total", "reserve")
# A gathered value at least this large gets a note (`Plan._large_gather_notes`): a GPT-2 small batch of 8 x 1024
# tokens has 1.6 GB of fp32 logits.
def step_reads(outputs: list[tuple[str, tuple[int, ...], torch.dtype]]) -> tuple[str, ...]:
    """Of the model's outputs (name, global shape, dtype; in output order), the names a pipeline step reads when
    no loss_fn is given: the first alone when it is a 0-d floating value (the model's own loss), else all. The last
    stage of a pipeline returns these (`runtime.pipeline.step_returns`)."""
    if outputs and outputs[0][1] == () and outputs[0][2].is_floating_point:
        return (outputs[0][0],)
    return tuple(name for name, _, _ in outputs)


LARGE_GATHER_BYTES = 64 * 2**20
_LOSS_OPS = ("cross_entropy", "nll_loss", "log_softmax", "_softmax", "kl_div", "binary_cross_entropy")

_PRECISION_TEXT = {"bf16": "bf16 params and activations, fp32 main weights and gradients (18 B/param with Adam)",
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


def memory_rows(plan: "Plan") -> list[tuple[str, int]]:
    """Per-device memory by kind, in reading order: params, grads, optimizer, activations, outputs, buffers, total (the
    plan's tensors), reserve (kept out of the plan: fragmentation, workspaces, communication buffers), then
    the budget the total plus reserve must fit in. Kinds the plan does not record are left out."""
    mem = plan.cost.memory_bytes
    rows = [(k, mem[k]) for k in _MEMORY_KINDS if k in mem]
    rows += [(k, v) for k, v in mem.items() if k not in _MEMORY_KINDS]
    if plan.config.get("memory_budget_bytes"):
        rows.append(("budget", plan.config["memory_budget_bytes"]))
    return rows


def search_rows(plan: "Plan") -> list[tuple[str, str]]:
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
    return rows


@dataclass(frozen=True, slots=True)
class SolverReport:
    """How the ILP went. `optimal` only when the solver proved it (see `planner.ilp`)."""

    solver: str
    status: str
    optimal: bool
    gap: float | None
    num_variables: int
    num_binary: int
    num_constraints: int
    num_groups: int
    objective_s: float
    time_s: float | None = None


@dataclass(frozen=True, slots=True)
class Fallback:
    """A node replicated because no rule covers it (DESIGN.md rule 5: recorded, never silent)."""

    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class Plan:
    """The plan (module docstring). Build it with `parallelizer.plan`; load it with `Plan.from_json`."""

    mesh: MeshSpec
    nodes: dict[str, NodePlan]
    params: dict[str, ParamPlan]
    edges: tuple[EdgePlan, ...]
    cost: CostBreakdown
    solver: SolverReport
    fallbacks: tuple[Fallback, ...] = ()
    model: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    fingerprint: dict = field(default_factory=dict)  # parallelizer.fingerprint.graph_fingerprint(traced)
    cluster: dict = field(default_factory=dict)  # parallelizer.api.describe_cluster(cluster)
    # pipeline parallelism (`planner.stages`): `mesh` is then the intra-stage mesh, the full one is pipeline.mesh
    pipeline: "PipelineSection | None" = None
    # activation recomputation (`planner.recompute`): region -> "selective" | "full"; absent = none
    recompute: dict[str, str] = field(default_factory=dict)
    # data-parallel gradient compression chosen (`planner.compression` record); {} = option "none"
    compression: dict = field(default_factory=dict)
    # hierarchical collectives (`costs.Pricer.hierarchical_record`): mesh axis -> {"devices_per_node",
    # "ranks_per_node", "num_nodes", "bytes": {kind: [[lo, hi or None], ...]}}; absent = every collective flat
    hierarchical: dict[str, dict] = field(default_factory=dict)

    # --- queries ------------------------------------------------------------------------------------
    def edges_into(self, node: str) -> list[EdgePlan]:
        return [e for e in self.edges if e.dst == node]

    def steps(self, kind: str | None = None) -> list[tuple[EdgePlan, Step]]:
        """All (edge, step) pairs, optionally of one step kind."""
        return [(e, s) for e in self.edges for s in e.steps if kind is None or s.kind == kind]

    def trained_dtypes(self) -> tuple[str, ...]:
        """The torch dtype names of the plan's floating parameters (not buffers), sorted: what the program runs
        in unless the plan records an autocast recipe (`precision_text`)."""
        return tuple(sorted({p.dtype for p in self.params.values() if not p.is_buffer
                             and getattr(torch, p.dtype).is_floating_point}))

    def program_steps(self) -> dict[tuple[str, str], int]:
        """(step kind, mesh axis) -> how many steps each rank's emitted forward program holds, as
        `rewriter.apply` emits them (and `RankProgram.collectives` / `rehearse` count them per kind): one per
        (value, target layout, gradient axes), however many uses share it (`steps()` has one per use: a tied
        embedding and lm_head gathered alike count twice there, once here), and user inputs, which arrive whole,
        sliced to the rank's part from Replicate (no edge of the plan holds that slice: the plan's input layout is
        already the sliced one), with the gradient steps a floating input needs should it require grad at call
        time (they run in backward only then). Each step's backward conjugate runs in backward and is not counted apart;
        local_slice moves no data; the gradient all-reduces of replicated parameters are bucketed at run time."""
        inputs = set(self.model.get("inputs") or {})
        counts: dict[tuple[str, str], int] = {}
        seen = set()
        for e in self.edges:
            out = None if e.dst == "output" else self.nodes[e.dst].output
            grad_axes = () if out is None else grad_partial_axes(Layout.parse(e.dst_layout), Layout.parse(out),
                                                                   self.mesh)
            key = (e.src, e.dst_layout, grad_axes)
            if key in seen:
                continue
            seen.add(key)
            steps = e.steps
            if e.src in inputs:  # arrives whole; a floating one may require grad at call time (rewriter)
                dtype = getattr(torch, e.dtype)
                steps = _derived_steps(self.mesh, str(Layout.replicate(self.mesh.ndim)), e.dst_layout, out,
                                       tuple(e.shape), dtype.itemsize, dtype.is_floating_point or dtype.is_complex,
                                       False)
            for st in steps:
                if self.mesh.size(st.mesh_axis) > 1:
                    counts[(st.kind, st.mesh_axis)] = counts.get((st.kind, st.mesh_axis), 0) + 1
        return dict(sorted(counts.items()))

    # --- JSON ---------------------------------------------------------------------------------------
    def to_dict(self, include_timing: bool = False) -> dict:
        """The JSON document (format 4, `planner.plan_codec`): decisions stored once, derivable parts left out.

        Raises:
            PlanValidationError: the plan's parts disagree (e.g. a parameter placeholder whose strategy is
                not the parameter's stored layout), so the compact form could not be loaded back as it is.
        """
        from .plan_codec import encode
        solver = asdict(self.solver)
        if not include_timing:
            solver["time_s"] = None
        return _round({
            "format_version": PLAN_FORMAT_VERSION,
            "mesh": self.mesh.to_dict(),
            "config": self.config,
            "cost": _cost_dict(self.cost),
            "solver": solver,
            "fallbacks": [asdict(f) for f in self.fallbacks],
            "cluster": self.cluster,
            **encode(self),
            **({"pipeline": self.pipeline.to_dict()} if self.pipeline is not None else {}),
            **({"recompute": dict(sorted(self.recompute.items()))} if self.recompute else {}),
            **({"compression": dict(self.compression)} if self.compression else {}),
            **({"hierarchical": dict(sorted(self.hierarchical.items()))} if self.hierarchical else {}),
        })

    def to_json(self, include_timing: bool = False) -> str:
        """Deterministic JSON (module docstring) laid out for review: one key per line, sorted; lists of
        scalars on one line; a list of lists (graph rows, block positions, members) one row per line."""
        from .plan_codec import dumps
        return dumps(self.to_dict(include_timing))

    def save(self, path) -> None:
        """Write `to_json()` (deterministic, timing left out) to `path`, with a final newline."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json() + "\n")

    @classmethod
    def load(cls, path, traced=None, mesh=None) -> "Plan":
        """Read a plan written by `save`; with `traced` (and `mesh`), also check it was made for them.

        Raises:
            PlanValidationError: not JSON, not valid against the schema, or derived parts inconsistent
                (names the JSON path).
            PlanMismatchError: `traced`/`mesh` given and they differ from the plan's (says what differs).
        """
        with open(path, encoding="utf-8") as f:
            plan = cls.from_json(f.read(), source=str(path))
        if traced is not None or mesh is not None:
            from ..fingerprint import check_plan
            check_plan(plan, traced, mesh)
        return plan

    @classmethod
    def from_json(cls, text: str, source: str = "plan JSON") -> "Plan":
        """Inverse of `to_json`, after validation against the schema (`parallelizer.plan_io.parse_and_validate`);
        nodes, edges with their steps, parameter placeholders and local shapes are derived (`plan_codec.decode`).

        Raises:
            PlanValidationError: malformed JSON, another format version (re-plan), a schema violation, or
                derived parts that disagree with what is stored (names the field's JSON path, e.g.
                "params/h.0.c_fc.weight/shape/0" or "graph/12").
        """
        from ..plan_io import parse_and_validate
        from .plan_codec import decode
        d = parse_and_validate(text, source)
        mesh = MeshSpec.from_dict(d["mesh"])
        nodes, params, edges, model, fingerprint = decode(d, mesh, source)
        cost = d["cost"]
        return cls(
            mesh=mesh, nodes=nodes, params=params, edges=edges,
            cost=CostBreakdown(cost["compute_s"], cost["comm_s"], cost["memory_bytes"]),
            solver=SolverReport(**d["solver"]),
            fallbacks=tuple(Fallback(**f) for f in d["fallbacks"]),
            model=model, config=d["config"], fingerprint=fingerprint, cluster=d["cluster"],
            pipeline=PipelineSection.from_dict(d["pipeline"]) if "pipeline" in d else None,
            recompute=dict(d.get("recompute", {})), compression=dict(d.get("compression", {})),
            hierarchical=dict(d.get("hierarchical", {})))

    # --- human ---------------------------------------------------------------------------------------
    def idle_axes(self) -> list[str]:
        """Mesh axes of more than one device over which no floating value (an op's input or output, carried by an
        edge) and no floating parameter or buffer is sharded or Partial: the ranks along such an axis all compute
        the same thing (the whole plan, when every such axis is idle). Integer and boolean values (token ids, a
        label shift's `new_zeros`, index arithmetic, masks) are left out: sharding them alone divides no work
        (round 16, r16e: Speech2Text's default plan on dp=2 x tp=4 replicated every op but the labels' int64
        `new_zeros` (8, 32), S(1)S(1), and no "no parallelism" note was given)."""
        def floating(dtype: str) -> bool:
            t = getattr(torch, str(dtype).removeprefix("torch."), None)
            return not isinstance(t, torch.dtype) or t.is_floating_point or t.is_complex
        layouts = {L for e in self.edges if floating(e.dtype) for L in (e.src_layout, e.dst_layout)}
        layouts |= {p.stored for p in self.params.values() if floating(p.dtype)}
        used = set()
        for text in layouts:
            for axis, pl in zip(self.mesh.axis_names, Layout.parse(text).placements):
                if placement_str(pl) != "R":
                    used.add(axis)
        return [a for a, n in zip(self.mesh.axis_names, self.mesh.shape) if n > 1 and a not in used]

    def shards_nothing(self) -> bool:
        """Whether the mesh has devices to share the work but every axis of more than one device is idle
        (`idle_axes`): each device computes the whole step."""
        idle = self.idle_axes()
        return bool(idle) and len(idle) == sum(n > 1 for n in self.mesh.shape)

    def _idle_axis_note(self, axis: str, idle: list[str]) -> str:
        """The note of one idle axis of a plan that uses another axis: its devices folded into the first axis
        in use is the mesh to try instead."""
        n = self.mesh.size(axis)
        busy = next(a for a, k in zip(self.mesh.axis_names, self.mesh.shape) if k > 1 and a not in idle)
        other = {a: k * (n if a == busy else 1) for a, k in zip(self.mesh.axis_names, self.mesh.shape)
                 if a not in idle}
        return (f"axis {axis} ({n} devices) is unused: nothing is sharded over it, so the {n} ranks along it "
                f"compute the same values (each repeats the others' work). Remedies: a mesh without it (e.g. "
                f"{other}), or a role that shards over it (axis_roles={{'{axis}': 'ddp'}}, or 'tp')")

    def _no_parallelism_note(self, roles: dict) -> str:
        """The note of a plan that uses no parallelism on a mesh of several devices, naming why (batch smaller
        than the axes, ops without a sharding rule, axis roles, the cost model) and the remedies that apply."""
        big = [(a, n) for a, n in zip(self.mesh.axis_names, self.mesh.shape) if n > 1]
        bd = dict(tuple(x) for x in self.config.get("batch_dims") or [])
        default_dim = self.config.get("default_batch_dim", 0)
        batch = 0
        for name, shape in (self.model.get("inputs") or {}).items():
            dim = bd.get(name, default_dim)
            if dim is not None and shape and -len(shape) <= dim < len(shape):
                batch = max(batch, shape[dim])
        why, remedies = [], []
        if batch and batch < min(n for _, n in big):
            what = "microbatch" if self.pipeline is not None else "batch"
            why.append(f"the {what} ({batch} sample(s) along the batch dim of the inputs) has fewer samples than "
                       f"any axis has devices ({', '.join(f'{a}={n}' for a, n in big)}), so it cannot be split, "
                       "and no other sharding paid for its communication under the cost model")
            remedies.append(f"fewer, larger microbatches (--microbatches; at least {min(n for _, n in big)} samples "
                            "each)" if self.pipeline is not None else
                            f"a batch of at least {min(n for _, n in big)} samples per step")
        weights = any(len(q.shape) >= 2 and not q.is_buffer for q in self.params.values())
        tp_axis = next((a for a, _ in big if a not in ("dp", "pp")), None)
        if weights and tp_axis is not None and not roles:  # Megatron's remedy needs no samples along the axis
            remedies.append(f"axis_roles={{'{tp_axis}': 'tp'}} (CLI: --roles {tp_axis}=tp) to force tensor "
                            "parallelism (weights sharded over the axis, the batch not split there)")
        ops = [n for n in self.nodes.values() if n.op not in ("placeholder", "output", "get_attr")]
        no_rule = [f for f in self.fallbacks if f.reason.startswith("no sharding rule")]
        if ops and len(no_rule) * 2 >= len(ops):
            why.append(f"{len(no_rule)} of its {len(ops)} ops have no sharding rule and run replicated "
                       f"({', '.join(sorted({f.op for f in no_rule})[:6])}{', ...' if len({f.op for f in no_rule}) > 6 else ''})")
        if roles:
            why.append(f"the axis roles {roles} shard nothing here")
            remedies.append("check the batch and hidden sizes against the mesh")
        device = (self.cluster or {}).get("device")
        if not why or (not roles and not remedies):
            why.append(f"under the cost model ({'the ' + device if device else 'its devices'}"
                       f"{', the default cluster' if (self.cluster or {}).get('spec', '').startswith('h100') else ''}) "
                       f"no sharding pays for its communication at this size (compute {self.cost.compute_s * 1e3:.3g} ms "
                       "per step)")
            axis = next((a for a, n in big if not batch or batch >= n), None)
            if axis is not None and not roles:
                remedies.append(f"axis_roles={{'{axis}': 'ddp'}} (CLI: --roles {axis}=ddp) to force data parallelism "
                                "(not for a forward that pairs samples across the batch, e.g. an in-batch contrastive "
                                "loss: compute that loss outside the model)")
            if not (self.cluster or {}).get("spec", "").endswith(".json"):  # not already a calibration profile
                remedies.append("a cluster that describes the devices you run on (CPU ranks: cluster='profile.json' "
                                "from `parallelizer calibrate`)")
        return (f"no parallelism: every op and parameter is Replicate on all {self.mesh.world_size} devices of "
                f"mesh {self.mesh}, so each device computes the whole step (the ranks repeat the same work; the "
                f"estimated time is one device's). Why: {'; '.join(why)}. Remedies: fewer devices, "
                f"{', '.join(remedies)}.".replace(", .", "."))

    def notes(self) -> list[str]:
        """What a reader should see first, derived from the plan (not stored): a plan on several devices that
        uses no parallelism at all; ops without a sharding rule (run replicated), axis roles a parameter could
        not honour and blocks that could not be recomputed (`fallbacks`); activations gathered over a
        "ddp"/"fsdp" axis because the op reading them has no strategy that keeps them sharded there (it runs on
        the whole batch)."""
        idle = self.idle_axes()
        roles = {a: r for a, r in self.config.get("axis_roles") or []}
        if self.shards_nothing():
            return [self._no_parallelism_note(roles)]
        notes = [self._idle_axis_note(a, idle) for a in idle]
        no_rule = sorted({f.op for f in self.fallbacks if f.reason.startswith("no sharding rule")})
        if no_rule:
            notes.append(f"{len([f for f in self.fallbacks if f.reason.startswith('no sharding rule')])} op(s) have "
                         f"no sharding rule and run replicated: {', '.join(no_rule)} (see fallbacks)")
        role_fallbacks = [f for f in self.fallbacks if f.reason.startswith("axis roles")]
        if role_fallbacks:
            notes.append(f"the axis roles could not be honoured for {len(role_fallbacks)} parameter(s) (see fallbacks)")
        kept = [f for f in self.fallbacks if f.reason.startswith("recompute:")]
        if kept:
            notes.append(f"{len(kept)} block(s) are not recomputed: their forward writes state in place "
                         "(see fallbacks)")
        data = [a for a, r in roles.items() if r in ("ddp", "fsdp")]
        params = {ph for p in self.params.values() for ph in p.placeholders}
        moved = sorted({self.nodes[e.dst].op for e in self.edges if e.src not in params and e.dst != "output"
                        for s in e.steps if s.kind in ("all_gather", "all_to_all") and s.mesh_axis in data})
        if moved:
            notes.append(f"under the axis roles {roles} these ops gather or re-shard their input over {', '.join(data)} "
                         f"(no strategy of theirs keeps it sharded along the batch there): {', '.join(moved)}")
        notes += self._large_gather_notes()
        return notes

    def _large_gather_notes(self) -> list[str]:
        """Values of at least LARGE_GATHER_BYTES gathered (or all-reduced from a Partial) whole over a mesh axis to
        be returned by the model or to feed a loss op (a language model's logits, vocab-sharded by a column-parallel lm_head): the bytes per
        step and how to avoid it. The loss fused into the traced graph runs vocab-parallel (no gather); a loss
        computed outside the model on returned logits needs them whole on every rank."""
        losses = {n for n, x in self.nodes.items() if any(k in x.op for k in _LOSS_OPS)}
        has_loss = any(any(k in x.op for k in ("cross_entropy", "nll_loss")) and x.inputs
                       and any(placement_str(pl) != "R" for pl in Layout.parse(x.inputs[0]).placements)
                       for x in self.nodes.values())  # a loss in the graph that runs on the shards
        notes = []
        m = self.pipeline.microbatches if self.pipeline is not None else 0
        per = f"per microbatch, {m} per step" if m else "per step"  # a pipeline plan's graph is one microbatch
        where = "of the last stage " if m else ""
        returned = sorted((e for e in self.edges if e.dst == "output"), key=lambda e: e.index)
        read = set(step_reads([(e.src, tuple(e.shape), getattr(torch, e.dtype, torch.float32)) for e in returned])
                   if m else (e.src for e in returned))  # a pipeline's last stage returns only what the step reads
        for e in self.edges:
            if (e.dst != "output" or e.src not in read) and e.dst not in losses:
                continue
            moved = [s for s in e.steps if s.kind in ("all_gather", "all_to_all", "all_reduce") and s.mesh_axis in
                     self.mesh.axis_names and self.mesh.size(s.mesh_axis) > 1]
            nbytes = sum(s.nbytes or 0 for s in moved)
            if nbytes < LARGE_GATHER_BYTES:
                continue
            how = "summed (all-reduce of a Partial)" if all(s.kind == "all_reduce" for s in moved) else "gathered"
            held = local_shape(tuple(e.shape), Layout.parse(e.dst_layout), self.mesh)  # what a rank then holds
            part = "all of it" if held == tuple(e.shape) else f"its {e.dst_layout} shard {held}"
            what = (f"{e.src} {tuple(e.shape)} {e.dtype} ({e.src_layout}) is {how} whole over "
                    f"{', '.join(sorted({s.mesh_axis for s in moved}))} ({format_bytes(nbytes)} {per}, forward; "
                    f"every rank {where}then holds {part}: {self._whole_text(held, e.dtype, e.dst)})")
            if e.dst == "output" and has_loss:
                hint = ("because the model returns it beside its loss, which the traced graph already computes on "
                        "the shards (e.g. vocab-parallel cross-entropy). Remedy: if you do not read it, return only the "
                        "loss (a wrapper module whose forward returns `out.loss`)")
            elif e.dst == "output":
                hint = ("to be returned: a loss computed outside the model on it needs it whole. Remedy: put the "
                        "loss into the traced graph (transformers: pass labels= in example_kwargs and to pm(...)), "
                        "which runs vocab-parallel cross-entropy on the shards, and return only the loss")
            else:
                hint = (f"to feed {self.nodes[e.dst].op}, whose strategy here needs it whole (vocab-parallel "
                        "cross-entropy applies to a cross-entropy / nll loss over the sharded dim)")
            notes.append(f"large gather: {what} {hint}")
        return notes

    def _whole_text(self, shape, dtype: str, dst: str) -> str:
        """The bytes a rank holds of a gathered value (`shape`: its local shape there; before round 16 the global
        one, so a value gathered over tp but still sharded over dp was said to be held whole, 8x its bytes). A returned one is counted in the memory per device ("outputs",
        `problem.returned_bytes`); in a plan made before that was counted (no "outputs" kind) it was not, and the
        text says what a device then needs against the budget. A value fed to a loss is priced as that op's
        input in its layout (what the loss saves for backward is in "activations"): its bytes only."""
        itemsize = getattr(torch, str(dtype).removeprefix("torch."), torch.float32).itemsize
        whole = math.prod(shape) * itemsize
        mem, budget = self.cost.memory_bytes, self.config.get("memory_budget_bytes")
        if dst != "output":
            return format_bytes(whole)
        if "outputs" in mem:
            return (f"{format_bytes(whole)}, counted in the plan's memory per device as outputs"
                    + (" on the last stage's ranks" if self.pipeline is not None else ""))
        text = f"{format_bytes(whole)}, not counted in this plan's memory per device (made before outputs were)"
        if "total" in mem:
            need = mem["total"] + mem.get("reserve", 0) + whole
            text += f" (with it {format_bytes(need)} per device, reserve included"
            text += (f", over the budget of {format_bytes(budget)})" if budget and need > budget else ")")
        return text

    def summary(self, max_nodes: int = 40) -> str:
        """Text summary: notes, cost, memory, solver, parameter layouts, the main ops' strategies, fallbacks."""
        c, s = self.cost, self.solver
        gb = 1e9
        gap = "n/a" if s.gap is None else f"{s.gap:.2e}"
        lines = [f"NOTE: {note}" for note in self.notes()]
        if self.pipeline is not None and self.pipeline.estimate is not None:
            lines.append(f"Pipeline plan on mesh {self.pipeline.mesh}: " + self.pipeline.estimate.lines()[0])
        lines += [f"{'Intra-stage plan (one microbatch, whole graph)' if self.pipeline else 'Plan'} on mesh "
                  f"{self.mesh}: estimated step {c.total_s * 1e3:.3f} ms "
                 f"(compute {c.compute_s * 1e3:.3f} ms"
                 + "".join(f", {k} {v * 1e3:.3f} ms" for k, v in c.comm_s.items() if v) + ")",
                 f"precision: {precision_text(self.config, self.trained_dtypes())}",
                 "memory per device: " + ", ".join(f"{k} {v / gb:.2f} GB" for k, v in memory_rows(self)),
                 f"solver: {s.solver} {s.status} (gap {gap}), {s.num_variables} variables "
                 f"({s.num_binary} binary), {s.num_constraints} constraints, {s.num_groups} groups"
                 + (f", {s.time_s:.2f} s" if s.time_s is not None else "")]
        if self.recompute:
            by_mode: dict[str, list[str]] = {}
            for region, mode in sorted(self.recompute.items()):
                by_mode.setdefault(mode, []).append(region)
            lines.append("recomputation: " + "; ".join(
                f"{mode} on {len(rs)} blocks ({', '.join(rs[:3])}{', ...' if len(rs) > 3 else ''})"
                for mode, rs in sorted(by_mode.items())))
        else:
            lines.append("recomputation: none")
        if self.compression:
            from .compression import compression_line
            lines.append(compression_line(self.compression))
        by_layout: dict[str, int] = {}
        for p in self.params.values():
            if not p.is_buffer:
                by_layout[p.stored] = by_layout.get(p.stored, 0) + 1
        lines.append("parameters stored as: " + ", ".join(f"{k} x{v}" for k, v in sorted(by_layout.items())))
        counts: dict[str, int] = {}
        for _, st in self.steps():
            counts[st.kind] = counts.get(st.kind, 0) + 1
        lines.append("steps: " + (", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"))
        main = [(n, p) for n, p in self.nodes.items() if any(k in p.op for k in _MAIN_OPS)]
        lines.append(f"main ops ({len(main)}):")
        for n, p in main[:max_nodes]:
            lines.append(f"  {n:32s} {p.op:45s} {p.strategy}")
        if len(main) > max_nodes:
            lines.append(f"  ... {len(main) - max_nodes} more")
        for f in self.fallbacks:
            lines.append(f"fallback: {f.node} ({f.op}): {f.reason}")
        if self.pipeline is not None:
            title, header, rows = self.pipeline.table()
            widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
            lines.append(title + ":")
            lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
            if self.pipeline.estimate is not None:
                lines += self.pipeline.estimate.lines()[1:]
            if self.pipeline.compression is not None:
                lines += self.pipeline.compression.lines()
        rows = search_rows(self)
        if rows:
            lines.append("search (parallelizer.plan):")
            lines += [f"  {k}: {v}" for k, v in rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """Rich display in notebooks: the tables of `parallelizer.plan_io.plan_tables` as HTML."""
        from ..plan_io import plan_html
        return plan_html(self)


_MAIN_OPS = ("linear", "addmm", "matmul", "mm.", "bmm", "embedding", "attention", "layer_norm", "rms_norm",
             "cross_entropy", "conv")


def empty_comm() -> dict[str, float]:
    return {k: 0.0 for k in COLLECTIVE_KINDS}


def _cost_dict(cost: CostBreakdown) -> dict:
    """The cost as written: total_s is the sum of the WRITTEN (rounded) parts, so that a plan read back
    writes the same total (byte-identical round trip)."""
    d = _round(asdict(cost))
    return {**d, "total_s": d["compute_s"] + sum(d["comm_s"].values())}


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.10g}")
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x

