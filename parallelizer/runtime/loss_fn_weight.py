"""How much each microbatch's loss weighs when the user gives `loss_fn=` (`step` on a pipeline plan), read from
loss_fn's own ATen graph (`make_fx` on fake tensors: nothing is computed or allocated).

`loss_fn_weighting` weighs `loss_fn(output, target_j)` by the count its graph shows (the rules of
`runtime.loss_weight.graph_weighting`, with the count computed from the target alone); `own_loss_use` says how
`loss_fn(output, None)` uses the model's own loss (a constant multiple of it weighs as that loss). Split from
`runtime.loss_weight` in round 24 (r24f), which keeps the rules and the model's own loss.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils import _pytree as pytree

from ..tracer.leaves import unflatten_in_order
from .loss_weight import (OwnLossWeighting, _unscaled, check_batch_scaling, graph_weighting, needs_batch_check,
                          unconfirmed)


def loss_fn_weighting(loss_fn, outputs: list, out_spec, target: torch.Tensor) -> OwnLossWeighting | None:
    """The weighting of a user's `loss_fn(output, target_j)`, read from its ATen graph (`make_fx` on fake
    tensors on the target's device: nothing is computed or allocated): `outputs` are the model's output
    leaves of one microbatch (tensors or metas with .shape / .dtype), `out_spec` their pytree structure,
    `target` one microbatch's target. The count may only depend on the target. None when make_fx cannot trace
    `loss_fn` (data-dependent Python); StepError (as `graph_weighting`) when the graph shows no per-microbatch
    count, or when a scale or reduction changes with the microbatch size otherwise than a division by it
    (`_batch_scaled_terms`)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    # fake tensors (no storage) on the target's device, not "meta": a tensor the loss_fn holds (class weights,
    # a mask) lives on that device, and a meta tensor meeting it made make_fx fail, so the count silently fell
    # back to labels != -100 (a class-weighted cross-entropy on pp=2 x tp=2: loss 1e-2 off one device)
    leaves, fake_target = _fakes([*outputs, target], target.device)
    call = _loss_fn_call(loss_fn, out_spec, with_target=True)

    try:
        gm = make_fx(call, tracing_mode="fake")(*leaves, fake_target)
    except Exception:  # noqa: BLE001 - any failure to trace user code: the caller keeps `count_items`
        return None
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    per_item = _batch_scaled_terms(call, gm, [*outputs, target], target.device)
    return graph_weighting(gm.graph, (names[-1],), "loss_fn", per_item=per_item)


def own_loss_use(loss_fn, outputs: list, out_spec) -> str:
    """How `loss_fn(output, None)` (a pipeline step without target) uses the model's own loss, its first output
    leaf (a 0-d tensor, `returns_scalar_loss`), read from loss_fn's ATen graph (`make_fx` on fake tensors of
    `outputs`' shapes; nothing is computed):

    - "unread": loss_fn does not read it (a mean over other, fixed-shape outputs: equal weights hold);
    - "scaled": the result IS it, through casts, views and constant factors (`out / accum`, `out.loss`,
      `scaler.scale(out)`): it weighs as the model's own loss does (`own_loss_weighting`);
    - "mixed": loss_fn reads it and makes something else of it (`out.loss + 0.1 * out.aux.mean()`, `out ** 2`);
    - "untraced": make_fx could not trace loss_fn (data-dependent Python).

    Round 18 (new-user trial): on pp=2 x dp=2, a model returning its own cross-entropy over labels with -100
    padding, stepped with `loss_fn=lambda out, _: out / accum`, was weighed by equal microbatch weights (1 / m)
    instead of its token counts: loss 2.7e-3 off one device, parameters 8.4e-3 after 3 steps, silently."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        leaves = [torch.empty(tuple(m.shape), dtype=m.dtype) for m in outputs]
    try:
        gm = make_fx(_loss_fn_call(loss_fn, out_spec, with_target=False), tracing_mode="fake")(*leaves)
    except Exception:  # noqa: BLE001 - any failure to trace user code: the caller decides
        return "untraced"
    own = next(n for n in gm.graph.nodes if n.op == "placeholder")
    if not own.users:
        return "unread"
    result = pytree.tree_leaves(gm.graph.output_node().args[0])
    return "scaled" if len(result) == 1 and _unscaled(result[0]) is own else "mixed"


def _loss_fn_call(loss_fn, out_spec, with_target: bool):
    """`call(*flat)` for make_fx: `loss_fn(outputs restored to the model's structure, target)` from the flat output
    leaves followed by the target (`with_target`), or the leaves alone and target None."""
    def call(*flat):
        outs, target = (flat[:-1], flat[-1]) if with_target else (flat, None)
        structured = unflatten_in_order(list(outs), out_spec) if out_spec is not None else outs
        with _real_scaler_start():
            return loss_fn(structured, target)
    return call


@contextlib.contextmanager
def _real_scaler_start():
    """While loss_fn is traced: a `torch.amp.GradScaler` whose first `scale(loss)` runs inside loss_fn creates its
    scale as a real tensor (torch's lazy initialisation, outside fake mode and make_fx), as its first real call
    would, and the trace holds it as a constant. Before, the trace left a FakeTensor as the user's scaler's scale
    (a pipeline's later real `scale` failed on it) and recorded the scale as an op, not a constant factor."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    lazy = torch.amp.GradScaler._lazy_init_scale_growth_tracker

    def real(self, dev):
        with unset_fake_temporarily(), disable_proxy_modes_tracing():
            lazy(self, torch.device(dev.type, dev.index) if dev.type != "meta" else torch.device("cpu"))
    torch.amp.GradScaler._lazy_init_scale_growth_tracker = real
    try:
        yield
    finally:
        torch.amp.GradScaler._lazy_init_scale_growth_tracker = lazy


def _fakes(metas: list, device, factor: int = 1) -> tuple[list, torch.Tensor]:
    """(storage-free fake tensors of `metas`' shapes and dtypes on `device`, dim 0 times `factor` for those with
    dims, but the last; the last)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty((factor * m.shape[0], *m.shape[1:]) if len(m.shape) else (), dtype=m.dtype,
                             device=device) for m in metas]
    return fakes[:-1], fakes[-1]


def _batch_scaled_terms(call, gm: torch.fx.GraphModule, metas: list, device) -> frozenset[int]:
    """`check_batch_scaling` of a loss_fn: its terms divided by the microbatch size (`loss.sum() / y.numel()`,
    `/ y.shape[0]`, `/ len(y)`: weighted as a sum they gave about m times one device's loss, pp=2 x tp=2 with 4
    microbatches: loss 4x, gradients 1.5 off; now per-item means, weighed equally), found by tracing loss_fn again
    on twice the batch (dim 0 of every output and of the target, `metas`; 0-d outputs kept). Raises StepError when
    another scale changes with the batch, or when the loss has a form that needs this second trace
    (`needs_batch_check`) and loss_fn does not trace on twice the batch (e.g. it reshapes to the traced batch)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    if not len(metas[-1].shape) or not needs_batch_check(gm.graph):
        return frozenset()
    doubled, fake_target = _fakes(metas, device, factor=2)
    try:
        gm2 = make_fx(call, tracing_mode="fake")(*doubled, fake_target)
    except Exception as exc:  # noqa: BLE001 - e.g. a loss_fn that reshapes to the traced batch
        unconfirmed(gm.graph, f"{type(exc).__name__}: {exc}", "loss_fn")
    return check_batch_scaling(gm.graph, gm2.graph, "loss_fn")
