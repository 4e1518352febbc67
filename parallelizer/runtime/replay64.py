"""The plan replayed in float64: tells a rehearsal's float32 difference that is rounding from a wrong program.

A case that stays outside both the plain float32 bound and the float64 copy's (`rehearsal.float64_excess`, 8x one
device's own rounding) is either a wrong program or rounding that another summation order amplifies beyond 8x
(DepthPro on tp=2, round 9: 13x; MobileViTV2 on a random-cost tp=2 plan, round 16: 3.5x after two AdamW steps).
So the rehearsal runs the SAME plan once more on the float64 copy of the model (`runtime.widen`: parameters,
inputs and every dtype its forward names widened; traced and sharded anew by the plan's layouts, which name
nodes by the model's structure only), one forward and backward, and compares its outputs and gradients with the
float64 model's at float64's own tolerance (torch.testing's rtol 1e-7, atol 1e-7): a right program lands
~1e-13 from it whatever its summation order (DAB-DETR's 5 plans: 1.6e-14 to 6.4e-14, where float32 lies 3.1e-5
off), a missing, doubled or wrong-signed term stays as far off as in float32. The float32 verdict itself is not
changed: a fault that exists only in narrow dtypes (a pending sum cast to a narrower dtype before its reduction)
cannot show in float64, so the report states the replay beside the verdict (`RehearsalReport.reference`).
"""
from __future__ import annotations

import copy

import torch

from ..errors import ParallelizerError
from ..rewriter.spec import ShardingSpec
from ..rewriter.state import shard_tensor
from ..tracer.trace import trace
from .module import ParallelModule
from .module_copy import copy_module
from .widen import as_float64, widening

REPLAY_MATCH = ("; the same plan replayed in float64 (model, inputs and the dtypes its forward names widened; one "
                "forward and backward) equals the float64 model within float64's bound (worst |diff| {:.2e}, {}, "
                "{:.2g} of it): the float32 difference is rounding of another summation order, not a wrong term "
                "(beyond the bound when a value within rounding of a kink, ReLU's 0 or a max / max-pool tie, lands on "
                "the other side than one device's: that element's whole gradient is kept or dropped; round 21)")
REPLAY_DIFFER = ("; the same plan replayed in float64 differs from the float64 model too (worst |diff| {:.2e}, {}, "
                 "{:.3g}x float64's bound): a wrong program, not rounding")
REPLAY_NOT_RUN = "; the plan could not be replayed in float64 ({})"
REPLAY_JUDGED = ("; the float32 model casts values to 16 bits inside its forward, so the same plan was also replayed "
                 "in float64 (casts widened; one forward and backward) and judged against the float64 model: worst |diff| "
                 "{:.2e}, {}, {:.3g} of float64's bound (`runtime.reach.narrows_inside`)")


def replay_note(results: list[dict]) -> str:
    """What the report says of the float64 replay (`replay`), from every rank's result: the worst rank's
    comparison, or why it did not run; "" when no rank replayed."""
    replays = [r["float64_replay"] for r in results if r.get("float64_replay") is not None]
    if not replays:
        return ""
    failed = next((r for r in replays if isinstance(r, str)), None)
    if failed is not None:
        return REPLAY_NOT_RUN.format(failed)
    diff, name, ratio = max(replays, key=lambda r: r[2])
    if any(r.get("replay_judges") for r in results):  # a matching float32 model narrowing inside (`rehearsal`)
        return REPLAY_JUDGED.format(diff, name, ratio)
    return (REPLAY_MATCH if ratio <= 1 else REPLAY_DIFFER).format(diff, name, ratio)


REPLAY_ERRORS = (ParallelizerError, RuntimeError, TypeError, ValueError, KeyError)
"""What a replay that cannot run raises (a program or model that does not run in float64): reported, not raised."""
EAGER_ONLY_NOTE = (
    "The eager float64 reference runs the model's own Python, which may pick another kernel than the traced program: "
    "transformers' MoE experts call `torch.nn.functional.grouped_mm` eagerly on CPU (float32 / 16-bit only: "
    "\"Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double\") but `grouped_mm_fallback` under "
    "export (DeepSeek-V4, round 21), so the replay of the program runs and the reference raises: reported, not "
    "raised, like a program that does not run in float64.")
"""Why the eager reference of a replay is guarded as the traced program is (`replay`, `replay_pipeline`)."""


def failure(error: Exception) -> str:
    """Why a replay could not run, as the report states it (`REPLAY_NOT_RUN`): the error's type and first line."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def replay(rank: int, model_fn, model_kwargs: dict, spec: ShardingSpec) -> tuple[float, str, float] | str:
    """This rank's (worst |diff|, its name, worst ratio to float64's bound) over the outputs and this rank's
    gradient shards of `spec` run on the float64 copy of `model_fn(**model_kwargs)` against that copy run whole;
    or why it could not run (a str). Collective: every rank of `spec`'s mesh calls it (the module docstring)."""
    from .rehearsal import _grad_or_zeros, _loss, _max_diff, _output_pairs, widened

    torch.manual_seed(0)
    model, inputs, *rest = model_fn(**model_kwargs)
    model = as_float64(model)
    exact = copy_module(model)
    inputs, kwargs = widened((inputs, rest[0] if rest else {}))
    try:
        with widening():  # the graph's own factories and casts traced in float64
            traced = trace(model, inputs, kwargs, allow_frozen_host_random=True)  # as the rehearsal traced it
            pm = ParallelModule(traced, spec, rank, model)
            out = pm(*inputs, **kwargs)
    except REPLAY_ERRORS as error:  # the DIFFER report stands
        return failure(error)
    try:  # the eager float64 copy may lack a kernel that the traced program does not call (`EAGER_ONLY_NOTE`)
        ref = exact(*copy.deepcopy(inputs), **copy.deepcopy(kwargs))
        with widening():  # `_loss` squares `.float()` of an output that is not a 0-d loss: in float64 here
            losses = [_loss(out), _loss(ref)]
        losses[1].backward()
    except REPLAY_ERRORS as error:  # every rank runs the same eager model on the same inputs: all return here
        return failure(error)
    losses[0].backward()
    output = _max_diff(_output_pairs(out, [ref]), torch.float64)
    grads = _max_diff(((fqn, _grad_or_zeros(p), shard_tensor(_grad_or_zeros(exact.get_parameter(fqn)),
                                                               spec.params[fqn], spec.mesh, pm.coords))
                       for fqn, p in pm.named_parameters()), torch.float64)
    return max(output, grads, key=lambda r: r[2])


def replay_kinks(replayed, find) -> list[tuple] | None:
    """This rank's kink crossings, `find()` (`runtime.kinks.locate` / `locate_pipeline`), when the float64
    replay `replayed` (`replay`'s or `replay_pipeline`'s result) ran and equals the float64 model on EVERY rank
    (an all-reduce of the verdicts, so that every rank runs the same collectives): only then may a float32
    difference be laid to rounding at a kink; else None. Collective."""
    ok = torch.tensor([1.0 if isinstance(replayed, tuple) and replayed[2] <= 1 else 0.0])
    torch.distributed.all_reduce(ok, op=torch.distributed.ReduceOp.MIN)
    return find() if ok.item() else None
