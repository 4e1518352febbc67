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
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from ..errors import PipelineError
from ..fingerprint import check_plan
from ..planner import Plan
from ..rewriter.spec import ShardingSpec, all_axis_groups, hierarchical_sub_groups, spec_from_plan
from ..rewriter.state import gather_tensor, shard_tensor
from ..tracer.graph import as_real, carries_grad, draws_random
from ..tracer.leaves import pair_by_path
from ..tracer.trace import trace
from ..tracer.host_state import HOST_STATE_LEADS, frozen_host_state
from ..tracer.watch import HOST_RNG_NOTE, HOST_RNG_SITES
from .grad_reach import presence_mismatch
from .launch import create_groups, spawn
from .module import ParallelModule
from .module_copy import copy_module
from .precision import RECIPES, autocast, check_recipe_runs, describe
from .replicas import check_same_weights
from .kinks import kinks_note
from .widen import as_float64
from .zero1 import plan_optimizer, runs_zero1
from .reach import narrows_inside, reach_dtypes
from .tolerance import compute_dtype, excess, loosest, tolerances


@dataclass(frozen=True, slots=True)
class RehearsalReport:
    """Largest absolute differences against the single-device model, over all ranks.

    Attributes: output, loss, grad (over every parameter), params (after the steps): the largest
        absolute difference (float). worst_grad / worst_param: the FQN with the largest difference.
        tolerance_ratio: the largest difference over its bound, over everything compared
            (`runtime.tolerance.excess`: torch.testing.assert_close's default rtol and atol for the least
            precise of the tensor's dtype and that of the computation reaching it, `runtime.reach`; elementwise
            for 32/64-bit floats, relative to the tensor's largest magnitude for 16-bit floats); <= 1 means a match.
        collectives: redistribution steps per kind in rank 0's emitted forward program (its stages' for a
            pipeline plan): one per (value, target layout), user inputs' slices included, local_slice moves no
            data, backward conjugates are not counted apart; `Plan.program_steps` gives the same per mesh axis
            (`show`'s column "in each rank's program"), `show`'s "plan edges" column counts one per use.
            rank0_code: rank 0's program source.
        compression: the gradient codec of the run (`GradCompression.spec`; "" = none).
        final_loss: largest |difference| of the loss after the steps (a forward of the stepped models); None
            where not measured (pipeline rehearsals).
        reference: what the single-device reference ran (`runtime.precision.describe`).
        buffers / worst_buffer: largest |difference| of a buffer after each step, over every stage copy, and
            its FQN; None where not measured (rehearsals without stages).
    """

    world_size: int
    output: float
    loss: float
    grad: float
    params: float
    worst_grad: str
    worst_param: str
    tolerance_ratio: float
    collectives: dict
    rank0_code: str
    compression: str = ""
    final_loss: float | None = None
    reference: str = describe(None)
    buffers: float | None = None
    worst_buffer: str = ""
    random: str = ""  # the random ops the traced forward draws from (`random_ops`), named when numbers differ
    grad_scale: float | None = None  # largest |gradient| of the one-device reference over every parameter
    grad_atol: float | None = None  # the absolute tolerance gradients are compared with
    kinks: str = ""  # elements that crossed a kink by rounding, with the float64 replay equal (`runtime.kinks`)

    @property
    def blind(self) -> bool:
        """True when every gradient of the one-device reference is below the absolute tolerance it is compared
        with: any program whose gradients are as small matches, right or wrong (DPT's depth head at its
        initial weights: output 2.5e-8, largest gradient 5.7e-9 under atol 1e-5; round 9). Not a mismatch:
        the report says so and names the remedy."""
        return self.grad_scale is not None and self.grad_atol is not None and self.grad_scale < self.grad_atol

    def matches(self) -> bool:
        """True when every compared value is within its dtype-aware bound (`runtime.tolerance`), or when the
        values outside it come from elements that crossed a kink by rounding while the plan replayed in float64
        equals the float64 model (`kinks`, `runtime.kinks`; `tolerance_ratio` keeps the measured ratio)."""
        return self.tolerance_ratio <= 1.0 or bool(self.kinks)

    @property
    def expected_deviation(self) -> bool:
        """True for a run with a lossy codec (gradient or pipeline-boundary compression): its differences are
        measured and reported, not judged."""
        return bool(self.compression)

    def acceptable(self) -> bool:
        """The verdict of a rehearsal: the numerics match, or they deviate by design (gradient compression)."""
        return self.matches() or self.expected_deviation

    def __str__(self) -> str:
        if self.expected_deviation:
            verdict = (f"compression {self.compression} on: measured deviation from one device (expected "
                       "by design, not judged)")
        else:
            verdict = ("numerics match" + (f" ({self.kinks})" if self.kinks and self.tolerance_ratio > 1 else "")
                       if self.matches() else "NUMERICS DIFFER")
        return (f"{verdict} on {self.world_size} ranks (max |diff|): outputs {self.output:.2e}, loss "
                f"{self.loss:.2e}, grads {self.grad:.2e} ({self.worst_grad}), params after steps "
                f"{self.params:.2e} ({self.worst_param}), "
                + ("" if self.buffers is None else f"buffers {self.buffers:.2e} ({self.worst_buffer or '-'}), ")
                + "loss after steps "
                f"{'n/a' if self.final_loss is None else f'{self.final_loss:.2e}'}; worst |diff| / "
                f"bound = {self.tolerance_ratio:.2f}; steps in rank 0's program (forward, per kind; show: column "
                f"\"in each rank's program\") {self.collectives}; reference: {self.reference}"
                + ("" if not self.blind else
                   f"; NOTHING CHECKED: the one-device gradients are all below the absolute tolerance (largest "
                   f"|grad| {self.grad_scale:.2e} < atol {self.grad_atol:.0e}), so a wrong program with gradients "
                   "as small would match too; rehearse with the model's own loss (e.g. labels=) or inputs that give "
                   "outputs of order 1")
                + ("" if self.matches() or not self.random else
                   f"; the forward {_random_kind(self.random)} ({self.random}): ranks holding a shard of the batch "
                   "draw "
                   "their own masks / values (the same distribution, other numbers than one device), so such a "
                   "model cannot match; to check the plan, rehearse it with dropout 0 (e.g. transformers' *dropout* "
                   "config fields) and with other random tensors (randn_like noise, sampled timesteps) drawn in "
                   "the loop and passed in as inputs"))


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


WARMUP_NOTE = "; the plan's PowerSGD ran within its warm-up ({} exact steps), so it is judged"


def unjudged_codec(spec: ShardingSpec, steps: int) -> tuple[str, str]:
    """(the gradient codec whose deviation a rehearsal of `steps` steps reports without judging it, "" when the
    codec leaves the sums exact over those steps; a note for the report's reference). A PowerSGD plan within
    its warm-up (`GradCompression.deviates_within`) is judged as an uncompressed one: its report said
    "expected by design, not judged" for exact all-reduces (a plan's default warm-up is 1000 steps)."""
    codec = spec.compression
    if codec.deviates_within(steps):
        return codec.spec, ""
    return "", WARMUP_NOTE.format(codec.warmup) if codec.lossy else ""


FLOAT64_JUDGE = (", and a float64 copy of it (each value may lie from float64's as far as 8x one device's own "
                 "rounding: sums that cancel)")
"""What `RehearsalReport.reference` adds when some rank judged by the float64 copy (`float64_excess`)."""
NO_FLOAT64_JUDGE = ("; not judged against float64: {}, so the plain bound alone judged (a sum of large terms that "
                    "cancel may exceed it by fp32 rounding alone)")
"""What `RehearsalReport.reference` adds when the float64 judge was wanted (some value outside the plain bound) but
could not be used (`unused_float64`)."""


def replay_note(results: list[dict]) -> str:
    """`runtime.replay64.replay_note` (imported on use: that module imports this one)."""
    from .replay64 import replay_note as note

    return note(results)


def no_float64_note(results: list[dict]) -> str:
    """`NO_FLOAT64_JUDGE` with the first rank's reason, when some rank wanted the float64 judge and could not use
    it; "" otherwise."""
    reason = next((r["float64_unused"] for r in results if r.get("float64_unused")), "")
    return NO_FLOAT64_JUDGE.format(reason) if reason else ""


ZERO1_NOTE = "; the plan was stepped by ZeroRedundancyOptimizer(AdamW) over {!r} (its zero1), the reference by AdamW"


def _report(world_size: int, results: list[dict], compression: str = "", recipe: str | None = None, note: str = ""
            ) -> RehearsalReport:
    def worst(key):
        return max(results, key=lambda r: r[key][0])[key]
    ratio = max(r[k][2] for r in results for k in ("output", "loss", "grad", "params", "buffers") if k in r)
    # a model narrowing inside float32 is judged by its float64 replay too (`_rank_cases`, `reach.narrows_inside`)
    ratio = max([ratio, *(r["float64_replay"][2] for r in results
                          if r.get("replay_judges") and isinstance(r.get("float64_replay"), tuple))])
    buffers = worst("buffers") if all("buffers" in r for r in results) else None
    final = max(r["final_loss"][0] for r in results) if all("final_loss" in r for r in results) else None
    return RehearsalReport(world_size, worst("output")[0], worst("loss")[0], worst("grad")[0], worst("params")[0],
                           worst("grad")[1], worst("params")[1], ratio, results[0]["collectives"],
                           results[0]["code"], compression, final, describe(recipe) + (
                               FLOAT64_JUDGE if any(r.get("float64_judge") for r in results) else "") + (
                               ZERO1_NOTE.format(results[0]["zero1"]) if results and results[0].get("zero1") else "")
                           + note + no_float64_note(results) + replay_note(results),
                           None if buffers is None else buffers[0], "" if buffers is None else buffers[1],
                           results[0].get("random", ""),
                           max((r["grad_scale"][0] for r in results), default=None) if all(
                               "grad_scale" in r for r in results) else None,
                           results[0]["grad_scale"][1] if results and "grad_scale" in results[0] else None,
                           kinks_note(results))


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


def _random_kind(random: str) -> str:
    """How a report words `random_ops`' text: host state frozen into the program (`frozen_host_state`) or draws."""
    return "reads host state it changes" if random.startswith(HOST_STATE_LEADS) else "draws random numbers"


def random_ops(traced) -> str:
    """The ops of the traced forward that draw random numbers (`tracer.graph.draws_random`: dropout p > 0,
    bernoulli, rand..., SDPA with dropout_p > 0), as 'node (op)' (the first 3), and the host generator draws the
    tracer noted (numpy / Python random: values frozen at trace time, e.g. LayerDrop or SpecAugment; traced with
    `allow_frozen_host_random`), each site named (function, file:line, module) with the remedy; '' if none."""
    found = [f"{node.name} ({getattr(node.target, '__name__', node.target)})"
             for node in traced.graph_module.graph.nodes if draws_random(node)]
    text = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    host = next((n for n in traced.notes if n.startswith(HOST_RNG_NOTE)), None)
    if host is not None:
        text += ("; " if text else "") + "numpy / Python random in forward, FROZEN at trace time" + \
            (f" ({host.split(HOST_RNG_SITES, 1)[1]})" if HOST_RNG_SITES in host else "") + \
            (": the program repeats that one draw at every step while the model draws anew per call, so it trains "
             "differently, not only with other masks; switch the draw off (e.g. transformers' mask_time_prob=0, "
             "layerdrop=0) or draw with torch")
    if frozen := frozen_host_state(traced.notes):  # generator objects, counters, the clock, reseeding (round 22)
        text += ("; " if text else "") + frozen
    return text


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
    ratio = max(result[k][2] for k in ("output", "loss", "grad", "params", "buffers", "final_loss") if k in result)
    verdict = torch.tensor([1.0 if ratio > 1 else 0.0])
    torch.distributed.all_reduce(verdict, op=torch.distributed.ReduceOp.MAX)
    return bool(verdict.item())


def _loss(output) -> torch.Tensor:
    """The model's scalar loss when its first output is one; else a weighted mean of squares of the first
    output, each index c of its last dim (of C) weighted 1 + c / C when it has >= 2 dims. The plain mean of
    squares of a LayerNorm output at its initial weights is ~1 whatever came before it, so the gradients of
    everything before the norm were below float32 rounding and a wrong one compared as a match (YolosModel:
    true gradients <= 1.8e-4, rounding 6.1e-4; trial 10f); the weights break that invariance and depend on the
    feature index only, so every batch and microbatch split gives the same loss."""
    first = next(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
    if first.ndim == 0:
        return first
    squares = first.float().pow(2)
    if first.ndim >= 2:
        size = first.shape[-1]
        squares = squares * (1 + torch.arange(size, dtype=squares.dtype, device=squares.device) / size)
    return squares.mean()


def _output_pairs(out, ref_outs: list) -> list[tuple]:
    """("output <key path>", the plan's tensor, each reference's) for every tensor leaf of the outputs, paired
    by key path (`tracer.leaves`: a ModelOutput may hold its fields in another order than the reference's);
    a structure with other paths pairs by position, and a different number of tensors is never a match."""
    paired = pair_by_path(out, *ref_outs)
    if paired is None:
        tensors = [tensor_leaves(o) for o in (out, *ref_outs)]
        if len({len(t) for t in tensors}) != 1:
            nan = torch.tensor(float("nan"))
            return [(f"output: {len(tensors[0])} tensors, the reference returned {len(tensors[1])}", nan,
                     torch.tensor(0.0), *([torch.tensor(0.0)] * (len(tensors) - 2)))]
        return [("output", *ts) for ts in zip(*tensors)]
    return [(f"output {path}", a, *bs) for path, a, *bs in paired if isinstance(a, torch.Tensor)]


def _max_diff(pairs, compute, judge=None) -> tuple[float, str, float]:
    """(largest |a - b|, name where it occurs, largest ratio to the bound) over (name, a, b) or
    (name, a, b, exact): the ratio is `tolerance.excess`'s at the dtype `compute(name)` (a callable: the dtype
    of the computation that reaches that tensor, `runtime.reach`; or one dtype for all), or with `exact` the smaller of it and
    `judge(a, b, exact)` (a match by either criterion): `recipe_excess` (the default) when `exact` is the
    reference's value without its mixed-precision recipe, `float64_excess` when it is a float64 copy's."""
    judge = judge or recipe_excess
    worst, ratio = (0.0, ""), 0.0
    for name, a, b, *exact in pairs:
        if not a.numel():
            continue
        odd = ~b.detach().isfinite()
        if not torch.equal(~a.detach().isfinite(), odd) or not torch.equal(a.detach()[odd].nan_to_num(nan=0.0),
                                                                            b.detach()[odd].nan_to_num(nan=0.0)):
            # NaN / inf on one side only, or an inf of the other sign: never a match (max() and `>` ignore NaN, and
            # inf / inf is NaN, so a difference at an inf the other side lacks read as 0: a silent "match", e.g.
            # one device's float16 loss overflowing to inf where the sharded program's local sums stay finite)
            worst, ratio = max(worst, (math.inf, name)), math.inf
            continue
        # equal NaN / inf on both sides are equal values (torch.testing's equal_nan): compared as zeros
        a, b = a.detach().masked_fill(odd, 0), b.detach().masked_fill(odd, 0)
        exact = [e.detach().masked_fill(odd, 0) for e in exact]
        diff = (as_real(a).double() - as_real(b).double()).abs().max().item()  # complex: both parts (`as_real`)
        worst = max(worst, (diff, name))
        dtype = compute(name) if callable(compute) else compute
        ratio = max(ratio, min([excess(a, b, dtype), *(judge(a, b, e) for e in exact)]))
    return worst[0], worst[1], ratio


SAME_COMPUTATION_RTOL = 1e-4  # `same_computation`: how far an fp32 reference's outputs may lie from float64's
LOW_PRECISION_SAME_FACTOR = 8  # `same_computation`: a 16-bit reference's, in units of its dtype's rtol
ORDER_FACTOR = 8  # `float64_excess`: rounding of another summation order, against the one-device model's
WIDE_JUDGED = (torch.float32, torch.bfloat16, torch.float16)  # compute dtypes `float64_excess` judges


def float64_excess(actual: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest |actual - exact| over atol + rtol |exact| + 8 max |expected - exact|, elementwise, where
    `exact` is the same tensor of a float64 copy of the single-device model and (rtol, atol) are
    `torch.testing.assert_close`'s for `expected`'s dtype (float32's for a float32 or non-floating one; a bf16
    model's tensors get bfloat16's). So an element may lie from the float64 value up to 8 times as far as the
    single-device model in its own dtype lies from it anywhere in the tensor: a gradient that is a sum of
    large terms cancelling to a small one (a bias feeding a BatchNorm: 9.4e-5 of fp32 rounding on one device,
    1.1e-4 sharded, MobileViT on tp=2; in a bf16 model 6.9 of rounding on one device against a true 0) is
    judged by the rounding its terms carry, which the plain bound (relative to the small result) is not. The
    factor 8: the sharded program sums in another order (per-rank partial sums then a reduction), and two
    orders of the same fp32 terms lie up to 5.7x as far from float64 as each other (measured: 400 random
    orders of 1024 cancelling terms of magnitude 100, whole and as two halves; median 2x). A wrong program (a
    missing or doubled term) is off by the size of the terms, orders of magnitude beyond their rounding, and
    stays outside. Used only when the two references are the same computation (`same_computation`)."""
    a, b, e = (as_real(t.detach()) for t in (actual, expected, exact))
    dtype = b.dtype if b.dtype.is_floating_point and b.dtype.itemsize <= 2 else torch.float32
    rtol, atol = tolerances(dtype)
    a, b, e = a.double(), b.double(), e.double()
    noise = (b - e).abs().max().item()
    diff = (a - e).abs()
    bound = atol + rtol * e.abs() + ORDER_FACTOR * noise
    return torch.where(diff == 0, torch.zeros_like(diff), diff / bound).max().item()


def wide_judged(compute: torch.dtype | None, traced) -> bool:
    """Whether a case computing in `compute` may be judged by a float64 copy (`float64_excess`): fp32, bf16 and
    fp16 programs; a 16-bit one only when its forward draws no random numbers (`random_ops`), since its outputs
    lie too far from float64's for `same_computation` to tell another dropout mask from rounding."""
    return compute in WIDE_JUDGED and (compute == torch.float32 or not random_ops(traced))


def same_computation(low: list[torch.Tensor], fp64: list[torch.Tensor], compute: torch.dtype | None) -> bool:
    """Whether a float64 copy computed what the model in its own dtypes did, computing in `compute`
    (`runtime.tolerance.compute_dtype`): the first forward's output tensors agree within 1e-4 of their largest
    magnitude + float32's atol when it computes in fp32, 8 rtol of the dtype in 16 bits (bf16: 12.8%, for a
    model that lies further from float64 on one device the float64 copy judges nothing). Not when the copy
    drew other random numbers (dropout masks, whose draws may depend on the dtype) or took another branch;
    then `float64_excess` is not used."""
    atol = tolerances(torch.float32)[1]
    low_precision = compute is not None and compute.itemsize <= 2
    rtol = LOW_PRECISION_SAME_FACTOR * tolerances(compute)[0] if low_precision else SAME_COMPUTATION_RTOL
    return len(low) == len(fp64) and all(
        a.shape == b.shape and (not carries_grad(a.dtype) or (as_real(a).double() - as_real(b).double()).abs().max()
                                .item() <= rtol * as_real(b).double().abs().max().item() + atol)
        for a, b in zip(low, fp64) if a.numel())


def tensor_leaves(tree) -> list[torch.Tensor]:
    """The tensors among the leaves of `tree` (a model's outputs, a call's inputs), in pytree order."""
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def widened(tree):
    """`tree` with float64 copies of its floating tensors (the inputs of a float64 copy of the model)."""
    return pytree.tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree)


def _float64_run(model: torch.nn.Module, inputs: tuple, kwargs: dict):
    """(output, (inputs, kwargs)) of `model` converted to float64 (`runtime.widen.as_float64`: parameters and
    floating buffers, and every tensor its forward makes or casts in a narrower floating dtype) on float64
    copies of the floating inputs; else the reason it cannot run in float64 (a str: the error's type and first
    line), and then the plain bound alone judges (`float64_excess`) and the report says why."""
    wide = widened((inputs, kwargs))
    as_float64(model)
    try:
        return model(*wide[0], **wide[1]), wide
    except (RuntimeError, TypeError, ValueError) as error:  # e.g. a custom op with a float32-only kernel
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"


def unused_float64(run64, outputs, compute: torch.dtype | None) -> str:
    """Why the float64 copy's run `run64` (`_float64_run`) cannot judge a model whose own outputs are `outputs`,
    computing in `compute`; "" when it can (`same_computation`). Said in the report of a case that differs, so
    that a reader knows only the plain bound judged it."""
    if isinstance(run64, str):
        return f"the float64 copy of the model did not run ({run64})"
    if not same_computation(tensor_leaves(outputs), tensor_leaves(run64[0]), compute):
        return ("the float64 copy of the model computed other outputs (another branch or other random draws; "
                "`same_computation`)")
    return ""


def recipe_excess(actual: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor) -> float:
    """max |actual - exact| / (2 max |expected - exact|): how far the sharded program under a mixed-precision
    recipe lies from the model run without it (`exact`, fp32), against how far the single-device model under
    the same recipe (`expected`) lies from it, on the same tensor. Both round the same computation at bf16 in
    different orders (per-rank partial sums, bf16 Partial reductions), so the sharded program may be as far
    from the fp32 values as the single-device recipe is, with a factor 2 of margin for its extra roundings (as
    `runtime.tolerance` allows two computations); a wrong program (a missing or doubled term) is off by the
    size of the values. Needed because bf16 rounding of a sum with cancellation (a weight gradient summed over
    tokens, split over data-parallel ranks) is large against the result, which a bound relative to the
    result's scale misses, and AdamW turns rounding noise in tiny gradients into steps of about lr on either
    side. <= 1 is a match; inf for a deviation where the recipe changes nothing (0 when neither deviates).
    `expected` is unused beyond its deviation; the direct comparison is `runtime.tolerance.excess`."""
    actual, expected, exact = (as_real(t.detach()).double() for t in (actual, expected, exact))
    diff = (actual - exact).abs().max().item()
    noise = (expected - exact).abs().max().item()
    return diff / (2 * noise) if noise else 0.0 if diff == 0 else float("inf")


def _grad_or_zeros(p: torch.Tensor) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


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
    reference = copy_module(model)
    # the reference without the recipe (its rounding), or a float64 copy of the model (`float64_excess`)
    exact = copy_module(model) if spec.autocast is not None or wide else None
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
