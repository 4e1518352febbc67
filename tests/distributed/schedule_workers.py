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
