"""Rank bodies for test_step: one user training loop (`auto_parallelize` + `pm.step` + AdamW) on pipeline and
non-pipeline plans, against the single-device model (importable by name in spawned ranks)."""
from __future__ import annotations

import contextlib
import copy
import io

import torch
import torch.distributed as dist

import parallelizer
from parallelizer import zoo
from parallelizer.errors import PipelineError, PlanMismatchError
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import stage_diffs
from parallelizer.runtime.rehearsal import _max_diff
from parallelizer.runtime.step import StepError
from parallelizer.rewriter.state import shard_tensor
from parallelizer.runtime.part_writes import local_writes

GPT2_4 = dict(n_layer=4, n_embd=32, n_head=4, vocab_size=128, batch=8, seq_len=16)


def padded_labels(ids: torch.Tensor) -> torch.Tensor:
    """Next-token labels (B, T) with -100 (ignored) at the end of every row, over most of samples 0-2 and
    the tail of sample 5: the two halves of the batch (2 microbatches) count 3 x 2 + 15 = 21 and 4 x 15 - 9
    = 51 tokens, so a plain mean of the microbatch means is not the batch loss."""
    labels = torch.roll(ids, -1, dims=1)
    labels[:, -1] = -100
    labels[:3, 2:] = -100
    labels[5, 6:] = -100
    return labels


def lm_loss(output, target: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the labels that are not -100 (the user's loss_fn)."""
    logits = output.logits if hasattr(output, "logits") else output[0]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def train(rank: int, world_size: int, cases: dict, steps: int = 3, gpt2: dict = GPT2_4) -> dict:
    """For each case (name -> (mesh, plan options or {"plan_json": a saved plan})): the same user loop on `auto_parallelize`'s module and on
    the single-device model; returns per case the largest differences of loss, gradients (every step) and
    parameters (after `steps` AdamW steps), and under "errors" the typed errors of the first pipeline module.
    `gpt2`: the model's `zoo.gpt2` sizes."""
    report = {}
    for name, (mesh, options) in cases.items():
        if "plan_json" in options:  # a saved plan: applied without re-planning, its mesh the default
            options = {"plan": parallelizer.Plan.from_json(options["plan_json"])}
        torch.manual_seed(0)
        model, (ids,) = zoo.gpt2(**gpt2)
        reference = copy.deepcopy(model)
        labels = padded_labels(ids)
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, **options)
        worst = user_loop(pm, reference, ids, labels, steps)
        worst["kind"] = type(pm).__name__
        worst["collectives"] = sorted({kind for s in _stages(pm) for kind, n in s.program.collectives.items() if n})
        if pm.plan.pipeline is not None:
            halves = [lm_loss(reference(ids.tensor_split(2)[k]), labels.tensor_split(2)[k])
                      for k in range(2)]
            worst["mean_of_means_off_by"] = abs((halves[0] + halves[1]).item() / 2 - lm_loss(reference(ids), labels).item())
            if "errors" not in report:  # once (each check that traces costs seconds per rank)
                report["errors"] = _pipeline_errors(pm, model, ids, labels)
        report[name] = worst
        dist.barrier()
    return report


CLIP = (0.05, (2.0, float("inf"), 2.0))  # max_norm below every step's total norm; the norm type of step i


def user_loop(pm, reference, ids: torch.Tensor, labels: torch.Tensor, steps: int) -> dict:
    """`steps` AdamW steps of the user loop (`pm.step`, then by step i mod 3: `pm.clip_grad_norm_`, torch's
    `clip_grad_norm_(pm.parameters())`, torch's `get_total_norm` of the gradients + `clip_grads_with_norm_`;
    identical for every plan) and of
    the single-device `reference` (torch's clip_grad_norm_): the largest differences of loss, total norm and
    clipped gradients (every step) and of the parameters after; "ref_norm": the smallest reference total norm
    (above max_norm: the clipping scaled), "norm_spread": the largest difference of the total between ranks;
    then `pm.full_state_dict()` against the reference's state_dict ("state_keys" equal, "state" difference) and
    the parameters after `pm.load_full_state_dict(reference.state_dict())` ("loaded": 0 when exact)."""
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    worst = {"loss": 0.0, "grad": 0.0, "params": 0.0, "norm": 0.0, "ref_norm": float("inf"), "norm_spread": 0.0}
    max_norm, norm_types = CLIP
    for i in range(steps):
        loss = pm.step(ids, target=labels, loss_fn=lm_loss)
        ref_loss = lm_loss(reference(ids), labels)
        ref_loss.backward()
        if i % 3 == 1:  # as a user keeps it: torch's function over pm.parameters() (routed to the global norm)
            total = torch.nn.utils.clip_grad_norm_(pm.parameters(), max_norm, norm_types[i % len(norm_types)])
        elif i % 3 == 2:  # torch >= 2.6's two halves (the norm used to be this rank's local pieces' norm)
            total = torch.nn.utils.get_total_norm([p.grad for p in pm.parameters() if p.grad is not None],
                                                  norm_types[i % len(norm_types)])
            torch.nn.utils.clip_grads_with_norm_(pm.parameters(), max_norm, total)
        else:
            total = pm.clip_grad_norm_(max_norm, norm_types[i % len(norm_types)])
        ref_total = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm, norm_types[i % len(norm_types)])
        totals = [torch.zeros(()) for _ in range(dist.get_world_size())]
        dist.all_gather(totals, total.detach().float())
        worst["norm_spread"] = max(worst["norm_spread"], max(totals).item() - min(totals).item())
        worst["norm"] = max(worst["norm"], abs(total.item() - ref_total.item()) / ref_total.item())
        worst["ref_norm"] = min(worst["ref_norm"], ref_total.item())
        worst["loss"] = max(worst["loss"], abs(loss.item() - ref_loss.item()))
        worst["grad"] = max(worst["grad"], _diff(pm, reference, grads=True))
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    worst["params"] = _diff(pm, reference, grads=False)
    full, ref_sd = pm.full_state_dict(), reference.state_dict()
    worst["state_keys"] = sorted(full) == sorted(ref_sd)
    worst["state"] = max((full[k] - ref_sd[k]).abs().max().item() for k in ref_sd)
    pm.load_full_state_dict(ref_sd)  # pure data movement: every shard and copy now equals one device's, bitwise
    worst["loaded"] = _diff(pm, reference, grads=False)
    return worst


def _stages(pm) -> list:
    return list(pm.stages) if hasattr(pm, "stages") else [pm]


def _diff(pm, reference, grads: bool) -> float:
    spec = spec_from_plan(pm.plan)
    if pm.plan.pipeline is not None:
        return stage_diffs(pm.run, reference, spec, None, grads=grads)[0]
    ref = dict(reference.named_parameters())
    pick = (lambda p: p.grad if p.grad is not None else torch.zeros_like(p)) if grads else (lambda p: p)
    return _max_diff(((f, pick(p).detach(), shard_tensor(pick(ref[f]).detach(), spec.params[f], spec.mesh, pm.coords))
                      for f, p in pm.named_parameters()), None)[0]


def _pipeline_errors(pm, model, ids, labels) -> dict:
    """The typed errors a user meets on a pipeline module (each raised alike on every rank, no hang)."""
    out = {}
    for key, call, kind in [
        ("uneven_batch", lambda: pm.step(ids[:-2], target=labels[:-2], loss_fn=lm_loss), PipelineError),
        ("no_loss", lambda: pm.step(ids, target=labels), StepError),
        ("forward", lambda: pm(ids), PipelineError),
        ("eval", lambda: _step_in_eval_mode(pm, ids, labels), PipelineError),
        ("example_batch", lambda: parallelizer.auto_parallelize(model, (ids[:7],), mesh=pm.plan.pipeline.mesh),
         PipelineError),
        ("other_mesh", lambda: parallelizer.auto_parallelize(model, (ids,), mesh={"pp": 4}, plan=pm.plan),
         PlanMismatchError),
    ]:
        try:
            call()
            out[key] = "no error"
        except kind as err:
            out[key] = str(err)
    return out


def _step_in_eval_mode(pm, ids, labels):
    """`pm.step` after `pm.eval()` (the mode is set back after): a pipeline trains in its traced mode only."""
    pm.eval()
    try:
        return pm.step(ids, target=labels, loss_fn=lm_loss)
    finally:
        pm.train()


def scaler_train(rank: int, world_size: int, mesh: dict, steps: int = 3) -> dict:
    """torch.amp.GradScaler on a pipeline plan, as a user writes it: `loss_fn` returns `scaler.scale(loss)` (it runs
    on the last stage's ranks only) and every rank calls `scaler.unscale_` / `step` / `update`; the scaler is NOT
    initialised by hand. Steps 0-1 pass `item_count=` (loss_fn not traced), step 2 lets the step read the count
    from loss_fn's graph. At step 1 rank 0's first gradient gets an inf (and the reference's same parameter), so
    every rank must skip that step and halve its scale. Returns the scale after each step, the reference's, and
    the largest parameter difference after the steps."""
    torch.manual_seed(0)
    model, (ids,) = zoo.gpt2(**GPT2_4)
    reference, labels = copy.deepcopy(model), padded_labels(ids)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, schedule="1f1b")
    opt, ref_opt = torch.optim.SGD(pm.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    scaler, ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 7), torch.amp.GradScaler("cpu", init_scale=2.0 ** 7)
    scales, ref_scales = [], []
    for i in range(steps):
        counted = {"item_count": lambda y: (y != -100).sum()} if i < 2 else {}
        pm.step(ids, target=labels, loss_fn=lambda out, y: scaler.scale(lm_loss(out, y)), **counted)
        ref_scaler.scale(lm_loss(reference(ids), labels)).backward()
        if i == 1:
            if rank == 0:
                with local_writes():  # one rank's piece, on purpose (`runtime.part_writes` refuses it otherwise)
                    next(iter(pm.parameters())).grad.view(-1)[0] = float("inf")
            next(iter(reference.parameters())).grad.view(-1)[0] = float("inf")
        scaler.unscale_(opt)
        ref_scaler.unscale_(ref_opt)
        scaler.step(opt)
        ref_scaler.step(ref_opt)
        scaler.update()
        ref_scaler.update()
        opt.zero_grad()
        ref_opt.zero_grad()
        scales.append(scaler.get_scale())
        ref_scales.append(ref_scaler.get_scale())
    return {"scales": scales, "ref_scales": ref_scales, "params": _diff(pm, reference, grads=False)}


def returned_outputs_train(rank: int, world_size: int, mesh: dict, steps: int = 2) -> dict:
    """GPT-2 traced with labels= (it returns (loss, logits)) on a pipeline plan, trained with `pm.step`: steps with
    loss_fn=None (the model's own loss), then one with a loss_fn reading the logits. Returns per step the bytes
    each last-stage forward returned (a forward hook), the bytes torch's schedule still held of the last stage's
    outputs after the step (`output_chunks`), the loss difference from the single-device model, the parameter
    difference after the AdamW steps, and the warnings of the loss_fn step."""
    torch.manual_seed(0)
    model, (ids,), kw = zoo.gpt2(**GPT2_4, labels=True)
    labels = padded_labels(ids)
    reference = copy.deepcopy(model)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        pm = parallelizer.auto_parallelize(model, (ids,), example_kwargs={"labels": labels}, mesh=mesh,
                                           axis_roles={"dp": "ddp"}, microbatches=2, schedule="1f1b")
    returned: list[int] = []
    S = len(pm.plan.pipeline.stages)
    for stage in (s for s in pm.run.stages if s.traced.notes[0] == f"pipeline stage {S - 1} of {S}"):
        stage.register_forward_hook(lambda m, a, out: returned.append(sum(t.numel() * t.element_size() for t in out)))
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    report = {"returned": [], "held": [], "loss": 0.0, "last": pm.last, "warnings": []}
    for i in range(steps + 1):
        returned.clear()
        if i < steps:
            loss = pm.step(ids, labels=labels)
        else:  # a loss_fn reading the logits: the last stage returns them all, and says the plan did not count them
            import warnings
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loss = pm.step(ids, labels=labels, target=labels,
                               loss_fn=lambda out, y: torch.nn.functional.cross_entropy(
                                   out.logits[:, :-1].flatten(0, 1), y[:, 1:].flatten()))
            report["warnings"] = [str(w.message) for w in caught if "did not count" in str(w.message)]
        ref_loss = reference(ids, labels=labels).loss
        ref_loss.backward()
        report["returned"].append(sorted(set(returned)) if pm.last else [])
        report["held"].append(sum(t.numel() * t.element_size() for s in pm.run.pipe for o in s.output_chunks
                                  for t in (o if isinstance(o, tuple) else (o,)) if isinstance(t, torch.Tensor)))
        report["loss"] = max(report["loss"], abs(loss.item() - ref_loss.item()))
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    report["params"] = _diff(pm, reference, grads=False)
    summed = lambda out, y: torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten(), reduction="sum")
    try:  # a reduction='sum' loss_fn with item_count=: refused on every rank before any work
        pm.step(ids, labels=labels, target=labels, loss_fn=summed, item_count=lambda y: (y != -100).sum())
        report["sum_item_count"] = "no error"
    except StepError as err:
        report["sum_item_count"] = str(err)
    return report


FROZEN_AT_WRAP = ("transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight", "transformer.h.3.mlp.c_proj.weight")
"""Frozen when the model is wrapped, unfrozen after (`unfreeze_train`): the tied embedding / lm_head (two stages)
and an MLP weight of each stage's blocks."""


def _set_trainable(module, fqns, flag: bool) -> None:
    """requires_grad_(flag) on the parameters named by `fqns` (the model's FQNs; a PipelineModule's names carry
    a `stages.<i>.` prefix)."""
    for name, p in module.named_parameters():
        if name.split(".", 2)[-1] in fqns or name in fqns:
            p.requires_grad_(flag)


def _groups_by_name(module) -> list[dict]:
    """AdamW param groups chosen by the model's names, as torchtitan / nanoGPT loops do: no weight decay on the
    first block and the final norm (`startswith`), 0.5 on the rest."""
    params = list(module.named_parameters())
    keep = [p for n, p in params if n.startswith(("transformer.h.0.", "transformer.ln_f."))]
    return [{"params": keep, "weight_decay": 0.0},
            {"params": [p for n, p in params if not n.startswith(("transformer.h.0.", "transformer.ln_f."))],
             "weight_decay": 0.5}]


def unfreeze_train(rank: int, world_size: int, mesh: dict, roles: dict, steps: int = 3) -> dict:
    """Gradual unfreezing on a pipeline (round 19, trial g): `FROZEN_AT_WRAP` frozen when `auto_parallelize`
    runs, unfrozen before the first step; after step 1 the tied embedding is frozen again. The user loop
    (`pm.step` + AdamW with param groups chosen by name, `_groups_by_name`) against the single-device model:
    the sizes of this rank's groups, its parameter names that the model lacks, the largest differences of loss,
    gradients (every step) and parameters after `steps` steps, and the frozen-again embedding's largest change
    over its last steps (0: AdamW skips a parameter without a gradient, as on one device)."""
    torch.manual_seed(0)
    model, (ids,) = zoo.gpt2(**GPT2_4)
    reference = copy.deepcopy(model)
    labels = padded_labels(ids)
    for m in (model, reference):
        _set_trainable(m, FROZEN_AT_WRAP, False)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        pm = parallelizer.auto_parallelize(model, (ids,), mesh=mesh, axis_roles=roles, microbatches=2)
    for m in (pm, reference):
        _set_trainable(m, FROZEN_AT_WRAP, True)
    opt, ref_opt = (torch.optim.AdamW(_groups_by_name(m), lr=1e-3) for m in (pm, reference))
    worst = {"loss": 0.0, "grad": 0.0, "groups": [len(g["params"]) for g in opt.param_groups],
             "names_outside_model": sorted(set(n for n, _ in pm.named_parameters()) - set(dict(reference.named_parameters())))}
    for i in range(steps):
        if i == 2:
            for m in (pm, reference):
                _set_trainable(m, FROZEN_AT_WRAP[:1], False)
            wte = {n: p.detach().clone() for n, p in pm.named_parameters() if n.endswith(FROZEN_AT_WRAP[0])}
        loss = pm.step(ids, target=labels, loss_fn=lm_loss)
        ref_loss = lm_loss(reference(ids), labels)
        ref_loss.backward()
        worst["loss"] = max(worst["loss"], abs(loss.item() - ref_loss.item()))
        worst["grad"] = max(worst["grad"], _diff(pm, reference, grads=True))
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    worst["params"] = _diff(pm, reference, grads=False)
    worst["refrozen_moved"] = max(((p - wte[n]).abs().max().item() for n, p in pm.named_parameters() if n in wte),
                                  default=0.0)
    worst["held_embedding"] = bool(wte)
    return worst
