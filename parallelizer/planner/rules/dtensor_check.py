"""Our per-axis options checked against DTensor's sharding propagation: the one place that touches DTensor's
private sharding internals (DESIGN.md rule 7).

Every option of every rule is verified by executing it (tests/rules, DESIGN.md rule 8). This module adds a
second, independent opinion where one exists: DTensor's op-strategy table, which torch tests over OpInfo
samples (test/distributed/tensor/test_dtensor_ops.py). For one verification sample and one of our
`AxisOption`s on a 1-D mesh of 2 devices, `check_option` gives DTensor the inputs in our option's placements
and asks its propagator (`ShardingPropagator.propagate_op_sharding_non_cached`, the call the DTensor
dispatcher makes for every op) which output placement it produces and whether it would redistribute an
input first. The option then gets one `Verdict`:

| kind             | meaning                                                                              |
|------------------|--------------------------------------------------------------------------------------|
| `agrees`         | DTensor takes our input placements as they are and gives our output placement        |
| `equivalent`     | as `agrees`, but DTensor writes the output another way that means the same global     |
|                  | value (`EQUIVALENCES`); counted as agreement                                         |
| `ours only`      | DTensor would redistribute an input first: our option is an extension that only our  |
|                  | harness verifies (e.g. uneven regrouping views, mean over a sharded dim)             |
| `differs`        | DTensor takes our inputs as they are but gives ANOTHER output placement: a           |
|                  | contradiction to examine (tests/rules/test_dtensor_agreement.py fails on it)         |
| `dtensor defect` | a difference traced to a DTensor bug (`DTENSOR_DEFECTS`), confirmed by asking again  |
|                  | with the argument DTensor misreads passed the way it reads it                        |
| `not applicable` | DTensor has no strategy of its own for the op (`coverage`)                           |
| `not queried`    | DTensor has one but raised when asked; the reason is kept (an error that asks for a  |
|                  | redistribution, e.g. "Cannot flatten unevenly sharded tensor", counts as ours only)  |

DTensor "covers" an op overload directly when it is a key of one of the propagator's three tables:
`op_strategy_funcs` (strategy generators), `op_single_dim_strategy_funcs` (one-mesh-dim strategies expanded
to the mesh) or `op_to_rules` (propagation rules; only aten.convolution and its backward in 2.13).
Composite ops that torch.export keeps whole (aten.linear, layer_norm, conv2d, batch_norm, einsum, lstm,
cross_entropy_loss, scaled_dot_product_attention, ...) are CompositeImplicitAutograd kernels: DTensor never
sees them whole, only their decomposition, so they are "not applicable" even where DTensor could derive a
strategy by tracing `torch._decomp.decomposition_table` (its `DecompShardingStrategy`).

Known differences of vocabulary (DESIGN.md rule 9, `partial.py`): our Partial is always `Partial("sum")`;
DTensor also uses `Partial("avg")` (mean over a sharded dim: we divide the local sum by the GLOBAL count,
a sum-Partial of the same global value, exact for uneven shards) and `_MaskPartial` (vocab-parallel
embedding: a sum-Partial whose ranks read zeros for ids they do not own, which is ours); `EQUIVALENCES`
lists what counts as agreement and why.

Limits of the check: it is one-way, about OUR options only (DTensor's own extra strategies, e.g.
Replicate -> Partial ones, are not listed); the verdict is DTensor's runtime choice for our inputs (its
cheapest strategy for them), so an option that DTensor lists but ranks below a cheaper redistribution would
read `ours only` (none did on torch 2.13: each `ours only` is listed in docs/rules.md); and the mesh is 1-D
of size 2, so multi-axis products (`planner.strategies`) are checked axis by axis only.

Private torch API used here, checked on torch 2.13.0 only: `DTensor._op_dispatcher.sharding_propagator`
(`ShardingPropagator`: `op_strategy_funcs`, `op_single_dim_strategy_funcs`, `op_to_rules`,
`op_to_schema_info`, `op_to_schema_info_for_single_dim_strategy`, `propagate_op_sharding_non_cached`),
`torch.distributed.tensor._op_schema.OpSchema`, `torch.distributed.tensor._dtensor_spec.DTensorSpec` and
`TensorMeta`, `DeviceMesh(..., _init_backend=False, _rank=0)` (a mesh that creates no process group, as in
`parallelizer.checkpoint`), and `placement_types._MaskPartial`. No collective ever runs: propagation only
reads placements and tensor metadata (shapes come from FakeTensorMode).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard, _MaskPartial
from torch.utils import _pytree as pytree

from ...core.layout import placement_str
from .base import AxisOption, aten
from .samples import Sample

TORCH_CHECKED = ("2.13.0",)
MESH_SIZE = 2

AGREES, EQUIVALENT, OURS_ONLY, DIFFERS = "agrees", "equivalent", "ours only", "differs"
DTENSOR_DEFECT, NOT_APPLICABLE, NOT_QUERIED = "dtensor defect", "not applicable", "not queried"
AGREEMENT = (AGREES, EQUIVALENT)

_MEAN_OPS = {aten.mean.default, aten.mean.dim}
_UNDEFINED_VALUES = {aten.empty_like.default, aten.new_empty.default, aten.empty.memory_format}
_CONSTANT_FILLS = {aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.zeros.default,
                   aten.ones.default, aten.full.default}
_COPY_OPS = {aten.expand.default, aten.repeat.default}
# DTensor's placement (short form) -> why it means the same global value as ours (module docstring)
EQUIVALENCES = {
    "P(avg)": "mean over a sharded dim: DTensor averages local means (even shards only); we sum local "
                    "sums divided by the global count (`pointwise.reduction`). Same global value.",
    "MaskPartial(sum)": "vocab-parallel embedding: DTensor's _MaskPartial is a sum-Partial whose ranks read zeros "
                        "for ids outside their rows, as ours (`linalg.embedding`); its Replicate -> _MaskPartial "
                        "step on the ids is a local masking, no communication.",
    "uninitialised": "empty_like / new_empty: the values are uninitialised, so any placement describes them.",
    "constant": "zeros / ones / full and their new_* forms: a shard of a constant is the constant, so a Replicate "
                "output (DTensor's choice) and a Shard output made locally (`pointwise.constant_fill`) hold the "
                "same global value.",
    "copies": "expand / repeat of a Replicate input along a dim they fill with copies of it (a new or size-1 dim): "
              "DTensor keeps the output Replicate; ours makes the rank's slice of the copies locally "
              "(`shape_ops.copies`, its size / repeats localised). Same global value.",
}
# DTensor defects met by this check (torch 2.13.0): op -> (arguments DTensor reads only as keywords, the defect).
# `check_option` confirms each: the same query with those arguments passed as keywords agrees with us.
DTENSOR_DEFECTS = {
    aten.logsumexp.default: (("keepdim",), "logsumexp_strategy (torch/distributed/tensor/_ops/_math_ops.py) reads "
                             "keepdim from kwargs only, but the dispatcher passes it positionally, so keepdim=True is "
                             "ignored: on x (5, 4, 3) S(1), logsumexp(x, [0], True) is declared S(0) of (1, 4, 3) "
                             "while every rank holds (1, 2, 3) (seen on a DTensor under the fake process group)."),
}


class DTensorQueryError(RuntimeError):
    """DTensor's propagator raised for a query (`check_option` records it as `not queried`, or as `ours only`
    when DTensor asks for a redistribution)."""


@dataclass(frozen=True)
class Verdict:
    """How DTensor sees one of our options: `kind` (module table), what DTensor answered (`dtensor`, e.g.
    "S(0) R -> S(0)", or "" when not asked) and why (`reason`)."""

    kind: str
    dtensor: str = ""
    reason: str = ""


def _short(p: Placement | None) -> str:
    """`core.layout.placement_str`, extended to DTensor's private placements ("MaskPartial(sum)", ...)."""
    if p is None:
        return "-"
    if type(p) in (Shard, Replicate, Partial):
        return placement_str(p)
    return f"{type(p).__name__.lstrip('_')}({p.reduce_op})" if isinstance(p, Partial) else str(p)


def describe(inputs: tuple, outputs: tuple) -> str:
    """"S(0) R -> S(0)": input placements, then the output placement(s)."""
    return f"{' '.join(map(_short, inputs))} -> {' '.join(map(_short, outputs))}"


def tables() -> dict[str, dict]:
    """DTensor's three per-overload tables (module docstring), by name, in the order its propagator consults
    them (a one-mesh-dim strategy wins over a strategy generator for the same overload, e.g. aten.clone)."""
    sp = DTensor._op_dispatcher.sharding_propagator
    return {"op_single_dim_strategy_funcs": sp.op_single_dim_strategy_funcs, "op_strategy_funcs": sp.op_strategy_funcs,
            "op_to_rules": sp.op_to_rules}


def coverage(op) -> tuple[bool, str]:
    """(True, name of the table DTensor uses) when DTensor has a strategy of its own for the overload `op`;
    else (False, why not)."""
    for name, table in tables().items():
        if op in table:
            return True, name
    if not isinstance(op, torch._ops.OpOverload):
        return False, "not an ATen op"
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return False, "composite op kept whole by torch.export; DTensor sees only its decomposition"
    return False, "no DTensor strategy"


@functools.lru_cache(maxsize=1)
def _mesh() -> DeviceMesh:
    """A 1-D mesh of `MESH_SIZE` CPU devices seen from rank 0, with no process group behind it."""
    return DeviceMesh("cpu", torch.arange(MESH_SIZE), _init_backend=False, _rank=0)


def _spec(x: torch.Tensor, p: Placement) -> DTensorSpec:
    return DTensorSpec(_mesh(), (p,), TensorMeta(x.shape, x.stride(), x.dtype))


def _specs(tree) -> list[DTensorSpec]:
    return [s for s in pytree.tree_leaves(tree) if isinstance(s, DTensorSpec)]


def propagate(op, args: tuple, kwargs: dict, placements: tuple[Placement, ...]) -> tuple[tuple, tuple]:
    """Ask DTensor's propagator about `op(*args, **kwargs)` with its tensor arguments (in pytree order, as
    `OpView.in_shapes`) placed by `placements` on the 1-D mesh: (the input placements DTensor runs the op
    with, the output placement of each tensor output (None for an output it does not produce)). Raises
    `DTensorQueryError` when propagation raises."""
    it = iter(placements)
    args_schema, kwargs_schema = pytree.tree_map_only(torch.Tensor, lambda x: _spec(x, next(it)), (args, kwargs))
    sp = DTensor._op_dispatcher.sharding_propagator
    info = sp.op_to_schema_info.get(op) or sp.op_to_schema_info_for_single_dim_strategy.get(op)
    schema = OpSchema(op, tuple(args_schema), dict(kwargs_schema), schema_info=info)
    try:
        result = sp.propagate_op_sharding_non_cached(schema)
    except Exception as exc:  # noqa: BLE001 -- any failure of a private API is reported, not raised further
        raise DTensorQueryError(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    wanted = schema if result.redistribute_schema is None else result.redistribute_schema
    ins = tuple(s.placements[0] for s in _specs((wanted.args_schema, wanted.kwargs_schema)))
    out = result.output_spec
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return ins, tuple(None if o is None else o.placements[0] for o in outs)


def _same_output(ours: Placement, theirs: Placement | None, op) -> str | None:
    """AGREES, or the EQUIVALENCES key when DTensor's output placement `theirs` means our `ours`; else None."""
    if theirs is None or ours == theirs and type(ours) is type(theirs):
        return AGREES
    if op in _UNDEFINED_VALUES:
        return "uninitialised"
    if op in _CONSTANT_FILLS and isinstance(theirs, Replicate) and not isinstance(ours, Partial):
        return "constant"
    if op in _COPY_OPS and isinstance(theirs, Replicate) and isinstance(ours, Shard):
        return "copies"
    name = _short(theirs)
    if isinstance(ours, Partial) and (name == "MaskPartial(sum)" or name == "P(avg)" and op in _MEAN_OPS):
        return name
    return None


def _same_input(ours: Placement, theirs: Placement) -> bool:
    """DTensor runs the op on our input as it is (a Replicate id tensor masked locally counts, EQUIVALENCES)."""
    if isinstance(ours, Replicate) and isinstance(theirs, _MaskPartial):
        return True
    return ours == theirs and type(ours) is type(theirs)


def _ask(sample: Sample, option: AxisOption, keywords: tuple[str, ...] = ()) -> Verdict:
    """One query (`check_option`); the positional arguments named in `keywords` (and those after them) are
    passed as keywords."""
    args, kwargs = sample.materialize(0)
    names = [a.name for a in sample.op._schema.arguments]
    first = min((names.index(n) for n in keywords), default=len(args))
    if first < len(args):  # that argument and the positional ones after it become keywords
        kwargs = {**dict(zip(names[first:], args[first:])), **kwargs}
        args = args[:first]
    try:
        ins, outs = propagate(sample.op, args, kwargs, option.inputs)
    except DTensorQueryError as exc:
        if "redistribute" in str(exc):  # DTensor refuses these placements and asks for a redistribution
            return Verdict(OURS_ONLY, "raises", str(exc))
        return Verdict(NOT_QUERIED, reason=str(exc))
    answer = describe(ins, outs)
    if len(ins) != len(option.inputs):
        return Verdict(NOT_QUERIED, answer, f"DTensor sees {len(ins)} tensor inputs, we see {len(option.inputs)}")
    moved = [k for k, (a, b) in enumerate(zip(option.inputs, ins)) if not _same_input(a, b)]
    if moved:
        return Verdict(OURS_ONLY, answer, f"DTensor redistributes input(s) {moved}")
    same = [_same_output(option.output, o, sample.op) for o in outs]
    if None in same:
        return Verdict(DIFFERS, answer, "DTensor takes these inputs as they are but gives another output placement")
    notes = sorted({k for k in same if k != AGREES} | {"MaskPartial(sum)" for p in ins if isinstance(p, _MaskPartial)})
    return Verdict(EQUIVALENT if notes else AGREES, answer, " ".join(EQUIVALENCES[k] for k in notes))


def check_option(sample: Sample, option: AxisOption) -> Verdict:
    """The verdict on one of our options (from the rule run on `sample.view()`) for `sample` on a 1-D mesh of
    2 devices (module docstring)."""
    covered, why = coverage(sample.op)
    if not covered:
        return Verdict(NOT_APPLICABLE, reason=why)
    verdict = _ask(sample, option)
    if verdict.kind == DIFFERS and sample.op in DTENSOR_DEFECTS:
        keywords, defect = DTENSOR_DEFECTS[sample.op]
        if _ask(sample, option, keywords).kind in AGREEMENT:
            return Verdict(DTENSOR_DEFECT, verdict.dtensor, defect)
    return verdict
