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
What a reader sees is derived, not stored: the notes (`planner/plan_notes.py`) and the text summary
(`planner/plan_text.py`).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

import torch

from ..core.layout import Layout
from ..core.mesh import MeshSpec
from ..core.redistribute import COLLECTIVE_KINDS, Step, edge_steps, grad_partial_axes, sum_itemsize
from .plan_notes import idle_axes, notes, shards_nothing
from .plan_text import summary
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
                           torch_dtype.itemsize, requires_grad, is_parameter,
                           sum_itemsize(torch_dtype))
    return EdgePlan(src, dst, index, src_layout, consumer.inputs[index], steps, tuple(shape), dtype, requires_grad)


# Distinct edges (layouts, shape, dtype size, gradient facts, mesh) whose steps are kept: a plan has a few hundred
# (the instances of a repeated block share theirs); the bound only keeps a long-lived process from growing.
_STEPS_CACHE = 16384


@functools.lru_cache(maxsize=_STEPS_CACHE)
def _derived_steps(mesh: MeshSpec, src_layout: str, dst_layout: str, out_layout: str | None, shape: tuple[int, ...],
                   itemsize: int, requires_grad: bool, is_parameter: bool, sum_bytes: int) -> tuple[Step, ...]:
    """`derive_edge`'s steps, memoised on everything they depend on (its arguments; Steps are immutable)."""
    dst = Layout.parse(dst_layout)
    out = None if out_layout is None else Layout.parse(out_layout)
    return edge_steps(Layout.parse(src_layout), dst, shape, mesh, itemsize=itemsize,
                      grad_partial_axes=grad_partial_axes(dst, out, mesh), requires_grad=requires_grad,
                      is_parameter=is_parameter, sum_bytes=sum_bytes)


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
        in unless the plan records an autocast recipe (`plan_text.precision_text`)."""
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
                                       False, sum_itemsize(dtype))
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
        from .priced_for import priced_for
        solver = asdict(self.solver)
        if not include_timing:
            solver["time_s"] = None
        doc = _round({
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
        return {**doc, "priced_for": priced_for(doc)}  # what the cost was computed for: an edit is refused on load

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
        from .priced_for import check_priced_for
        d = parse_and_validate(text, source)
        check_priced_for(d, source)
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

    # --- human (planner/plan_notes.py, planner/plan_text.py) ---------------------------------------------
    def idle_axes(self) -> list[str]:
        """Mesh axes of more than one device that shard no floating value (`plan_notes.idle_axes`)."""
        return idle_axes(self)

    def shards_nothing(self) -> bool:
        """Whether every axis of more than one device is idle: each device computes the whole step."""
        return shards_nothing(self)

    def notes(self) -> list[str]:
        """What a reader should see first, derived from the plan (`plan_notes.notes`)."""
        return notes(self)

    def summary(self, max_nodes: int = 40) -> str:
        """Text summary: notes, cost, memory, solver, parameter layouts, the main ops' strategies, fallbacks
        (`plan_text.summary`)."""
        return summary(self, max_nodes)

    def _repr_html_(self) -> str:
        """Rich display in notebooks: the tables of `parallelizer.plan_io.plan_tables` as HTML."""
        from ..plan_io import plan_html
        return plan_html(self)


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

