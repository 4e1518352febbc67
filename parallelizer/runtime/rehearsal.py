"""Rehearsal: run a sharded program on local ranks and compare it with the single-device model.

Each rank builds the same model (a seeded builder such as the zoo's), keeps an untouched copy as the
single-device reference, runs the sharded program on the same global inputs, and compares: forward outputs,
the loss, every parameter gradient (this rank's shard of the reference gradient), and the parameters after
`steps` AdamW steps (gathered with `full_state_dict`). The loss is the model's own scalar output when it
returns one first (e.g. a causal-LM loss), else a mean of squares of the first output weighted per last-dim
index (`_loss`). Differences are
judged with dtype-aware tolerances (`runtime.tolerance`), each tensor at the least precise dtype of the computation
that reaches it (`runtime.reach`): a bf16 model, or an fp32 model whose autocast region every value passes
through, is held to bfloat16's, an fp32 model to float32's, and the float32 tensors of an fp32 model that a
16-bit side branch does not reach to float32's. A plan with a mixed-precision recipe
(`runtime.precision`, e.g. precision="bf16" asked for an fp32 model) is compared with the single-device model
run under the same recipe (its forward under torch.autocast(bfloat16), loss and backward outside, fp32
AdamW on fp32 weights), at bfloat16's tolerance; the report names the reference it ran. A case without a
recipe (an fp32, bf16 or fp16 model) that some rank finds outside its dtype's bound runs again, judged also
against a float64 copy of the single-device model (`float64_excess`, when the copy runs and computes the same
outputs, `same_computation`; for a 16-bit model only when the forward draws no random numbers,
`wide_judged`): a match by either criterion, so that the rounding of sums whose terms cancel is not taken for
a wrong program.

A plan with gradient compression (`ShardingSpec.compression`, `rewriter.compression`) approximates the
gradient sum by design: its report gives the same measured differences (and the loss after the steps) but
does not judge them against the tolerance (`RehearsalReport.expected_deviation`); without compression the
check is as strict as ever, and so it is for a PowerSGD plan whose warm-up covers the rehearsal's steps (exact
all-reduces: `unjudged_codec`).
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from ..errors import PipelineError
from ..fingerprint import check_plan
from ..planner import Plan
from ..rewriter.spec import ShardingSpec, all_axis_groups, hierarchical_sub_groups, spec_from_plan
from ..rewriter.state import gather_tensor, shard_tensor
from ..tracer.graph import carries_grad
from ..tracer.trace import trace
from .grad_reach import presence_mismatch
from .launch import create_groups, spawn
from .module import ParallelModule
from .module_copy import reference_copy
from .precision import RECIPES, autocast, check_recipe_runs
from .replicas import check_same_weights
from .zero1 import plan_optimizer, runs_zero1
from .reach import narrows_inside, reach_dtypes
from .tolerance import compute_dtype, loosest, tolerances
# the comparison (`runtime.judge`) and the report (`runtime.rehearsal_report`), split from this module in round 23:
# re-exported, since callers import them from here
from .judge import (LOW_PRECISION_SAME_FACTOR, ORDER_FACTOR, SAME_COMPUTATION_RTOL, WIDE_JUDGED,  # noqa: F401
                    _float64_run, _grad_or_zeros, _loss, _max_diff, _output_pairs, float64_excess, random_ops,
                    recipe_excess, same_computation, tensor_leaves, unused_float64, wide_judged, widened)
from .rehearsal_report import (FLOAT64_JUDGE, JUDGED, NO_FLOAT64_JUDGE, WARMUP_NOTE, ZERO1_NOTE,  # noqa: F401
                               RehearsalReport, _random_kind, _report, no_float64_note, replay_note, unjudged_codec)


def rehearse(model_fn: Callable, model_kwargs: dict, plan: Plan | ShardingSpec, *, steps: int = 3,
             lr: float = 1e-3, eps: float = 1e-3, timeout_s: float = 300.0,
             structure_only: bool = False) -> RehearsalReport:
    """Run a plan on `mesh.world_size` local gloo ranks and compare with the single-device model.

    Args:
        model_fn: module-level builder `model_fn(**model_kwargs) -> (model, example_inputs[, example_kwargs])`,
            deterministic: every rank calls it after `torch.manual_seed(0)` (a builder that draws from
            torch's RNG without seeding itself still builds the same weights on every rank), and the ranks
            compare their weights before sharding them (`runtime.replicas.check_same_weights`).
        plan: the `Plan` that `parallelizer.plan` returned (or `Plan.load`), or a `ShardingSpec`. A Plan is
            checked against the model before any rank starts (`fingerprint.check_plan`: parameters, input
            shapes, ops, constants; with `structure_only`, names and ops only, for a plan applied to a
            narrower config of the same structure). A spec must be for `trace(*model_fn(**model_kwargs))` or
            a model of the same structure (layouts refer to node names, which depend only on the structure).
        steps: AdamW steps before the parameters are compared.
        lr, eps: AdamW's. eps is far above torch's default (1e-8) on purpose: Adam's update
            lr * g / (|g| + eps) turns a gradient much smaller than eps into a step proportional to it and a
            larger one into a step of about lr whatever its size, so rounding differences in a tiny gradient
            (a parameter whose true gradient is zero, e.g. an attention key bias, to which softmax is
            invariant; rows of an embedding barely used) would become parameter differences of order lr on
            either side of the comparison: with eps 1e-6 CLIP's token embedding differs by 3e-5 after two
            steps from gradients 6e-8 apart; with 1e-3 by 7e-8. The gradients themselves are compared
            directly, at the dtype's tolerance. Under a mixed-precision recipe (`runtime.precision`) eps is at
            least `RECIPE_ADAM_EPS` (0.1) for the same reason at bf16's rounding (2^-8 relative, not 2^-24):
            with eps 1e-3 a GPT's parameters after 3 steps differed by 1.18x the recipe bound from gradients
            within 0.19x of it; with 0.1 by 0.13x.
    Raises:
        PlanMismatchError: the plan was made for another model, input shapes or constants (says what differs).
        PipelineError: a pipeline plan (`plan.pipeline`): rehearse it with `pipeline_rehearsal.rehearse_pipeline`.
        TypeError: `plan` is neither a Plan nor a ShardingSpec.
        DistributedError: a rank failed or timed out (names the rank, with its traceback).
    """
    spec = checked_spec(plan, model_fn, model_kwargs, structure_only=structure_only)
    return rehearse_many([(model_fn, model_kwargs, spec)], steps=steps, lr=lr, eps=eps, timeout_s=timeout_s)[0]


def checked_spec(plan: Plan | ShardingSpec, model_fn: Callable, model_kwargs: dict, *,
                 structure_only: bool = False) -> ShardingSpec:
    """The `ShardingSpec` of `plan`; a `Plan` is first checked against the traced model of
    `model_fn(**model_kwargs)` (built and traced here, in this process). Raises as `rehearse`."""
    if isinstance(plan, ShardingSpec):
        if plan.autocast is not None:  # a program that raises under the recipe: typed here, not on every rank
            model, inputs, *rest = model_fn(**model_kwargs)
            kwargs = rest[0] if rest else {}
            check_recipe_runs(trace(model, inputs, kwargs, allow_frozen_host_random=True), inputs, kwargs,
                              plan.autocast)
        return plan
    if not isinstance(plan, Plan):
        raise TypeError(f"rehearse: pass the Plan that parallelizer.plan returned (or Plan.load), or a "
                        f"ShardingSpec; got {type(plan).__name__}")
    if plan.pipeline is not None:
        raise PipelineError(f"rehearse: the plan is a pipeline plan (pp={plan.pipeline.pp}); this runs one program "
                            "per rank without stages. Remedy: `parallelizer rehearse plan.json --nproc N`, or "
                            "runtime.pipeline_rehearsal.rehearse_pipeline with a builder of the global batch")
    model, inputs, *rest = model_fn(**model_kwargs)
    traced = trace(model, inputs, rest[0] if rest else {}, allow_frozen_host_random=True)  # see `random_ops`
    check_plan(plan, traced, structure_only=structure_only)
    spec = spec_from_plan(plan)
    check_recipe_runs(traced, inputs, rest[0] if rest else {}, spec.autocast)
    return spec


def rehearse_many(cases: list[tuple[Callable, dict, Plan | ShardingSpec]], *, steps: int = 3, lr: float = 1e-3,
                  eps: float = 1e-3, timeout_s: float = 600.0) -> list[RehearsalReport]:
    """`rehearse` for several (model_fn, model_kwargs, plan or spec) cases in ONE launch of local ranks
    (starting ranks costs seconds). Every plan must be for the same number of devices; Plans are checked
    against their models first, as in `rehearse`.

    Raises:
        ValueError: the cases need different numbers of devices.
        PlanMismatchError: a Plan was made for another model (before any rank starts).
        DistributedError: a rank failed or timed out.
    """
    cases = [(fn, kwargs, checked_spec(plan, fn, kwargs)) for fn, kwargs, plan in cases]
    sizes = {spec.mesh.world_size for _, _, spec in cases}
    if len(sizes) != 1:
        raise ValueError(f"rehearse_many: all cases must use the same number of devices, got {sorted(sizes)}; "
                         "group the cases by mesh size")
    per_rank = spawn(_rank_cases, sizes.pop(), cases, steps, lr, eps, timeout_s=timeout_s)
    reports = []
    for i, (_, _, spec) in enumerate(cases):
        codec, note = unjudged_codec(spec, steps)
        reports.append(_report(spec.mesh.world_size, [ranks[i] for ranks in per_rank], codec, spec.autocast, note))
    return reports


def _non_persistent_buffers(pm: ParallelModule, traced, refs) -> list[tuple]:
    """(name, pm's full value, each reference's) of every non-persistent buffer of the model (not in
    `state_dict()`, so not among the compared parameters): a buffer forward writes (an EMA of batch statistics,
    a cache) is compared as one device holds it. Collective (gathers each one)."""
    rows = []
    for fqn, info in traced.parameters.items():
        if info.is_buffer and not info.persistent and not info.is_constant:
            full = gather_tensor(pm.get_buffer(fqn), pm.spec.params[fqn], pm.spec.mesh, pm.groups,
                                 tuple(info.shape), pm.coords)
            rows.append((f"{fqn} (non-persistent buffer)", full, *(m.get_buffer(fqn) for m, _ in refs)))
    return rows


def _rank_cases(rank: int, world_size: int, cases, steps: int, lr: float, eps: float) -> list[dict]:
    """Each case on this rank; a case without a recipe that some rank finds outside its bound runs again with the
    float64 copy (`float64_excess`; decided by all ranks together, an all-reduce of the verdicts, so that every
    rank runs the same collectives), which costs a second run only where the plain bound did not suffice; one
    still outside is replayed in float64 (`runtime.replay64`), whose result the report states. A float32 model
    whose forward casts some values to 16 bits (`runtime.reach.narrows_inside`) is replayed in float64 even when it
    matches, and the replay's ratio joins the verdict: the per-tensor 16-bit bound of what those casts reach is
    blind to an error of 0.1% of the scale (ratio 0.5), the replay is not (round 18, r18c).
    Cases of the same model (builder and kwargs) share one trace on this rank (`_rank_main`'s `traces`): a
    TracedGraph is read-only to the ParallelModules built on it, each of which takes the weights of its own
    freshly built model (as `benchmarks/_steptime_workers` does)."""
    out, traces = [], {}
    for fn, kwargs, spec in cases:
        result = _rank_main(rank, world_size, fn, kwargs, spec, steps, lr, eps, traces=traces)
        if spec.autocast is None and not spec.compression.deviates_within(steps) and _any_rank_outside(result):
            result = _rank_main(rank, world_size, fn, kwargs, spec, steps, lr, eps, wide=True, traces=traces)
            # still outside: rounding beyond 8x or a wrong program (`replay64`); not for a forward drawing random
            # numbers (its report names them; a replay draws other masks and would read as a wrong program)
            if _any_rank_outside(result) and not result["random"]:
                from .kinks import locate
                from .replay64 import replay, replay_kinks  # imports this module

                result["float64_replay"] = replay(rank, fn, kwargs, spec)
                result["kinks"] = replay_kinks(result["float64_replay"], lambda: locate(
                    rank, fn, kwargs, spec, traces[(fn, repr(kwargs))][0]))
        elif spec.autocast is None and not spec.compression.deviates_within(steps) and not result["random"] \
                and narrows_inside(traces[(fn, repr(kwargs))][0]):
            # a float32 model that casts some values to 16 bits: what those casts reach is judged at the 16-bit
            # bound, blind to sub-percent errors; the replay in float64 (casts widened) judges the program too
            from .replay64 import replay  # imports this module

            result["float64_replay"], result["replay_judges"] = replay(rank, fn, kwargs, spec), True
        out.append(result)
    return out


def _any_rank_outside(result: dict) -> bool:
    """Whether any rank's comparison exceeds its bound (an all-reduce (max) over the default process group)."""
    ratio = max(result[k][2] for k in (*JUDGED, "final_loss") if k in result)  # final_loss: a float64 rerun too
    verdict = torch.tensor([1.0 if ratio > 1 else 0.0])
    torch.distributed.all_reduce(verdict, op=torch.distributed.ReduceOp.MAX)
    return bool(verdict.item())


RECIPE_ADAM_EPS = 0.1  # AdamW's eps under a mixed-precision recipe (`rehearse`, argument eps)


def _rank_main(rank: int, world_size: int, model_fn, model_kwargs, spec: ShardingSpec, steps: int, lr: float,
               eps: float, wide: bool = False, traces: dict | None = None) -> dict:
    """One case on this rank (module docstring); `wide`: with the float64 copy of a model without a recipe as a
    second judge (`float64_excess`, `wide_judged`); `traces`: (builder, repr of its kwargs) -> TracedGraph,
    reused and filled (with its `ReachDtypes`, `runtime.reach`)."""
    if spec.autocast is not None:
        eps = max(eps, RECIPE_ADAM_EPS)
    torch.manual_seed(0)  # the same weights on every rank even from a builder that does not seed itself
    model, inputs, *rest = model_fn(**model_kwargs)
    kwargs = rest[0] if rest else {}
    reference = reference_copy(model)  # computes as on one device, under the ranks' group too
    # the reference without the recipe (its rounding), or a float64 copy of the model (`float64_excess`)
    exact = reference_copy(model) if spec.autocast is not None or wide else None
    traces = {} if traces is None else traces
    key = (model_fn, repr(model_kwargs))
    if key not in traces:
        traced = trace(model, inputs, kwargs, allow_frozen_host_random=True)  # named next to a DIFFER (`random_ops`)
        traces[key] = (traced, reach_dtypes(traced))
    traced, reach = traces[key]
    # the judge's dtype per compared tensor (`runtime.reach`); `compute`, the whole program's, decides only
    # whether a float64 copy may judge (`wide_judged`, `same_computation`)
    reach = reach.with_recipe(RECIPES.get(spec.autocast))
    compute = loosest(compute_dtype(traced), RECIPES.get(spec.autocast))
    check_same_weights(model)
    create_groups(all_axis_groups(spec.mesh) + hierarchical_sub_groups(spec))
    pm = ParallelModule(traced, spec, rank, model)

    # each model gets its own copy of the inputs: a forward that writes an input in place (`x.mul_(2)`)
    # mutates the caller's tensor, and would otherwise feed its write to the other side's next call
    args = {id(reference): copy.deepcopy((inputs, kwargs))}

    def run(m, recipe):  # a single-device model under a recipe (None: as traced), on its own inputs
        with autocast(recipe):
            ins, kws = args[id(m)]
            return m(*ins, **kws)

    refs, judge, unjudged = [(reference, spec.autocast)], recipe_excess, ""
    out, ref_outs = pm(*inputs, **kwargs), [run(reference, spec.autocast)]
    if spec.autocast is not None:
        args[id(exact)] = copy.deepcopy((inputs, kwargs))
        refs.append((exact, None))
        ref_outs.append(run(exact, None))
    elif exact is not None and wide_judged(compute, traced):
        run64 = _float64_run(exact, inputs, kwargs)
        unjudged = unused_float64(run64, ref_outs[0], compute)
        if not unjudged:
            args[id(exact)], judge = run64[1], float64_excess
            refs.append((exact, None))
            ref_outs.append(run64[0])
    output = _max_diff(_output_pairs(out, ref_outs), reach.output, judge)
    losses = [_loss(o) for o in (out, *ref_outs)]
    for value in losses:
        value.backward()

    def ref_grads(fqn):  # this rank's shard of each reference's gradient
        return [shard_tensor(_grad_or_zeros(m.get_parameter(fqn)), spec.params[fqn], spec.mesh, pm.coords)
                for m, _ in refs]

    grad = presence_mismatch((fqn, p.grad, *(m.get_parameter(fqn).grad for m, _ in refs))  # None vs a tensor
                             for fqn, p in pm.named_parameters()) or _max_diff(
        # a parameter the loss does not reach (e.g. an unused pooler) has no gradient on either side: zeros
        ((fqn, _grad_or_zeros(p), *ref_grads(fqn)) for fqn, p in pm.named_parameters()), reach.grad, judge)
    scale = max((p.grad.detach().abs().max().item() for p in reference.parameters()
                 if p.grad is not None and p.grad.numel()), default=0.0)
    dtype = next((p.dtype for p in reference.parameters() if p.is_floating_point()), torch.float32)
    grad_scale = (scale, tolerances(loosest(dtype, compute))[1])  # (`RehearsalReport.blind`)
    opts = [plan_optimizer(pm.parameters(), spec, pm, lr, eps),  # ZeRO-1 as the plan says (`runtime.zero1`)
            *(torch.optim.AdamW(m.parameters(), lr=lr, eps=eps) for m, _ in refs)]
    for step in range(steps):
        if step:
            for o in opts:
                o.zero_grad()
            _loss(pm(*inputs, **kwargs)).backward()
            for m, r in refs:
                _loss(run(m, r)).backward()
        for o in opts:
            o.step()
    full = pm.full_state_dict()
    states = [m.state_dict() for m, _ in refs]
    params = _max_diff(((k, full[k], v, *(s[k] for s in states[1:])) for k, v in states[0].items()), reach.param,
                       judge)
    hidden = _max_diff(_non_persistent_buffers(pm, traced, refs), reach.param, judge)  # not in any state dict
    params = (*max(params[:2], hidden[:2]), max(params[2], hidden[2]))
    with torch.no_grad():
        final = _max_diff([("loss", _loss(pm(*inputs, **kwargs)), *(_loss(run(m, r)) for m, r in refs))],
                          reach.final_loss, judge)
    # the inputs after the steps: a forward that writes an input in place must leave the caller's tensor as
    # one device does (every element, on every rank), not only this rank's shard of it
    after = zip(tensor_leaves((inputs, kwargs)), tensor_leaves(args[id(reference)]))
    written = _max_diff(((f"input {i} after the steps", a, b) for i, (a, b) in enumerate(after)
                         if carries_grad(a.dtype)), reach.output, judge)
    output = (max(output[0], written[0]), output[1] if output[0] >= written[0] else written[1],
              max(output[2], written[2]))
    return {"output": output, "loss": _max_diff([("loss", *losses)], reach.output, judge), "grad": grad,
            "params": params,
            "final_loss": final, "collectives": pm.program.collectives, "random": random_ops(traced),
            "grad_scale": grad_scale, "float64_judge": judge is float64_excess, "float64_unused": unjudged,
            "zero1": spec.zero1 if runs_zero1(spec) else None,
            "code": pm.program.graph_module.code if rank == 0 else ""}
