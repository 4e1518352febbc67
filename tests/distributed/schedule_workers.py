"""Rank bodies for test_schedules_run: the user loop (`auto_parallelize` + `pm.step` + AdamW) on pipeline plans
whose schedule is bitpipe, dualpipev or zbv, against the single-device model (importable by name in ranks)."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import io

import torch
import torch.distributed as dist

import parallelizer
from parallelizer import zoo
from parallelizer.runtime.pipeline_module import build_pipeline_module
from step_workers import padded_labels, user_loop

GPT2_8 = dict(n_layer=8, n_embd=32, n_head=4, vocab_size=128, batch=8, seq_len=16)  # 2 pp stages per rank


def base_plan_json(pp: int, microbatches: int) -> str:
    """An interleaved_1f1b plan (2 stages per pp rank, 1 block each) of the 8-block GPT-2 on one microbatch."""
    traced = parallelizer.trace(*zoo.gpt2(**{**GPT2_8, "batch": GPT2_8["batch"] // microbatches}))
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, {"pp": pp}, schedule="interleaved_1f1b", microbatches=microbatches).to_json()


def train_schedules(rank: int, world_size: int, plan_json: str, schedules: list[str], steps: int = 3) -> dict:
    """For each schedule: the base plan with that schedule (the first through `auto_parallelize`, the others
    built on its trace), trained `steps` AdamW steps by the user loop and by the single-device model; the largest differences of loss (every step), gradients (every step) and
    parameters after the last step, and what each rank held."""
    report, traced = {}, None
    base = parallelizer.Plan.from_json(plan_json)
    for name in schedules:
        plan = dataclasses.replace(base, pipeline=dataclasses.replace(base.pipeline, schedule=name))
        torch.manual_seed(0)
        model, (ids,) = zoo.gpt2(**GPT2_8)
        reference = copy.deepcopy(model)
        if traced is None:  # the user's call; later schedules reuse its trace (the same model, seeded alike)
            pm = parallelizer.auto_parallelize(model, (ids,), plan=plan)
            traced = pm.traced
        else:
            pm = build_pipeline_module(traced, plan, model, rank)
            pm.plan = plan
        worst = user_loop(pm, reference, ids, padded_labels(ids), steps)
        worst["blocks"] = sorted(b for s in pm.stages for b in _blocks(s))
        worst["first_last"] = (pm.first, pm.last)
        report[name] = worst
        dist.barrier()
    return report


def _blocks(stage) -> set[str]:
    return {fqn.split(".")[2] for fqn in stage.traced.parameters if fqn.startswith("transformer.h.")}


CHANGED = "transformer.h.1.mlp.c_fc.weight"  # frozen and unfrozen between steps (`changes_between_steps`)


def changes_between_steps(rank: int, world_size: int, plan_json: str, schedules: list[str]) -> dict:
    """Round 24 (issue 14): each stage reads its module tree once per step (`runtime.tree_reading`), so what a user
    changes BETWEEN two steps must reach the next step. For each schedule, the user loop against the single-device
    model, every step's loss and gradients compared, with between the steps: `CHANGED` and the tied wte frozen
    (`requires_grad_(False)`: their `.grad` stays None, the rest trains as one device's), unfrozen again, then
    `pm.eval()` (the next step refused; `pm.train()`), a forward hook on pm (refused; removed), a stage's submodule
    switched to eval (refused; back) and a setting of a stage's submodule changed (refused; set back), and a last
    step with everything undone. Also the number of walks of each stage's tree per step (top-level
    `named_modules()` calls on a stage; before round 24 about 13 per stage and step under bitpipe)."""
    from parallelizer.errors import PipelineError
    from step_workers import lm_loss
    from step_workers import _diff as step_diff

    base = parallelizer.Plan.from_json(plan_json)
    report, traced = {}, None
    counter, real = {"stages": (), "walks": 0}, torch.nn.Module.named_modules

    def counting(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        if prefix == "" and any(self is s for s in counter["stages"]):  # a walk from a stage, not the recursion
            counter["walks"] += 1
        return real(self, memo, prefix, remove_duplicate)
    for name in schedules:
        plan = dataclasses.replace(base, pipeline=dataclasses.replace(base.pipeline, schedule=name))
        torch.manual_seed(0)
        model, (ids,) = zoo.gpt2(**GPT2_8)
        reference = copy.deepcopy(model)
        labels = padded_labels(ids)
        if traced is None:
            pm = parallelizer.auto_parallelize(model, (ids,), plan=plan)
            traced = pm.traced
        else:
            pm = build_pipeline_module(traced, plan, model, rank)
            pm.plan = plan
        out = {"loss": 0.0, "grad": 0.0, "none": [], "refused": [], "walks": []}

        def step(freeze: bool | None = None) -> None:
            if freeze is not None:
                for m in (pm, reference):
                    for fqn, p in m.named_parameters():
                        if fqn in (CHANGED, "transformer.wte.weight"):
                            p.requires_grad_(not freeze)
            counter.update(stages=tuple(pm.stages), walks=0)
            torch.nn.Module.named_modules = counting
            try:
                loss = pm.step(ids, target=labels, loss_fn=lm_loss)
            finally:
                torch.nn.Module.named_modules = real
            out["walks"].append(counter["walks"] / len(pm.stages))
            ref_loss = lm_loss(reference(ids), labels)
            ref_loss.backward()
            out["loss"] = max(out["loss"], abs(loss.item() - ref_loss.item()))
            out["grad"] = max(out["grad"], step_diff(pm, reference, grads=True))
            out["none"].append(sorted({f for f, p in pm.named_parameters() if p.grad is None}))
            for m in (pm, reference):
                m.zero_grad(set_to_none=True)

        def refused(change, undo) -> None:
            change()
            try:
                pm.step(ids, target=labels, loss_fn=lm_loss)
                out["refused"].append("no error")
            except PipelineError as err:
                out["refused"].append(str(err))
            undo()

        out["held"] = sorted({f for f, _ in pm.named_parameters()} & {CHANGED, "transformer.wte.weight"})
        step()
        step(freeze=True)
        step(freeze=False)
        refused(pm.eval, pm.train)
        hook = []
        refused(lambda: hook.append(pm.register_forward_hook(lambda *a: None)), lambda: hook.pop().remove())
        block = pm.stages[0].transformer.h[1]
        refused(block.eval, block.train)
        norm = pm.stages[-1].transformer.ln_f
        eps = norm.eps
        refused(lambda: setattr(norm, "eps", 1e-3), lambda: setattr(norm, "eps", eps))
        step()  # every change undone: the step trains as one device's again
        report[name] = out
        dist.barrier()
    return report


def failed_bitpipe_step(rank: int, world_size: int, plan_json: str) -> dict:
    """Round 25 (r25i): BitPipe's runner posts every receive of the step at its start. On pp=2 both ranks hold a
    last stage (the down pipeline's on rank 0, the up one's on rank 1); a loss_fn that raises makes both raise it
    at their first last-stage forward, with receives of the step still posted (gloo cannot cancel them: they would
    take the next step's messages, same tags), so the next step is refused on both (DistributedError naming them).
    Per rank: (error type, message) of each of the two steps and the posted receives left."""
    base = parallelizer.Plan.from_json(plan_json)
    plan = dataclasses.replace(base, pipeline=dataclasses.replace(base.pipeline, schedule="bitpipe"))
    torch.manual_seed(0)
    model, (ids,) = zoo.gpt2(**GPT2_8)
    pm = parallelizer.auto_parallelize(model, (ids,), plan=plan)

    def boom(output, target):
        raise ValueError("boom: the user's loss_fn")
    errors = []
    for _ in range(2):
        try:
            pm.step(ids, target=padded_labels(ids), loss_fn=boom, item_count=lambda t: int((t != -100).sum()))
            errors.append(("none", ""))
        except Exception as err:  # what the user sees
            errors.append((type(err).__name__, str(err)))
    return {"errors": errors, "posted": sum(len(got) for got in pm.run.schedule._stale)}
